"""The import graph of ``engine/`` and ``logfs/`` has no cycle (issues 17 and 27).

A small checker over the source (``ast``; nothing is imported): every
``import`` and ``from ... import`` of one of our modules is an edge, at module
level and inside functions alike (a lazy import is still a dependency, only
hidden), and under ``if TYPE_CHECKING:`` too (issue 27): a type-only import
never runs, but it is still a dependency of the code's meaning, and a circle
of them is a circle of modules that cannot be understood apart.  Where a lower
module needs a type of an upper one only for annotations, it states what it
needs as a small ``Protocol`` of its own instead.  ``from package import
name`` is an edge to ``package.name`` when that is a module, else to the
package.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from tests import ROOT

if TYPE_CHECKING:
    from pathlib import Path

PACKAGES = ("engine", "logfs")


def module_files() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of our packages."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
        for path in sorted((ROOT / package).rglob("*.c")):     # a C extension (setup.py): imports none of ours
            modules[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    return modules


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, ``if TYPE_CHECKING:`` bodies included."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of our packages it imports."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        if path.suffix == ".c":
            continue
        for stmt in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(stmt, ast.Import):
                targets = [alias.name for alias in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    anchor = name.split(".")
                    if not is_package:
                        anchor = anchor[:-1]
                    anchor = anchor[:len(anchor) - (stmt.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in stmt.names]
            for target in targets:
                while target and target not in modules:     # `import engine.x.y` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for target in sorted(graph[node]):
            if colour[target] == GREY:
                return [*stack[stack.index(target):], target]
            if colour[target] == WHITE:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            cycle = visit(node)
            if cycle is not None:
                return cycle
    return None


def cycle_within(package: str) -> list[str] | None:
    """One import cycle among the modules of ``package`` (type-only imports counted), or None."""
    graph = import_graph()
    inside = {name for name in graph if name == package or name.startswith(package + ".")}
    return find_cycle({name: graph[name] & inside for name in inside})


def test_checker_sees_module_level_function_level_and_type_only_imports() -> None:
    graph = import_graph()
    assert "engine.errors" in graph["logfs.errors"]             # module level
    assert "engine.tools" in graph["logfs.cli"]                 # inside a function
    assert "engine.manager" in graph["logfs.stats"]             # only under TYPE_CHECKING: counted
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_under_type_checking_are_counted() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.b import B\n")
    assert [stmt.module for stmt in _imports(tree) if isinstance(stmt, ast.ImportFrom)] == ["typing", "engine.b"]


def test_engine_does_not_import_logfs() -> None:
    """The engine knows nothing of the filesystem; so a cycle, if any, lies within one package."""
    graph = import_graph()
    assert not {(name, target) for name, targets in graph.items() if name.startswith("engine")
                for target in targets if target.startswith("logfs")}


def test_no_import_cycle_in_engine() -> None:
    cycle = cycle_within("engine")
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_in_logfs() -> None:
    cycle = cycle_within("logfs")
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])



def test_kafka_core_does_not_import_the_views() -> None:
    """The log, its segments and the cleaner know nothing of the mount's renderings (engine.views): a
    segment keeps the view layer's index only as a ``SegmentAttachment``."""
    graph = import_graph()
    core = [name for name in graph if name in ("engine.log", "engine.local_log", "engine.segment",
                                               "engine.transactions") or name.startswith("engine.cleaner")]
    assert "engine.segment" in core
    assert "engine.cleaner.cleaner" in core
    assert not {(name, target) for name in core for target in graph[name] if target.startswith("engine.views")}


def test_scripts_and_devtools_import_no_test_module() -> None:
    """The benchmarks and scripts, and devtools/ (what they share with the tests), import nothing of tests/."""
    found = []
    for folder in ("scripts", "devtools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for stmt in _imports(ast.parse(path.read_text(), str(path))):
                names = [alias.name for alias in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
                found += [f"{path.relative_to(ROOT)}: {name}" for name in names
                          if name == "tests" or name.startswith("tests.")]
    assert not found
