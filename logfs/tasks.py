"""Kafka's periodic log jobs as trio tasks of the mount.

Kafka's ``LogManager.startup`` schedules retention, the flusher, the two
checkpoints and the deletion of renamed logs on its ``KafkaScheduler`` (and
its ``RemoteLogManager`` the copies to remote storage); here
each is a trio task in the mount's nursery.  The jobs themselves are plain
``LogManager`` methods: they fsync, rename and unlink, so every run leaves the
trio thread (``trio.to_thread.run_sync``) and FUSE requests keep flowing.

All jobs are declared in one place, :func:`build_jobs`.  A job whose interval
is ``Long.MAX_VALUE`` (or <= 0) never runs, as in Kafka.

The log cleaner is ``log.cleaner.threads`` jobs named like Kafka's
``kafka-log-cleaner-thread-<i>`` threads, each calling
``LogCleaner.clean_once``: again at once while it finds a log to clean, after
``log.cleaner.backoff.ms`` when it finds none.  At unmount ``stop_jobs`` calls
``LogCleaner.shutdown``, which makes a clean in progress abort at its next read
and waits for it, and the nursery then waits for every worker thread, so no
clean is writing ``.cleaned`` files when ``LogManager.shutdown`` closes the logs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from engine.errors import LogfsError
from engine.numbers import LONG_MAX

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from engine.manager import LogManager
    from logfs.stats import MountStats

log = logging.getLogger(__name__)

__all__ = ["Job", "build_jobs", "cleaner_jobs", "run_jobs", "stop_jobs"]

#: the deletion job never waits longer than this between scans, whatever the delays
MAX_DELETE_SCAN_INTERVAL_MS = 1000


@dataclass(frozen=True)
class Job:
    """One periodic job: ``run`` is called in a worker thread every ``interval_ms``.

    ``rerun_when(result)`` true means "there is more work": run again at once
    instead of sleeping, which is how a cleaner thread drains the filthiest
    logs and backs off ``log.cleaner.backoff.ms`` only when idle.
    """

    name: str
    interval_ms: int
    run: Callable[[], Any]     # Any: a task's result, of its own kind
    rerun_when: Callable[[Any], bool] | None = None     # Any: as run's
    #: asks a long run in progress to stop (e.g. LogCleaner.shutdown) before the mount waits for it
    stop: Callable[[], object] | None = None

    @property
    def enabled(self) -> bool:
        return 0 < self.interval_ms < LONG_MAX


def build_jobs(manager: LogManager) -> list[Job]:
    """Every periodic job of the mount, with Kafka's scheduler names."""
    cfg = manager.config

    def delete_renamed_files() -> int:
        # Partition dirs renamed -delete, then segments renamed .deleted whose
        # file.delete.delay.ms has passed: Kafka's "kafka-delete-logs" job plus
        # the per-segment delayed deletes Kafka schedules one by one.
        # Both run even when the first fails; a failure of either fails the run.
        try:
            dirs = manager.delete_logs()
        except Exception:
            manager.delete_expired_segment_files()
            raise
        return dirs + manager.delete_expired_segment_files()

    # Deletion honours file.delete.delay.ms per segment inside the engine; this
    # is only how often it looks, so a short delay is not stretched by much.
    delete_interval = max(10, min(cfg.log_segment_delete_delay_ms, MAX_DELETE_SCAN_INTERVAL_MS))

    jobs = [
        Job("kafka-log-retention", cfg.log_retention_check_interval_ms, manager.cleanup_logs),
        Job("kafka-log-flusher", cfg.log_flush_scheduler_interval_ms, manager.flush_dirty_logs),
        Job("kafka-recovery-point-checkpoint", cfg.log_flush_offset_checkpoint_interval_ms,
            manager.checkpoint_recovery_points),
        Job("kafka-log-start-offset-checkpoint", cfg.log_flush_start_offset_checkpoint_interval_ms,
            manager.checkpoint_log_start_offsets),
        Job("kafka-delete-logs", delete_interval, delete_renamed_files),
    ]
    if manager.remote_log_manager is not None:
        # Kafka's RLMCopyTask and RLMExpirationTask (remote.log.manager.task.interval.ms): copies of the closed
        # segments of remote-enabled topics, deletion of the copies retention and topic deletion dropped;
        # backing off inside the engine while the store fails
        # a round that copied or deleted something goes again at once: segments rolled meanwhile are copied
        # without waiting out the interval (copies keep up with a burst of appends)
        jobs.append(Job("kafka-remote-log-manager", cfg.remote_log_manager_task_interval_ms,
                        manager.copy_to_remote_storage, rerun_when=_did_something))
    jobs += cleaner_jobs(manager)
    return jobs


