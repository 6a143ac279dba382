"""The architecture's arrows point down only (DESIGN.md): checked on every import statement of every module; and no
module of src/kanri imports itself back through others (a cycle), TYPE_CHECKING imports included.

The finer contracts (operators -> kit -> runtime, no operator imports another, no PostgreSQL concern imports the
reconciler) are import-linter's, in pyproject.toml, run by `make lint`; import-linter has no cycle contract."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "kanri"

# package -> kanri packages it may import (itself always allowed)
ALLOWED = {
    "contract": set(),
    "runtime": set(),
    "local": {"runtime"},
    "instance": {"contract"},
    "kit": {"runtime"},
    "postgres": {"kit", "runtime", "contract"},
}


def kanri_imports(path: Path) -> set[str]:
    """Top-level kanri packages imported by the module at ``path`` (``kanri.X...`` -> ``X``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "kanri" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(p for p in ALLOWED if (SRC / p).is_dir()))
def test_package_imports_only_the_layers_below_it(package: str) -> None:
    root = SRC / package
    violations = {
        str(path.relative_to(SRC)): sorted(bad)
        for path in sorted(root.rglob("*.py"))
        if (bad := kanri_imports(path) - ALLOWED[package] - {package})
    }
    assert violations == {}, f"kanri.{package} may import only {sorted(ALLOWED[package])}"


def test_the_checker_sees_imports_in_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import kanri.postgres.api\nfrom kanri.local import paths\nfrom . import sibling\nimport os\n")
    assert kanri_imports(module) == {"postgres", "local"}


def modules(root: Path) -> dict[str, Path]:
    """Every module under ``root`` (a folder holding top-level packages) by dotted name; a package by its own name."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` that the module ``name`` imports: ``from p import m`` counts as ``p.m`` when that is a
    module, else as ``p``; relative imports are resolved. Imports anywhere count (functions, TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    work: list[tuple[str, Iterator[str]]] = []  # the depth-first path: each node with the edges not yet followed

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(sorted(graph.get(node, ())))))

    for start in sorted(graph):
        if start in index:
            continue
        enter(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    enter(target)
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_module_of_kanri_imports_itself_back() -> None:
    known = modules(SRC.parent)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    found = [sorted(component) for component in cycles(graph)]
    assert found == [], "import cycles: break each with a Protocol, or move the shared part down a layer"


def test_the_cycle_check_finds_a_cycle_through_a_type_checking_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import B\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n")
    (package / "c.py").write_text("from . import a\n")
    (package / "d.py").write_text("import pkg.a\n")  # imports into the cycle, is not part of it
    known = modules(tmp_path)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]
