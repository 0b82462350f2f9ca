"""The compiled kernels (``engine.records.kernels``, a C extension) when built, for the paths that use them.

The extension is built with the package (``scripts/setup.sh``: ``pip install
-e .``) and loads with this module, in well under a millisecond.  Where it is
not built (a checkout run without its install step) :data:`KERNELS` is None,
one warning says so, and every caller takes its Python path, which produces
the same bytes, only slower.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["KERNELS", "state"]

log = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    try:
        from engine.records import kernels as module
    except ImportError as e:
        log.warning("The compiled record kernels are not built (%s; run scripts/setup.sh): appends, reads and "
                    "the log cleaner keep to the Python paths", e)
        return None
    return module


#: ``engine.records.kernels``, or None when its C extension is not built
KERNELS: ModuleType | None = _load()


def state() -> str:
    """``loaded`` or ``not built`` (the mount's ``.logfs/stats.json``)."""
    return "loaded" if KERNELS is not None else "not built"
