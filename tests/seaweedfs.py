"""The SeaweedFS fixture of the tiered-storage tests (the server itself: devtools/seaweedfs.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from devtools.seaweedfs import ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFS, weed_command

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["ACCESS_KEY", "BUCKET", "SECRET_KEY", "SeaweedFS", "seaweedfs_server", "weed_command"]


@pytest.fixture(scope="module", name="seaweedfs")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One ``weed mini`` for a test module (import this fixture into the module that uses it)."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield server
    finally:
        server.stop()