def cleaner_jobs(manager: LogManager) -> list[Job]:
    """One job per log cleaner worker; none when the manager has no cleaner.

    ``LogManager.startup`` creates the cleaner only when ``log.cleaner.enable``
    is true, the mount is writable and ``log.cleaner.threads`` > 0.  A backoff
    of 0 would make an idle worker spin on the trio thread, hence at least 1 ms.
    """
    cleaner = manager.cleaner
    if cleaner is None:
        return []
    cfg = manager.config
    backoff_ms = max(int(cfg.log_cleaner_backoff_ms), 1)
    return [Job(f"kafka-log-cleaner-thread-{i}", backoff_ms, cleaner.clean_once,
                rerun_when=_cleaned_something, stop=cleaner.shutdown)
            for i in range(int(cfg.log_cleaner_threads))]


def _did_something(result: Any) -> bool:     # Any: a task's result
    # copy_to_remote_storage returns how many copies it made and deleted
    return isinstance(result, int) and result > 0


def _cleaned_something(result: Any) -> bool:     # Any: the cleaner task's result
    # clean_once returns the CleanerStats of a clean, or None when no log was dirty enough.
    return result is not None


async def _run_periodically(job: Job, initial_delay_ms: int, stats: MountStats) -> None:
    record = stats.task(job.name, job.interval_ms)
    await trio.sleep(max(0, initial_delay_ms) / 1000)
    while True:
        started = time.monotonic()
        record.last_run_ms = time.time_ns() // 1_000_000
        try:
            # Not abandonable on cancel: shutdown waits for a running job to
            # finish before the manager closes the logs under it.
            record.last_result = await trio.to_thread.run_sync(job.run)
            record.last_error = None
        except LogfsError as exc:
            # An expected failure (full disk, I/O error), already logged per item
            # by the engine: one line, no traceback, and the run counts as an error.
            record.errors += 1
            record.last_error = f"{type(exc).__name__}: {exc}"
            log.error("Scheduled task '%s' failed: %s", job.name, exc)
        except Exception as exc:  # a failed run is logged and retried next period, as Kafka does
            record.errors += 1
            record.last_error = f"{type(exc).__name__}: {exc}"
            log.error("Uncaught exception in scheduled task '%s': %s", job.name, exc, exc_info=True)
        duration_ms = (time.monotonic() - started) * 1000
        record.runs += 1
        record.last_duration_ms = round(duration_ms, 3)
        record.total_duration_ms += duration_ms
        if job.rerun_when is not None and record.last_error is None and job.rerun_when(record.last_result):
            await trio.lowlevel.checkpoint()   # more work: go again, but let FUSE requests in first
            continue
        await trio.sleep(job.interval_ms / 1000)


def run_jobs(nursery: trio.Nursery, jobs: list[Job], initial_delay_ms: int, stats: MountStats) -> None:
    """Start every enabled job in ``nursery``; cancelling the nursery stops them."""
    for job in jobs:
        if not job.enabled:
            log.info("Scheduled task '%s' disabled (interval %d ms)", job.name, job.interval_ms)
            continue
        log.info("Scheduling task '%s' every %d ms after an initial delay of %d ms",
                 job.name, job.interval_ms, initial_delay_ms)
        nursery.start_soon(_run_periodically, job, initial_delay_ms, stats, name=job.name)


def stop_jobs(jobs: list[Job]) -> None:
    """Ask long-running jobs to wind down; the caller then cancels the nursery, which waits for them."""
    for job in jobs:
        if job.stop is not None:
            try:
                job.stop()
            except Exception:
                log.exception("Stopping scheduled task '%s' failed", job.name)
