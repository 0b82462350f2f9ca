"""Tests that run a real local Spark (marker ``spark``)."""
