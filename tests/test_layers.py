"""The layering the package keeps (docs/reference.md, "Layout"): packages import each other without a cycle (lazy
imports inside functions and type-only imports included), commands live in ``specledger/cli/`` only, no file over
500 lines and no function over 120."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "specledger"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 120


def _modules() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in PKG.rglob("*.py")}


def _unit(path: Path) -> str:
    """The package (or top-level module) a file belongs to: ``probe``, ``records`` ..."""
    return path.relative_to(PKG).parts[0].removesuffix(".py")


def _imported_units(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "specledger" and len(parts) > 1:
                out.add(parts[1])
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (as a path that returns to its start), or [] when it has none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str]:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        stack.pop()
        return []

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return []


def test_packages_import_each_other_without_a_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    for path, tree in _modules().items():
        graph[_unit(path)] |= _imported_units(tree) - {_unit(path), "__init__"}
    assert _cycle(graph) == []
    assert not graph["records"] - {"errors"}  # the ground floor imports nothing above it
    assert "cli" not in set().union(*(deps for unit, deps in graph.items() if unit != "cli"))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_commands_live_in_the_cli_package_only():
    outside = sorted(str(p.relative_to(PKG)) for p, tree in _modules().items()
                     if _unit(p) != "cli" and "typer" in _imported_units_any(tree))
    assert outside == []


def _imported_units_any(tree: ast.Module) -> set[str]:
    return {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_no_file_over_500_lines_and_no_function_over_120():
    long_files = [f"{p.relative_to(PKG)}: {n}" for p in sorted(PKG.rglob("*"))
                  if p.suffix in (".py", ".c", ".h", ".j2") and (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    long_functions = [f"{p.relative_to(PKG)}:{f.name}: {f.end_lineno - f.lineno + 1}"
                      for p, tree in _modules().items() for f in ast.walk(tree)
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert long_files == [] and long_functions == []
