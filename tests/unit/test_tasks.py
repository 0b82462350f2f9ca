"""The mount's periodic jobs without FUSE: which jobs exist, and how a run is counted.

``build_jobs`` is checked over a real LogManager; ``run_jobs`` runs plain
functions in a real trio nursery and the tests look only at the TaskRun
counters that ``.logfs/stats.json`` shows.  "Did not run again" is shown the
way the mount tests show it: another job's runs advance meanwhile.
"""

from __future__ import annotations

import logging

import pytest
import trio

from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.numbers import LONG_MAX
from logfs.stats import MountStats
from logfs.tasks import Job, build_jobs, run_jobs

HOUR_MS = 3_600_000


def _manager(tmp_path, props: dict[str, str] | None = None, read_only: bool = False) -> LogManager:
    m = LogManager(BrokerConfig.from_props({"log.dirs": str(tmp_path / "data"), **(props or {})}),
                   clock=ManualClock(), read_only=read_only)
    m.startup()
    return m


def test_build_jobs_has_kafkas_scheduler_names_and_intervals(tmp_path):
    m = _manager(tmp_path, {"log.retention.check.interval.ms": "1234",
                            "log.flush.scheduler.interval.ms": str(LONG_MAX),
                            "log.flush.offset.checkpoint.interval.ms": "2000",
                            "log.flush.start.offset.checkpoint.interval.ms": "3000",
                            "log.segment.delete.delay.ms": "200", "log.cleaner.threads": "2",
                            "log.cleaner.backoff.ms": "0"})
    try:
        jobs = {job.name: job for job in build_jobs(m)}
        assert {name: job.interval_ms for name, job in jobs.items()} == {
            "kafka-log-retention": 1234, "kafka-log-flusher": LONG_MAX, "kafka-recovery-point-checkpoint": 2000,
            "kafka-log-start-offset-checkpoint": 3000, "kafka-delete-logs": 200,
            "kafka-log-cleaner-thread-0": 1, "kafka-log-cleaner-thread-1": 1}   # a backoff of 0 would spin
        assert [name for name, job in jobs.items() if not job.enabled] == ["kafka-log-flusher"]
        cleaner = jobs["kafka-log-cleaner-thread-0"]
        assert cleaner.stop is not None
        assert cleaner.rerun_when is not None
        assert cleaner.rerun_when(None) is False   # nothing cleaned: back off
    finally:
        m.shutdown()


@pytest.mark.parametrize(("delay_ms", "interval_ms"), [("0", 10), ("5", 10), ("200", 200), ("60000", 1000)])
def test_the_deletion_job_looks_often_enough_for_file_delete_delay(tmp_path, delay_ms, interval_ms):
    m = _manager(tmp_path, {"log.segment.delete.delay.ms": delay_ms})
    try:
        assert {job.name: job.interval_ms for job in build_jobs(m)}["kafka-delete-logs"] == interval_ms
    finally:
        m.shutdown()


def test_no_cleaner_job_without_a_cleaner(tmp_path):
    # one at a time: each manager holds the data dir's lock until it shuts down
    for make in (lambda: _manager(tmp_path, {"log.cleaner.enable": "false"}),
                 lambda: _manager(tmp_path, read_only=True)):
        m = make()
        try:
            assert m.cleaner is None
            assert not any(job.name.startswith("kafka-log-cleaner") for job in build_jobs(m))
        finally:
            m.shutdown()


def _run_until(jobs: list[Job], stats: MountStats, done) -> None:
    """Run the jobs in a trio nursery until ``done()`` holds (checked every 5 ms), then cancel them."""
    async def main() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                run_jobs(nursery, jobs, 0, stats)
                # done() reads counters the jobs update after each run: there is no event to wait on
                while not done():  # noqa: ASYNC110
                    await trio.sleep(0.005)
                nursery.cancel_scope.cancel()
    trio.run(main)


def test_runs_errors_and_results_are_counted(caplog):
    stats = MountStats()
    calls = []

    def failing() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    jobs = [Job("ticker", 5, lambda: 7), Job("failing", 5, failing), Job("never", LONG_MAX, lambda: None)]
    with caplog.at_level(logging.ERROR, logger="logfs.tasks"):
        _run_until(jobs, stats, lambda: "failing" in stats.tasks and stats.tasks["failing"].runs >= 3)
    ticker, failed = stats.tasks["ticker"].as_dict(), stats.tasks["failing"].as_dict()
    assert ticker["runs"] >= 1
    assert ticker["errors"] == 0
    assert ticker["last_result"] == 7
    assert ticker["last_error"] is None
    assert ticker["interval_ms"] == 5
    assert failed["runs"] == failed["errors"] == len(calls) >= 3
    assert failed["last_error"] == "RuntimeError: boom"
    assert "never" not in stats.tasks                  # a disabled job is never scheduled
    errors = [r for r in caplog.records if r.name == "logfs.tasks" and r.levelno >= logging.ERROR]
    assert len(errors) == len(calls)                    # one line per failed run, naming the job
    assert all("'failing'" in r.getMessage() and "boom" in r.getMessage() for r in errors)


def test_a_job_with_more_work_runs_again_at_once_then_waits_its_interval():
    stats = MountStats()
    results = iter([1, 1, 1, None, 1, 1])

    jobs = [Job("drainer", HOUR_MS, lambda: next(results), rerun_when=lambda r: r is not None),
            Job("ticker", 5, lambda: None)]
    # 4 runs (three with more work, then none) and an hour's wait: the ticker's runs meanwhile show
    # that time passed without a fifth.
    marks: dict[str, int] = {}

    def done() -> bool:
        drainer, ticker = stats.tasks.get("drainer"), stats.tasks.get("ticker")
        if drainer is None or ticker is None or drainer.runs < 4:
            return False
        marks.setdefault("ticker", ticker.runs)
        return ticker.runs >= marks["ticker"] + 3
    _run_until(jobs, stats, done)
    assert stats.tasks["drainer"].runs == 4
    assert stats.tasks["drainer"].last_result is None
