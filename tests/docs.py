"""The project's documentation as the doc tests read it: README.md and every docs/*.md.

The doc tests run what these files show (```console sessions, the Kafka procedures' ```sh blocks,
the Spark snippets) as written; this module finds the files, their console blocks and a section by
its heading, wherever the section lives.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tests import ROOT

if TYPE_CHECKING:
    from pathlib import Path

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6}) (.*?)\s*$")


def doc_files() -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def console_blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """[[(command, expected output lines), ...] per ```console block]."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", text, re.S):
        commands: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands:
                commands[-1][1].append(line)
        blocks.append(commands)
    return blocks


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of each Markdown heading outside fenced code."""
    found = []
    fenced = False
    for i, line in enumerate(text.splitlines()):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            found.append((i, len(m.group(1)), m.group(2)))
    return found


def doc_section(title: str) -> str:
    """The section headed ``title`` (any level), up to the next heading of its level or above, from
    whichever documentation file holds it; exactly one must."""
    sections = []
    for path in doc_files():
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        marks = headings(text)
        for n, (start, level, name) in enumerate(marks):
            if name == title:
                end = next((i for i, lv, _ in marks[n + 1:] if lv <= level), len(lines))
                sections.append("".join(lines[start:end]))
    assert len(sections) == 1, f"{len(sections)} sections titled {title!r} in README.md and docs/*.md"
    return sections[0]
