"""``logfs``: mount, umount, dump-log and check.

``logfs mount`` is the broker of this project: it builds the ``BrokerConfig``
(Kafka defaults, then ``--config`` server.properties, then ``-o name=value``,
then ``--data-dir`` for ``log.dirs``), starts the ``LogManager`` (loading and
recovering every log), serves the mount in the foreground and schedules
Kafka's periodic jobs, and on unmount, SIGINT, SIGTERM or SIGHUP (a closed
terminal, an ssh drop) shuts the manager down cleanly (flush, checkpoints,
clean-shutdown marker) before unmounting, as a broker does on SIGTERM.
``logfs umount`` returns once that shutdown is done.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import logging.handlers
import os
import re
import signal
import stat
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from engine.config import DEFAULT_LOG_DIR
from logfs.remote_settings import RSM_PREFIX, remote_storage_settings

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator, Sequence

    from engine.config import BrokerConfig
    from engine.remote.storage import RemoteStorageManager
    from logfs.access import MountAccess

log = logging.getLogger("logfs")

#: Data directory of the local replica of a mount of a Kafka cluster (--bootstrap-server)
DEFAULT_CLUSTER_DATA_DIR = "./data-cluster"

_LOG_FORMAT = "[%(asctime)s] %(levelname)s %(message)s (%(name)s)"


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), format=_LOG_FORMAT,
                        stream=sys.stderr)


def _octal(text: str) -> int:
    """An umask in octal, 000 to 777."""
    if not text or len(text) > 4 or any(c not in "01234567" for c in text):
        raise argparse.ArgumentTypeError(f"invalid umask {text!r}: three octal digits, e.g. 077 or 022")
    return int(text, 8)


def version() -> str:
    """The installed logfs version (pyproject.toml), or 'unknown' when run from an uninstalled tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version
    try:
        return _version("logfs")
    except PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="logfs", description="Kafka's log storage, mounted as a filesystem.")
    parser.add_argument("--version", action="version", version=f"logfs {version()}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    mount = sub.add_parser("mount", help="serve a mount in the foreground until unmounted")
    mount.add_argument("mountpoint")
    mount.add_argument("--data-dir", action="append", default=[], metavar="DIR",
                       help=f"a log directory (repeatable; overrides log.dirs; default {DEFAULT_LOG_DIR})")
    mount.add_argument("--config", metavar="FILE",
                       help="broker settings in server.properties syntax; with --bootstrap-server, a Kafka client "
                            "properties file (as --command-config of Kafka's tools) and the replica's settings")
    mount.add_argument("-o", dest="options", action="append", default=[], metavar="NAME=VALUE",
                       help="a broker setting (Kafka name), applied after --config; repeatable")
    mount.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT...]",
                       help="mount a Kafka cluster: its topics served from a local replica in the data dir "
                            f"(default {DEFAULT_CLUSTER_DATA_DIR}); -o also takes Kafka client settings")
    mount.add_argument("--topics", metavar="REGEX",
                       help="with --bootstrap-server: list and replicate only the topics whose whole name matches "
                            "(as a Kafka consumer subscribes by pattern)")
    mount.add_argument("--from", dest="start", metavar="earliest|latest|TIME", default="earliest",
                       help="with --bootstrap-server: where the replica of a partition starts on its first use: "
                            "its log start (default), its end, or the first record at or after TIME "
                            "(ISO 8601 or epoch ms)")
    mount.add_argument("--read-only", action="store_true", help="serve the logs read-only (EROFS on writes)")
    mount.add_argument("--allow-other", action="store_true",
                       help="let other users access the mount: they may read and list, never write, create, "
                            "delete or commit a consumer group's offsets (unless --allow-group names their group)")
    mount.add_argument("--allow-group", metavar="GROUP",
                       help="with --allow-other: the mount's files belong to GROUP (a name or gid), whose members "
                            "may do what the mount's owner does (on a cluster: as the mount's Kafka principal)")
    mount.add_argument("--umask", dest="mount_umask", type=_octal, default=0, metavar="OCTAL",
                       help="bits taken away from the mode of every name in the mount (default 000; 027: other "
                            "users see nothing, 007 with --allow-group: only the owner and the group)")
    mount.add_argument("--foreground", action="store_true", default=True,
                       help="serve in the foreground (the only mode; accepted for familiarity)")
    mount.add_argument("--page-cache", action=argparse.BooleanOptionalAction, default=True,
                       help="serve views through the kernel page cache (the default: a re-read comes from "
                            "the cache); --no-page-cache serves them with direct I/O, every read from the "
                            "mount's process")
    mount.add_argument("--data-umask", type=_octal, default=0o077, metavar="OCTAL",
                       help="umask for the files and dirs logfs creates in the data dirs (default 077: "
                            "private, 0700 dirs and 0600 files; 022 gives 0755/0644)")
    mount.add_argument("--log-level", dest="sub_log_level", default=None, metavar="LEVEL",
                       help="DEBUG, INFO, WARNING or ERROR (default INFO)")

    umount = sub.add_parser("umount", help="unmount a logfs mount and wait for its clean shutdown")
    umount.add_argument("mountpoint")
    umount.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="how long to wait for the serving process to finish its shutdown (default 300)")
    umount.add_argument("--abort", action="store_true",
                        help="end the FUSE connection of a mount that does not answer (its logfs process was "
                             "killed and is stuck, or hangs): waiting requests fail with ECONNABORTED, then the "
                             "mount is detached; what the process had not flushed is recovered at the next mount")

    dump = sub.add_parser("dump-log", help="print segment or index files like kafka-dump-log.sh")
    dump.add_argument("files", nargs="+", metavar="FILE")
    dump.add_argument("--print-data-log", action="store_true", help="print each record's key and value")

    check = sub.add_parser("check", help="verify data directories offline (CRCs, indexes, checkpoints)")
    check.add_argument("dirs", nargs="+", metavar="DIR")
    check.add_argument("--config", metavar="FILE",
                       help="tiered storage: the rsm.config.* settings of the store, to check the remote log "
                            "segments' metadata against it (a properties file, as for logfs mount)")
    check.add_argument("-o", dest="options", action="append", default=[], metavar="NAME=VALUE",
                       help="tiered storage: an rsm.config.* setting of the store; repeatable")

    from logfs.to_kafka import add_parser as add_to_kafka_parser
    add_to_kafka_parser(sub)
    return parser


