"""Everyday use through a real mount (issue 16): config files that round-trip, any key separator, signals.

Each test drives the mount with the tools a user would (bash redirections,
``cat``, editors) and checks what a user would see.
"""

from __future__ import annotations

import json


from tests.conftest import Mount


def overrides(mount: Mount, topic: str = "t") -> list[str]:
    """The override lines of ``<topic>/config`` (the defaults are ``#`` comments)."""
    return [line for line in (mount / topic / "config").read_text().splitlines() if not line.startswith("#")]


def test_a_space_is_a_key_separator(mount):
    mount.sh("mkdir t && printf 'parse.key=true\\nkey.separator= \\n' > t/config")
    assert "key.separator= " in overrides(mount)
    mount.sh("echo 'user-1 logged in' >> t/0/append")
    record = json.loads(mount.sh("cat t/0/records.jsonl").stdout)
    assert (record["key"], record["value"]) == ("user-1", "logged in")


def test_config_written_back_keeps_what_is_an_override(mount, tmp_path):
    """``cat config > x; edit x; cat x > config`` changes what was edited, nothing else becomes an override."""
    mount.sh("mkdir t && echo retention.ms=3600000 > t/config && echo cleanup.policy=compact >> t/config")
    assert overrides(mount) == ["cleanup.policy=compact", "retention.ms=3600000"]
    copy = tmp_path / "config"
    mount.sh(f"cat t/config > {copy} && sed -i 's/^retention.ms=.*/retention.ms=7200000/' {copy} "
             f"&& cat {copy} > t/config")
    assert overrides(mount) == ["cleanup.policy=compact", "retention.ms=7200000"]
    mount.sh("echo segment.ms=60000 >> t/config")                    # >> adds an override
    assert len(overrides(mount)) == 3
    mount.sh("echo segment.ms=60000 > t/config")                     # > replaces the set of overrides
    assert overrides(mount) == ["segment.ms=60000"]
    mount.sh("vim -es -c 'g/^segment.ms=/s/60000/120000/' -c wq t/config")    # an editor's save
    assert overrides(mount) == ["segment.ms=120000"]
    assert "#retention.ms=604800000\n" in (mount / "t/config").read_text()    # a default again
