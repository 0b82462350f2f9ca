"""Tests against a real single-node Kafka broker or Kafka's tools (marker ``kafka``)."""