def broker_config(args: argparse.Namespace) -> BrokerConfig:
    """Kafka defaults, then the properties file (unknown names warned about and ignored,
    as Kafka does), then ``-o`` and ``--data-dir`` (unknown names refused)."""
    from engine.config import BrokerConfig
    from engine.errors import InvalidConfigError

    file_props = BrokerConfig.read_properties_file(args.config) if args.config else {}
    file_props = {k: v for k, v in file_props.items() if not k.strip().startswith(RSM_PREFIX)}
    overrides: dict[str, str] = {}
    for option in args.options:
        name, sep, value = option.partition("=")
        if not sep or not name.strip():
            raise InvalidConfigError(f"Invalid -o option {option!r}: expected name=value")
        if not name.strip().startswith(RSM_PREFIX):     # the store's settings: remote_storage_settings
            overrides[name.strip()] = value.strip()
    if args.data_dir:
        overrides["log.dirs"] = ",".join(os.path.abspath(d) for d in args.data_dir)
    elif not any(name in props for props in (file_props, overrides) for name in ("log.dirs", "log.dir")):
        default = DEFAULT_CLUSTER_DATA_DIR if getattr(args, "bootstrap_server", None) else DEFAULT_LOG_DIR
        overrides["log.dirs"] = os.path.abspath(default)
    return BrokerConfig.from_props(file_props).with_overrides(overrides, strict=True)


