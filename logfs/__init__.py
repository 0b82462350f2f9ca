"""logfs: the filesystem face of the engine."""
