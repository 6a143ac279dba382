"""The control-plane build is skipped exactly when nothing it reads has changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kanri.local.build import BINARY_NAME, _keep_in_cache, controlplane_binary, source_digest


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


def test_a_binary_built_before_on_this_machine_is_copied_not_rebuilt(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # main.go does not compile (no func main): only the cache can produce a binary here
    cache = tmp_path / "bin-cache"
    monkeypatch.setenv("KANRI_BIN_CACHE", str(cache))
    cache.mkdir()
    (cache / f"{BINARY_NAME}@{source_digest(source)[:24]}").write_bytes(b"built by another clone")
    out = tmp_path / "out"
    told: list[str] = []
    binary = controlplane_binary(source, out, on_build=told.append)
    assert binary.read_bytes() == b"built by another clone"
    assert (out / f"{BINARY_NAME}.sha256").read_text().strip() == source_digest(source)
    assert [line.split()[0] for line in told] == ["reused"]


def test_the_cache_keeps_one_control_plane(tmp_path: Path) -> None:
    built = tmp_path / "kanri-controlplane"
    built.write_bytes(b"new")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / f"{BINARY_NAME}@old").write_bytes(b"old")
    _keep_in_cache(built, tmp_path / "cache" / f"{BINARY_NAME}@new")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f"{BINARY_NAME}@new"]