def _open_remote_storage(args: argparse.Namespace,
                         config: BrokerConfig) -> tuple[RemoteStorageManager, int, int] | None:
    """(the store, the chunk cache's bound, its chunk size) when ``remote.log.storage.system.enable=true``.

    InvalidConfigError names a setting that is missing or wrong; RemoteStorageError says why the store
    did not answer (a wrong endpoint, bucket or key: each names its setting).
    """
    from engine.errors import InvalidConfigError
    from engine.remote.storage import chunk_cache_bounds, open_remote_storage

    settings = remote_storage_settings(args)
    if not config.remote_log_storage_system_enable:
        if settings:
            log.warning("Ignoring %s: remote.log.storage.system.enable is not true", ", ".join(sorted(settings)))
        return None
    if args.read_only:
        raise InvalidConfigError("remote.log.storage.system.enable=true cannot be combined with --read-only yet")
    cache_bytes, chunk_bytes = chunk_cache_bounds(settings)
    started = time.monotonic()
    storage = open_remote_storage(settings)
    log.info("Opened remote storage %s in %d ms", storage.uri, (time.monotonic() - started) * 1000)
    return storage, cache_bytes, chunk_bytes


def _client_properties(args: argparse.Namespace) -> dict[str, str]:
    """The ``--config`` file of a cluster mount: a Kafka client properties file (``--command-config`` of
    Kafka's tools), which may also hold the local replica's settings.

    Its secrets are redacted from every log line from now on (logfs.cluster.client_settings); a file
    holding a secret that the group or others can read is warned about, once.
    """
    from engine.config import BrokerConfig
    from logfs.cluster.client_settings import SECRET_NAMES, RedactSecrets

    if not args.config:
        return {}
    props = BrokerConfig.read_properties_file(args.config)
    secrets = [v for k, v in props.items() if k.strip() in SECRET_NAMES]
    RedactSecrets(secrets).install()
    if "bootstrap.servers" in props and props["bootstrap.servers"].strip() != args.bootstrap_server:
        log.warning("Connecting to --bootstrap-server %s, not to bootstrap.servers=%s of %s", args.bootstrap_server,
                    props["bootstrap.servers"].strip(), args.config)
    mode = os.stat(args.config).st_mode
    if secrets and mode & 0o077:
        log.warning("Client settings file %s holds secrets (%s) and can be read by %s (mode %03o): chmod 600 it",
                    args.config, ", ".join(sorted({k.strip() for k in props if k.strip() in SECRET_NAMES})),
                    "its group and others" if mode & 0o007 else "its group", stat.S_IMODE(mode))
    return props


#: glibc's ``mallopt`` parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: malloc arenas of the mount process (glibc's default is 8 per core)
MALLOC_ARENAS = 2
#: blocks up to this size come from the heap, not each from a fresh mmap (glibc's default: 128 KiB, rising
#: with what is freed, a rule any mallopt call ends)
MALLOC_MMAP_THRESHOLD = 4 << 20
#: free memory at the top of the heap kept for the next request instead of going back to the kernel
MALLOC_TRIM_THRESHOLD = 8 << 20


