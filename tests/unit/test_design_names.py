"""docs/DESIGN.md is true of the code: every ``Class.member`` it names exists.

The names are read from the code's syntax (``ast``), not by importing it:
a member is a method, a class-level name or annotation, a ``__slots__`` entry
or an attribute some method assigns on ``self``, of the class or of a base
class named in the tree.  Kafka's Java classes and members (camelCase),
which DESIGN.md cites for comparison, are left out.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
#: Kafka's own classes, named for comparison (their members are Kafka's, not ours)
KAFKA_CLASSES = {"Utils", "FileChannel", "LeaderEpochFileCache", "MemoryRecords", "UnifiedLog", "LocalLog",
                 "ReplicaFetcherThread", "AbstractFetcherThread",
                 "ReplicaManager", "RemoteLogManager", "ProducerStateManager", "KafkaApis"}
#: a camelCase member is Kafka's Java name for what the class does here (``LogManager.loadLogs``)
JAVA_MEMBER = re.compile(r"[a-z]+[A-Z][A-Za-z0-9]*")
NAME = re.compile(r"`([A-Z][A-Za-z0-9]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:\(\))?`")


def _members(node: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found.add(item.target.id)
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                if isinstance(target, ast.Name):
                    found.add(target.id)
                    if target.id == "__slots__" and isinstance(item.value, (ast.Tuple, ast.List)):
                        found.update(e.value for e in item.value.elts
                                     if isinstance(e, ast.Constant) and isinstance(e.value, str))
    for sub in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
            targets = [sub.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id == "self":
                found.add(target.attr)
    return found


@cache
def _classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Class name → (its members, the names of its bases), for every class of engine/ and logfs/."""
    classes: dict[str, list[tuple[set[str], list[str]]]] = {}
    for package in ("engine", "logfs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else b.attr
                             for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))]
                    classes.setdefault(node.name, []).append((_members(node), bases))
    return classes


def _has(cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
    for members, bases in _classes().get(cls, []):
        if member in members:
            return True
        if any(_has(base, member, seen | {cls}) for base in bases if base not in seen):
            return True
    return False


def test_design_names_only_members_that_exist() -> None:
    named = sorted({(m.group(1), m.group(2)) for m in NAME.finditer(DESIGN.read_text())
                    if m.group(1) not in KAFKA_CLASSES and not JAVA_MEMBER.fullmatch(m.group(2))})
    assert len(named) > 20, "DESIGN.md should name the code it maps"
    unknown_classes = sorted({cls for cls, _ in named if cls not in _classes()})
    missing = [f"{cls}.{member}" for cls, member in named if cls in _classes() and not _has(cls, member)]
    assert not unknown_classes, f"docs/DESIGN.md names classes the code does not define: {unknown_classes}"
    assert not missing, f"docs/DESIGN.md names members the code does not define: {missing}"


def test_the_check_finds_a_missing_member() -> None:
    assert _has("LogManager", "get_or_create_log")
    assert not _has("LogManager", "no_such_method")
    assert _has("EmbeddedBackend", "produce_config")  # inherited from LocalLogs
