"""The architecture's arrows point down only (DESIGN.md): checked on every import statement of every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "kanri"

# package -> kanri packages it may import (itself always allowed)
ALLOWED = {
    "contract": set(),
    "runtime": set(),
    "local": {"runtime"},
    "instance": {"contract"},
    "postgres": {"runtime", "contract"},
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