def _tune_malloc() -> None:
    """glibc malloc for a FUSE server of 1 MiB requests, each setting unless its ``MALLOC_*`` variable is set.

    * At most ``MALLOC_ARENAS`` arenas.  Every worker thread that allocates
      while another does gets an arena of its own (up to 8 per core), and
      memory freed in one is not reused by another: over a long session of
      appends, reads and deletions through the worker threads the mount's RSS
      crept up (docs/reliability.md, "Reliability").  Two arenas keep the
      threads from contending much and the freed memory reusable.
    * The buffers of a 1 MiB request (the request, the lines with their
      partial line, the encoded batch) are reused from the heap.  glibc's
      own threshold rises only once a block that large has been freed, so
      whether they came from fresh mmaps, every page faulted in again, would
      hang on what else the process had allocated; with these settings they
      never do, and RSS does not grow (the faults and CPU of a 100 MB append
      either way: docs/performance.md, "Figures behind the code").
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        for variable, parameter, value in (("MALLOC_ARENA_MAX", _M_ARENA_MAX, MALLOC_ARENAS),
                                           ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD),
                                           ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)):
            if variable not in os.environ:
                libc.mallopt(parameter, value)
    except (OSError, AttributeError):   # not glibc (musl has no mallopt): nothing to tune
        pass


def _cluster_selection(args: argparse.Namespace) -> tuple[re.Pattern[str] | None, str | int]:
    """``--topics`` compiled and ``--from`` parsed (as ``since/`` parses a time); InvalidConfigError if bad."""
    from engine.errors import InvalidConfigError
    from logfs.names import parse_timestamp

    if not args.bootstrap_server and (args.topics is not None or args.start != "earliest"):
        raise InvalidConfigError("--topics and --from choose what a mount of a Kafka cluster replicates: "
                                 "give --bootstrap-server")
    pattern = None
    if args.topics is not None:
        try:
            pattern = re.compile(args.topics)
        except re.error as exc:
            raise InvalidConfigError(f"Invalid --topics {args.topics!r}: {exc}") from None
    start: str | int = args.start
    if start not in ("earliest", "latest"):
        parsed = parse_timestamp(args.start)
        if parsed is None:
            raise InvalidConfigError(f"Invalid --from {args.start!r}: expected earliest, latest, an ISO 8601 "
                                     "time or epoch milliseconds")
        start = parsed
    return pattern, start


def _tls_diagnosed(reason: str, bootstrap: str, client: dict[str, str]) -> str:
    """A failed TLS handshake's reason with OpenSSL's verdict on the broker's certificate: librdkafka says
    "check ssl.ca.location" for every refused certificate, an expired one included (logfs.cluster.tls_check)."""
    if "The TLS handshake with the Kafka cluster" not in reason:
        return reason
    from logfs.cluster.tls_check import broker_certificate_problem
    problem = broker_certificate_problem(bootstrap, client)
    if problem is None:
        return reason
    dates, text = problem
    return f"The TLS handshake with the Kafka cluster at {bootstrap} failed: {text}" if dates \
        else f"{reason}; {text}"


def _mount_access(args: argparse.Namespace) -> MountAccess:
    """Who besides the mount's owner may do what (logfs.access), from ``--allow-group`` and ``--umask``."""
    from engine.errors import InvalidConfigError
    from logfs.access import MountAccess, group_id

    group = None
    if args.allow_group is not None:
        if not args.allow_other:
            raise InvalidConfigError("--allow-group needs --allow-other (without it no other user reaches "
                                     "the mount)")
        try:
            group = group_id(args.allow_group)
        except ValueError as exc:
            raise InvalidConfigError(f"Invalid --allow-group: {exc}") from None
    return MountAccess.of_process(group, args.mount_umask)


