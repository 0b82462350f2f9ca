"""A mount of a Kafka cluster (issue 20, SPEC.md section 10): the namespace served from a local replica.

The cluster is the engine of record; logfs adds no replication protocol of its
own.  The mount keeps a local data dir managed by the embedded ``LogManager``
and, for every partition in use (``--topics``, ``--from``, made on first use), a
:class:`~logfs.cluster.replica_fetcher.ReplicaFetcher`
(named after Kafka's ``ReplicaFetcherThread``) copies the leader's record
batches byte for byte at the leader's offsets, up to the high watermark, with
``Log.append_as_follower``.  Every view is then served by the engine as on an
embedded mount.  Changes go to the cluster: ``admin`` (CreateTopics,
CreatePartitions, DeleteTopics, Describe/IncrementalAlterConfigs,
DeleteRecords), ``producer`` (idempotent, ``acks=all``), ``groups`` (the
group coordinator's committed offsets).  :class:`~logfs.cluster.backend.ClusterBackend`
puts them behind the namespace's backend seam (logfs.backend).
"""
