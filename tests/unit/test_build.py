"""The control-plane build is skipped exactly when nothing it reads has changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kanri.local.build import source_digest


@pytest.fixture
def source(tmp_path: Path) -> Path:
    (tmp_path / "go.mod").write_text("module example\n")
    (tmp_path / "go.sum").write_text("")
    (tmp_path / "main.go").write_text("package main\n")
    (tmp_path / "hack").mkdir()
    (tmp_path / "hack" / "pin.sh").write_text("#!/bin/sh\n")
    return tmp_path


def test_digest_is_stable_when_nothing_changes(source: Path) -> None:
    assert source_digest(source) == source_digest(source)


@pytest.mark.parametrize("changed", ["main.go", "go.mod", "go.sum", "new.go"])
def test_digest_changes_with_any_build_input(source: Path, changed: str) -> None:
    before = source_digest(source)
    path = source / changed
    path.write_text((path.read_text() if path.exists() else "") + "// edit\n")
    assert source_digest(source) != before


@pytest.mark.parametrize("ignored", ["main_test.go", "hack/pin.sh", "README.md"])
def test_digest_ignores_files_the_build_does_not_read(source: Path, ignored: str) -> None:
    before = source_digest(source)
    (source / ignored).write_text("anything\n")
    assert source_digest(source) == before


def test_digest_depends_on_file_names_not_only_contents(source: Path) -> None:
    before = source_digest(source)
    (source / "main.go").rename(source / "other.go")
    assert source_digest(source) != before
