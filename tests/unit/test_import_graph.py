"""The import graph of ``engine/`` and ``logfs/`` has no cycle (issue 17).

A small checker over the source (``ast``; nothing is imported): every
``import`` and ``from ... import`` of one of our modules is an edge, at module
level and inside functions alike (a lazy import is still a dependency, only
hidden).  Imports under ``if TYPE_CHECKING:`` are left out: they never run, and
annotations naming a class of an upper floor are how a lower floor stays
ignorant of it.  ``from package import name`` is an edge to ``package.name``
when that is a module, else to the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import ROOT

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
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` that runs (any depth), skipping ``if TYPE_CHECKING:`` bodies."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of our packages it imports."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
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
                return stack[stack.index(target):] + [target]
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


def test_checker_sees_module_level_and_function_level_imports() -> None:
    graph = import_graph()
    assert "engine.errors" in graph["logfs.errors"]             # module level
    assert "engine.tools" in graph["logfs.cli"]                 # inside a function
    assert "engine.manager" not in graph["logfs.stats"]         # only under TYPE_CHECKING
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
