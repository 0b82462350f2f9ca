"""The project stands on its own: its contract is docs/SPEC.md, and every citation of it points there.

Code, tests and docs cite the contract as ``SPEC §N``, ``SPEC section N`` or
``docs/SPEC.md section N`` (docs/SPEC.md says so at its top).  No tracked
file may point at a contract outside the repository (the directory the
project once shared with its first brief, or any other absolute or
``..`` path to a SPEC.md), and every cited section must exist.
"""

from __future__ import annotations

import re
import subprocess

from tests import ROOT

SPEC = ROOT / "docs" / "SPEC.md"

# Spelt in pieces so that this file does not match itself.
_OUTSIDE = re.compile("|".join((r"\.\./" + "shared", "/work/" + "shared", "shared/" + "SPEC")))
# A path in front of SPEC.md: it must be the repository's docs/ (or nothing: docs/DESIGN.md's sibling).
_SPEC_PATH = re.compile(r"([\w./~$-]*/)?SPEC\.md")
_ALLOWED_PREFIXES = {None, "docs/", "./", "../docs/"}
_SECTION_CITED = re.compile(r"\bSPEC(?:\.md)?\s*(?:§|sections?\s+)(\d+)")


def _tracked_texts() -> list[tuple[str, str]]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    texts = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue        # binary
        texts.append((name, data.decode("utf-8", "replace")))
    return texts


def _spec_sections() -> set[int]:
    return {int(m) for m in re.findall(r"^## (\d+)\. ", SPEC.read_text(), re.MULTILINE)}


def test_the_contract_is_in_the_repository_with_its_sections():
    text = SPEC.read_text()
    assert _spec_sections() == set(range(1, 11))
    assert "SPEC §N" in text.split("\n## ")[0], "docs/SPEC.md must say at its top how code cites it"
    assert "| situation | errno |" in text.split("## 7. Errors")[1], "§7 lists the errnos"


def test_no_tracked_file_points_outside_the_repository_for_the_contract():
    found = []
    for name, text in _tracked_texts():
        for lineno, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line) or any(match.group(1) not in _ALLOWED_PREFIXES
                                             for match in _SPEC_PATH.finditer(line)):
                found.append(f"{name}:{lineno}: {line.strip()}")
    assert not found, "cite docs/SPEC.md instead:\n" + "\n".join(found)


def test_every_cited_section_exists():
    sections = _spec_sections()
    wrong = [f"{name}:{lineno}: {line.strip()}"
             for name, text in _tracked_texts()
             for lineno, line in enumerate(text.splitlines(), 1)
             for number in _SECTION_CITED.findall(line)
             if int(number) not in sections]
    assert not wrong, "these cite a section docs/SPEC.md does not have:\n" + "\n".join(wrong)
