"""The SeaweedFS fixture of the tiered-storage tests (the server itself: devtools/seaweedfs.py)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import pytest

from devtools.seaweedfs import ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFS, weed_command

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

__all__ = ["ACCESS_KEY", "BUCKET", "SECRET_KEY", "SeaweedFS", "own_seaweedfs_server", "running_seaweedfs",
           "seaweedfs_server", "weed_command"]


@contextlib.contextmanager
def running_seaweedfs(path: Path) -> Iterator[SeaweedFS]:
    """A ``weed mini`` over ``path``, stopped at the end."""
    server = SeaweedFS(path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module", name="seaweedfs")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One ``weed mini`` for a test module (import this fixture into the module that uses it)."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(name="own_seaweedfs")
def own_seaweedfs_server(tmp_path: Path) -> Iterator[SeaweedFS]:
    """A ``weed mini`` of the test's own, for a test that kills, hangs or restarts its store (import this
    fixture into the module that uses it)."""
    with running_seaweedfs(tmp_path / "own-weed") as server:
        yield server
