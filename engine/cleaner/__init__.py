"""Log compaction: keep only the latest record of each key (Kafka's ``LogCleaner`` and ``Cleaner``).

A compacted log is split at its *first dirty offset* into a clean tail, cleaned
before, and a dirty head.  One round of cleaning:

1. builds an :class:`~engine.cleaner.offset_map.OffsetMap` of key -> latest offset over
   the dirty section, from the first dirty offset up to the first uncleanable
   offset, or only as far as the map has room for (the rest stays dirty);
2. groups every segment below the end of the mapped range, clean and dirty,
   into runs whose sizes fit one segment (``groupSegmentsBySize``);
3. copies each group into ONE new segment named after the group's first
   segment with the suffix ``.cleaned``, keeping a record only if no later
   record of its key exists in the map; a tombstone (null value) is kept until
   its batch's *delete horizon* has passed and dropped after; keyless records
   are dropped;
4. swaps the new segment in with ``Log.replace_segments`` (``.cleaned`` ->
   ``.swap`` -> final name, old segments -> ``.deleted``), so that a crash at
   any point leaves either the old segments or the new one, never a mix;
5. checkpoints the end of the mapped range as the new first dirty offset.

Records keep their offsets, order, timestamps and headers; a batch that loses
no record and needs no delete horizon is copied byte for byte, otherwise its
survivors are re-written as the same batch (base and last offset, producer id,
epoch and sequence, codec, timestamp type, transactional and control flags:
:func:`~engine.records.rebuild_batch`).  Each new segment keeps the
modification time of the last segment it replaces, as Kafka's does.

The delete horizon is KIP-534's (Kafka 3.1+, KAFKA-8522): the first clean that
retains a tombstone, or a transaction marker whose transaction has no record
left, re-writes its batch with the *delete horizon* -- the time of that clean
plus ``delete.retention.ms`` -- in the batch's base timestamp and attribute
bit 6.  A later clean drops the tombstone (the marker: the whole control batch)
once its time is at or past that horizon.  A consumer that reads the log
within ``delete.retention.ms`` of the first clean therefore still sees the
deletion, and a tombstone on a topic that keeps being written expires after
``delete.retention.ms`` instead of riding along in every re-cleaned segment
(the legacy rule, ``delete.retention.ms`` before the last modified time of the
clean section, kept refreshing with each clean).  Kafka keeps the legacy
horizon only for batches older than magic 2, which logfs neither writes nor
reads, so here it only appears in the log lines, as in Kafka's.

Transactions (in a Kafka broker's data; logfs writes none): as Kafka's
cleaner, the batches of aborted transactions neither enter the offset map (an
aborted record never supersedes a committed one) nor survive a clean.  Kafka
finds them in its ``.txnindex`` files; here :mod:`engine.transactions` derives
the same list from the markers, walking the log incrementally across cleans.
A marker is eligible for its delete horizon only when no data batch of its
producer was read since that producer's previous marker in the clean (Kafka's
``CleanedTransactionMetadata``): a commit marker stays while its transaction
has records, an abort marker until the clean after the one that removed its
aborted records.  Removing a marker earlier would change what a
``read_committed`` reader sees.  A transaction with no marker at all (a broker
stopped mid-transaction) is cleaned like plain records.

The engine starts no threads: :meth:`LogCleaner.clean_once` does one unit of
work (clean the filthiest log, then retention of compacted logs) and returns,
and the mount calls it from ``log.cleaner.threads`` trio tasks through
``trio.to_thread.run_sync``, backing off ``log.cleaner.backoff.ms`` when it
returns None.

The package is cut along Kafka's classes: ``cleaner`` (Cleaner, the copy
through a record filter, and the transaction bookkeeping it needs),
``log_cleaner`` (LogCleaner: workers, scheduling, metrics), ``throttler``
(Throttler, GilYield), ``stats`` (CleanerStats, CleanerTotals),
``cleaner_manager`` (LogCleanerManager) and ``offset_map`` (SkimpyOffsetMap).
"""

from engine.cleaner.cleaner import AbortedTransactions, CleanedTransactions, Cleaner, LogCleaningError
from engine.cleaner.log_cleaner import LogCleaner
from engine.cleaner.stats import CleanerStats, CleanerTotals
from engine.cleaner.throttler import THROTTLER_CHECK_INTERVAL_MS, GilYield, Throttler

__all__ = ["THROTTLER_CHECK_INTERVAL_MS", "AbortedTransactions", "CleanedTransactions", "Cleaner", "CleanerStats",
           "CleanerTotals", "GilYield", "LogCleaner", "LogCleaningError", "Throttler"]