def _mount(args: argparse.Namespace) -> int:
    import pyfuse3
    import trio

    _tune_malloc()

    from engine.errors import LogfsError
    from engine.manager import LogManager
    from logfs.fs import LogfsOperations
    from logfs.namespace import Namespace
    from logfs.stats import MountStats
    from logfs.tasks import build_jobs, run_jobs, stop_jobs

    mountpoint = os.path.abspath(args.mountpoint)
    try:
        is_dir = stat.S_ISDIR(os.stat(mountpoint).st_mode)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:   # the FUSE connection of a logfs that died is still mounted
            log.error("Mount point %s is a stale mount of a logfs that died: run 'logfs umount %s' first",
                      mountpoint, mountpoint)
        else:
            log.error("Mount point %s cannot be used: %s", mountpoint, exc.strerror)
        return 2
    if not is_dir:
        log.error("Mount point %s is not a directory", mountpoint)
        return 2
    cluster_options = None
    try:
        selection = _cluster_selection(args)
        if args.bootstrap_server:
            from logfs.cluster.config import split_options
            if args.read_only:
                raise LogfsError("--read-only cannot be combined with --bootstrap-server (the replica follows "
                                 "the cluster)")
            cluster_options = split_options(args.bootstrap_server, args.options, _client_properties(args))
            args.options = cluster_options.local
            args.config = None          # its settings are in cluster_options (the replica's in .local)
        config = broker_config(args)
        access = _mount_access(args)
        if cluster_options is not None and config.remote_log_storage_system_enable:
            raise LogfsError("remote.log.storage.system.enable=true is the embedded mount's tiered storage: a "
                             "mount of a Kafka cluster keeps a local replica (the cluster tiers its own logs)")
    except (LogfsError, OSError) as exc:
        log.error("Invalid configuration: %s", exc)
        return 2
    try:
        remote = _open_remote_storage(args, config)
    except LogfsError as exc:
        log.error("Cannot use remote storage (remote.log.storage.system.enable=true): %s", exc)
        return 2
    if cluster_options is not None:
        from logfs.cluster.client_settings import RedactSecrets
        RedactSecrets(cluster_options.settings.secrets).install()   # -o's too (the file's were already)
    # Everything the engine creates (data dirs, partition dirs, segments, indexes,
    # checkpoints) gets its mode from this one umask: the data is as private as the mount.
    os.umask(args.data_umask)
    for d in config.log_dirs:
        if not args.read_only:            # read-only writes nothing, not even a missing dir
            os.makedirs(d, exist_ok=True)

    # a cluster mount's logs are replicas of live leaders: read_committed views end at the last stable offset
    storage, cache_bytes, chunk_bytes = remote if remote is not None else (None, 0, 0)
    manager = LogManager(config, read_only=args.read_only, stable_offset_bounded=cluster_options is not None,
                         remote_storage=storage, remote_cache_bytes=cache_bytes, remote_chunk_bytes=chunk_bytes)
    stats = MountStats()
    started = time.monotonic()
    stop_signals = _StopSignals()     # until the FUSE loop runs, and again while shutting down
    with _startup_summary_first() as summary:
        try:
            manager.startup()
        except (LogfsError, OSError) as exc:
            log.error("Log manager failed to start: %s", exc)
            return 1
        stats.load_ms = (time.monotonic() - started) * 1000
        summary(f"logfs {version()} loaded {manager.loaded_logs} logs from {','.join(config.log_dirs)} "
                f"in {round(stats.load_ms)} ms{', read-only' if args.read_only else ''}")

    if stop_signals.received is not None:       # logged when it arrived: stop without mounting
        manager.shutdown()
        log.info("Shutdown completed")
        return 0
    backend = None
    if cluster_options is not None:
        from logfs.cluster.backend import ClusterBackend
        try:
            backend = ClusterBackend(manager, cluster_options, topics=selection[0], start=selection[1])
            backend.start()
        except (LogfsError, OSError, ValueError) as exc:   # ValueError: a client setting librdkafka refuses
            log.error("Cannot mount the Kafka cluster at %s: %s", cluster_options.bootstrap,
                      _tls_diagnosed(str(exc), cluster_options.bootstrap, cluster_options.client))
            if backend is not None:
                backend.close()
            manager.shutdown()
            return 1
        log.info("Serving the Kafka cluster at %s from the local replica in %s", cluster_options.bootstrap,
                 ",".join(config.log_dirs))
    namespace = Namespace(manager, stats, read_only=args.read_only, views_direct_io=not args.page_cache,
                          backend=backend)
    ops = LogfsOperations(namespace, access)
    options = set(pyfuse3.default_options)
    options |= {"fsname=logfs", "subtype=logfs"}
    if args.allow_other:
        options.add("allow_other")
        log.info("Other users may use the mount (--allow-other): %s", access.describe())
    # --read-only is enforced by logfs, not by the kernel's "ro" flag: with
    # "ro" the kernel answers EROFS itself and the mount could not log what
    # was refused (SPEC.md section 7: every refusal names its cause in the log).

    jobs = [] if args.read_only else build_jobs(manager)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, stop_signals, name="signal-watcher")
            run_jobs(nursery, jobs, config.log_initial_task_delay_ms, stats)
            if not namespace.views_direct_io:
                nursery.start_soon(trio.to_thread.run_sync, _raise_readahead, mountpoint)
            log.info("Mounted logfs at %s (log.dirs=%s%s)", mountpoint, ",".join(config.log_dirs),
                     ", read-only" if args.read_only else "")
            await pyfuse3.main()
            # No more requests: stop the background jobs (a running one is waited for).
            stop_jobs(jobs)
            nursery.cancel_scope.cancel()

    try:
        pyfuse3.init(ops, mountpoint, options)
    except RuntimeError as exc:
        log.error("Mounting %s failed: %s", mountpoint, exc)
        namespace.backend.close()
        manager.shutdown()
        return 1
    status = 0
    try:
        stop_signals.doing = "finishing the mount's start"
        trio.run(serve)
    except Exception:
        log.exception("The FUSE main loop failed; shutting down")
        status = 1
    finally:
        # trio's receiver has given the signals back to stop_signals: a second SIGHUP (the rest of
        # an ssh session dying) must not cut the shutdown short
        stop_signals.doing = "finishing the shutdown in progress"
        # The kernel will send no release/forget any more: close what they would have.
        try:
            ops.close_all()
            namespace.backend.close()
            manager.shutdown()
            log.info("Shutdown completed")
        finally:
            pyfuse3.close(unmount=True)
            log.info("Unmounted %s", mountpoint)
    return status


