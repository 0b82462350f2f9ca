"""Tests of the cluster mount over a real 3-node Kafka cluster (marker ``cluster``)."""
