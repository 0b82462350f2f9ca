"""Every relative link of README.md and docs/*.md names a file that exists and, after ``#``, one of its headings.

The README is a front page linking the docs, and the docs link each other by heading: a section moved or
renamed must not leave a link pointing at nothing.  Anchors are GitHub's: the heading in lower case,
punctuation other than ``-`` and ``_`` dropped, spaces as ``-``, a repeated heading suffixed ``-1``, ``-2``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from tests.docs import ROOT, doc_files, headings

if TYPE_CHECKING:
    from pathlib import Path

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, _, title in headings(path.read_text()):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: Path) -> list[tuple[int, str]]:
    found = []
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            found += [(number, target) for target in _LINK.findall(re.sub(r"`[^`]*`", "", line))]
    return found


def test_the_anchor_rule_is_githubs() -> None:
    assert "coming-from-kafka--moving-to-kafka" in _anchors(ROOT / "docs/kafka.md")
    assert "a-secured-cluster-sasl-tls-the-password-in-a-file" in _anchors(ROOT / "docs/cluster.md")
    assert "cleaner-beside-kafkas" in _anchors(ROOT / "docs/performance.md")


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_name_a_file_and_heading_that_exist(doc: Path) -> None:
    broken = []
    for number, target in _links(doc):
        if re.match(r"[a-z]+:", target):
            continue                # http(s), mailto: not this test's business
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists():
            broken.append(f"{doc.name}:{number}: {target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{doc.name}:{number}: {target}: no heading #{anchor} in {path.name}")
    assert not broken, "\n".join(broken)
