"""Tiered storage (Kafka's KIP-405): remote log segments in an object store, and their metadata.

``storage`` is the store (Kafka's ``RemoteStorageManager``: a directory or an
S3 bucket), ``metadata`` the life of each copied segment, recorded as events
in a log (Kafka's ``RemoteLogMetadataManager`` over ``__remote_log_metadata``).
"""
