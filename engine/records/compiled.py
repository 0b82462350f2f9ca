"""The compiled kernels (``engine.records.kernels``) for request paths that must not wait for numba.

Loading the kernels costs a process about 0.9 s once (numba's import 0.5 s,
the first cached kernel 0.4 s; docs/performance.md, "Appending a file whole").  A background job
(the cleaner, the walk for transaction markers) imports them and waits.  A
request path (an append, a read of the text view) must not stall for that
on the first request of a mount, nor make every mount pay it at start when
most never need it: it asks :func:`kernels`, which answers the module once it
is loaded and otherwise starts loading it in a thread and answers None; the
caller then takes its Python path, which produces the same bytes.

The loading thread is not a daemon: a process that exits while it runs
waits for it (at most the load itself) rather than tear numba down midway.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType

__all__ = ["kernels", "state", "wait_loaded"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_loaded: ModuleType | None = None
_loader: threading.Thread | None = None
_failed = False


def kernels() -> ModuleType | None:
    """``engine.records.kernels`` once loaded; else None, and its load is started in the background."""
    if _loaded is not None:
        return _loaded
    global _loader
    with _lock:
        if _loader is None:
            _loader = threading.Thread(target=_load, name="kernel-loader")
            _loader.start()
    return None


def state() -> str:
    """``loaded``, ``loading``, ``failed`` or ``not loaded`` (the mount's ``.logfs/stats.json``)."""
    if _loaded is not None:
        return "loaded"
    if _failed:
        return "failed"
    return "not loaded" if _loader is None else "loading"


def wait_loaded(timeout: float | None = None) -> ModuleType | None:
    """Start the load if needed and wait for it (benchmarks, before they time anything; tests)."""
    kernels()
    loader = _loader
    if loader is not None:
        loader.join(timeout)
    return _loaded


def _load() -> None:
    global _loaded, _failed
    try:
        from engine.records import kernels as module
        module.load()
    except Exception:   # the Python paths still serve every request: say so once
        _failed = True
        log.exception("Loading the compiled record kernels failed; appends and reads keep to the Python paths")
        return
    _loaded = module
