"""logfs storage engine: Kafka's log layer (no FUSE, no trio)."""
