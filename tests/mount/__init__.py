"""Tests that drive a real FUSE mount (marker ``mount``)."""
