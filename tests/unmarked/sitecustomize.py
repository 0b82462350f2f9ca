"""Python processes started by a test without the ``mount`` or ``spark`` marker refuse to start those.

tests/markers.py puts this directory first on ``PYTHONPATH`` while such a test runs; Python imports
this module at start-up.  ``pyfuse3.init`` (every FUSE mount: ``logfs mount``, the power-loss layer)
and PySpark's JVM gateway are replaced, as their modules load, by a function that exits naming the
test and the marker it lacks.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

REFUSES = set(filter(None, os.environ.get("LOGFS_TEST_REFUSES", "").split(",")))
#: module -> (attribute to refuse, the marker it needs)
GUARDED = {"pyfuse3": ("init", "mount"), "pyspark.java_gateway": ("launch_gateway", "spark")}


def _refuse(marker: str, what: str):
    def refused(*args: object, **kwargs: object) -> None:
        sys.stderr.write(f"refused: {os.environ.get('LOGFS_TEST_ID', 'a test')} starts {what} but is not marked "
                         f"@pytest.mark.{marker} (tests/markers.py)\n")
        sys.stderr.flush()
        os._exit(97)
    return refused


class _Guard(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    _loaders: dict[str, importlib.abc.Loader]

    def find_spec(self, name, path=None, target=None):
        if name not in GUARDED or GUARDED[name][1] not in REFUSES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        self._loaders = getattr(self, "_loaders", {})
        self._loaders[name] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec) -> ModuleType | None:
        return self._loaders[spec.name].create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loaders[module.__name__].exec_module(module)
        attribute, marker = GUARDED[module.__name__]
        setattr(module, attribute, _refuse(marker, f"{module.__name__}.{attribute}"))


if REFUSES & {"mount", "spark"}:
    sys.meta_path.insert(0, _Guard())