#: the kernel's readahead for the mount (KiB): FUSE offers at most the default 128 KiB at INIT, so
#: reads through the page cache would reach the mount 128 KiB at a time instead of 1 MiB (mergerfs'
#: ``readahead`` option raises it the same way)
READAHEAD_KB = 1024


def _raise_readahead(mountpoint: str) -> None:
    """Set the mount's ``read_ahead_kb`` in sysfs (root only; otherwise the kernel's default stays).

    Runs in a worker thread once the mount serves: its ``stat`` returns after
    the kernel applied the INIT reply, which sets the readahead it negotiated.
    """
    try:
        device = os.stat(mountpoint).st_dev
        with open(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb", "w") as knob:
            knob.write(str(READAHEAD_KB))
    except OSError as exc:
        log.info("Kernel readahead of the mount stays at its default (cannot set read_ahead_kb: %s)",
                 exc.strerror)


@contextlib.contextmanager
def _startup_summary_first() -> Iterator[Callable[[str], None]]:
    """Hold the lines logged while the logs load, so the summary is the mount's first line.

    Loading logs one line per partition (Kafka's LogLoader messages); an
    operator reads the outcome first, then the details, which follow with their
    own timestamps.  A WARNING or worse is not held back: it flushes what is
    held at once, so a failing recovery shows while it happens.
    """
    root = logging.getLogger()
    targets = list(root.handlers)
    # at most 10,000 lines held (a few MB): a larger load writes them as they come
    held = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.WARNING)
    held.setTarget(_Fanout(targets))
    for handler in targets:
        root.removeHandler(handler)
    root.addHandler(held)
    summary_line: list[str] = []
    started = time.time()

    def summary(line: str) -> None:
        summary_line.append(line)

    try:
        yield summary
    finally:
        root.removeHandler(held)
        for handler in targets:
            root.addHandler(handler)
        if summary_line:
            # stamped when the load started, so the log's timestamps stay in order: the summary first
            record = log.makeRecord(log.name, logging.INFO, __file__, 0, "%s", (summary_line[0],), None)
            record.created = started
            record.msecs = (started - int(started)) * 1000
            log.handle(record)
        held.flush()
        held.close()


class _Fanout(logging.Handler):
    """The real handlers, behind the MemoryHandler of _startup_summary_first."""

    def __init__(self, targets: list[logging.Handler]) -> None:
        super().__init__()
        self.targets = targets

    def emit(self, record: logging.LogRecord) -> None:
        for handler in self.targets:
            if record.levelno >= handler.level:
                handler.handle(record)


#: the signals that stop the mount cleanly (a broker's shutdown hook runs on SIGINT, SIGTERM and SIGHUP)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _StopSignals:
    """Stop signals outside the FUSE loop (loading the logs, shutting down): noted and logged, never fatal."""

    def __init__(self) -> None:
        self.received: str | None = None
        #: what the mount does when a signal arrives, for the log line
        self.doing = "loading the logs first"
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        log.info("Received %s: shutting down, %s", name, self.doing)
        self.received = name


async def _watch_signals(stop_signals: _StopSignals) -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        if stop_signals.received is not None:      # arrived between the start and this receiver
            pyfuse3.terminate()
            return
        async for signum in signals:
            log.info("Received %s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


def _mounted_fuse(path: str) -> bool:
    """Whether ``path`` is a mount point in /proc/self/mountinfo (works on a dead FUSE mount too)."""
    from logfs.fuse_connection import mounts

    try:
        return any(mount.point == path for mount in mounts())
    except OSError:
        return True     # cannot tell: let fusermount3 decide


def _umount(args: argparse.Namespace) -> int:
    """fusermount3 -u, then wait until the serving process has finished its clean shutdown.

    The kernel detaches the mount at once; the process then flushes, writes
    its checkpoints and the clean-shutdown marker, and exits.  Its pid and log
    dirs are read from ``.logfs/stats.json`` before unmounting, so this returns
    only when the data dirs are ready for ``to-kafka`` or another mount (or
    says that the wait timed out).
    """
    path = os.path.abspath(args.mountpoint)
    if not _mounted_fuse(path):
        if not os.path.isdir(path):
            print(f"logfs umount: {args.mountpoint}: no such directory", file=sys.stderr)
            return 1
        print(f"logfs umount: {args.mountpoint} is not mounted", file=sys.stderr)
        return 1
    if args.abort:
        return _abort(args.mountpoint, path)
    try:
        server = _serving_process(path)
    except TimeoutError:
        print(f"logfs umount: {args.mountpoint} does not answer within {_ANSWER_S:.0f} s: its logfs process is "
              f"stuck, or was killed and could not exit; `logfs umount --abort {args.mountpoint}` ends its FUSE "
              "connection (waiting requests fail with ECONNABORTED) and detaches it", file=sys.stderr)
        return 1
    result = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True)
    if result.returncode == 0:
        return _wait_for_shutdown(args.mountpoint, server, args.timeout)
    message = result.stderr.strip()
    if "busy" in message.lower():
        print(f"logfs umount: {args.mountpoint} is busy: a process has a file or its working directory "
              "in it (see `fuser -vm`); close it and try again", file=sys.stderr)
    elif "not connected" in message.lower() or "Transport endpoint" in message:
        # the logfs process died (kill -9): detach the dead connection
        result = subprocess.run(["fusermount3", "-uz", path], capture_output=True, text=True)
        if result.returncode == 0:
            print(f"logfs umount: {args.mountpoint} was a stale mount of a logfs that died; detached it",
                  file=sys.stderr)
            return 0
        print(f"logfs umount: {result.stderr.strip()}", file=sys.stderr)
    else:
        print(f"logfs umount: {message}", file=sys.stderr)
    return result.returncode or 1


#: how long ``logfs umount`` waits for the mount to answer a read of its stats before it says it does not
_ANSWER_S = 10.0


def _abort(shown: str, path: str) -> int:
    """``logfs umount --abort``: end the mount's FUSE connection (logfs.fuse_connection), then detach it."""
    from logfs.fuse_connection import abort_fuse_connection, fuse_connection

    connection = fuse_connection(path)
    if not abort_fuse_connection(connection):
        print(f"logfs umount: cannot abort the FUSE connection {connection} of {shown} through "
              "/sys/fs/fuse/connections (only its owner and root may; is fusectl mounted?)", file=sys.stderr)
        return 1
    result = subprocess.run(["fusermount3", "-uz", path], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"logfs umount: aborted the FUSE connection of {shown}, but could not detach it: "
              f"{result.stderr.strip()}", file=sys.stderr)
        return 1
    print(f"logfs umount: aborted the FUSE connection of {shown} and detached it; the next mount of its data "
          "dirs recovers what was not flushed", file=sys.stderr)
    return 0


def _serving_process(path: str) -> tuple[int, list[str], bool] | None:
    """(pid, log dirs, read-only) of the process serving the logfs mount at ``path``; None if it cannot say.

    Raises TimeoutError when the mount does not answer the read within ``_ANSWER_S`` (the read is left to a
    daemon thread: a request to a mount whose process is stuck waits for good)."""
    import json
    import threading

    answer: list[bytes] = []

    def read() -> None:
        with contextlib.suppress(OSError), open(os.path.join(path, ".logfs", "stats.json"), "rb") as f:
            answer.append(f.read())

    reader = threading.Thread(target=read, name="logfs-umount-stats", daemon=True)
    reader.start()
    reader.join(_ANSWER_S)
    if reader.is_alive():
        raise TimeoutError(path)
    try:
        doc = json.loads(answer[0]) if answer else None
        if doc is None:
            return None
        pid = int(doc["pid"])
        dirs = [str(d) for d in doc["log_dirs"]]
        read_only = bool(doc.get("read_only", False))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid, dirs, read_only


def _wait_for_shutdown(shown: str, server: tuple[int, list[str], bool] | None, timeout: float) -> int:
    from engine.checkpoint import CLEAN_SHUTDOWN_FILE

    if server is None:
        return 0        # not a mount that says who serves it (an older logfs): nothing to wait for
    pid, dirs, read_only = server
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        pidfd = None    # already gone
    except OSError:     # another pid namespace, no pidfd support: cannot wait
        return 0
    if pidfd is not None:
        import select

        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            if not poller.poll(timeout * 1000):
                print(f"logfs umount: {shown} is unmounted, but its logfs process {pid} has not finished its "
                      f"shutdown after {timeout:g} s; wait for it to exit before using {','.join(dirs)}",
                      file=sys.stderr)
                return 1
        finally:
            os.close(pidfd)
    missing = [d for d in dirs if not os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE))]
    if missing and not read_only:      # a read-only mount writes no marker
        print(f"logfs umount: {shown} is unmounted, but its logfs process exited without a clean shutdown "
              f"of {','.join(missing)} (see its log); the next mount will recover them", file=sys.stderr)
        return 1
    return 0


def _dump_log(args: argparse.Namespace) -> int:
    """kafka-dump-log.sh's listing on stdout, mismatches on stderr; exit 1 if any problem was seen."""
    from engine.tools import dump_log
    problems = dump_log(args.files, args.print_data_log, sys.stdout, sys.stderr)
    return 1 if problems else 0


def _check(args: argparse.Namespace) -> int:
    """One line per problem; exit 1 if any."""
    from engine.errors import LogfsError
    from engine.remote.check import check_remote_storage
    from engine.tools import check_dirs
    problems = check_dirs(args.dirs, sys.stdout)
    try:
        problems += check_remote_storage([os.path.abspath(d) for d in args.dirs], remote_storage_settings(args),
                                         sys.stdout)
    except (LogfsError, OSError) as exc:
        print(f"remote storage: cannot be checked: {exc}", file=sys.stdout)
        problems += 1
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(getattr(args, "sub_log_level", None) or args.log_level)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "mount": _mount, "umount": _umount, "dump-log": _dump_log, "check": _check,
        "to-kafka": lambda args: args.handler(args)}
    try:
        return handlers[args.command](args)
    except BrokenPipeError:   # `logfs dump-log ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
