"""The images' pins (images/): the Debian lock matches the spec it was made from, and every Python tool pinned for
an image is locked by hash at exactly its pinned version (`make images-lock` rewrites them)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from kanri.images import debian

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"


def _definitions() -> dict[str, object]:
    return tomllib.loads((IMAGES / "images.toml").read_text())


def _spec() -> debian.DebianSpec:
    d = _definitions()["debian"]
    assert isinstance(d, dict)
    return debian.DebianSpec(d["suite"], d["sources"], d["include"], d["keep"], d["drop"],
                             d.get("path_exclude", []), d.get("path_include", []))  # fmt: skip


def test_the_debian_lock_was_made_from_the_current_spec() -> None:
    lock = debian.read_lock(IMAGES / "debian.lock")
    assert lock.spec_hash == debian.spec_hash(_spec()), "images.toml's [debian] changed: run `make images-lock`"


def test_every_package_an_image_needs_is_locked_with_a_version() -> None:
    lock = debian.read_lock(IMAGES / "debian.lock")
    spec = _spec()
    missing = [p for p in [*spec.include, *spec.keep] if p not in lock.packages]
    assert missing == []
    for single in ("pause", "pgbouncer"):  # the images made of one .deb's files
        section = _definitions()[single]
        assert isinstance(section, dict)
        version, sha = lock.debs[section["package"]]
        assert version
        assert re.fullmatch(r"[0-9a-f]{64}", sha)
    pgbouncer = _definitions()["pgbouncer"]
    assert isinstance(pgbouncer, dict)
    assert [p for p in pgbouncer["debian"] if p not in lock.packages] == []
    assert "postgresql-common" not in lock.packages  # pgbouncer's dependency is never installed


def test_the_lock_epoch_dates_every_file_and_is_a_real_day() -> None:
    lock = debian.read_lock(IMAGES / "debian.lock")
    assert lock.epoch % 86400 == 0
    assert lock.epoch > 1_700_000_000


def test_a_malformed_lock_line_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "debian.lock"
    bad.write_text("source-date-epoch: 1\nspec: x\nlibc6 2.36 extra\n")
    with pytest.raises(ValueError, match="expected 'package version'"):
        debian.read_lock(bad)


def test_the_lock_round_trips(tmp_path: Path) -> None:
    lock = debian.DebianLock(86400, {"libc6": "2.36-9+deb12u10"}, "abc", {"catatonit": ("0.1.7-1+b2", "0" * 64)})
    debian.write_lock(tmp_path / "l", lock)
    assert debian.read_lock(tmp_path / "l") == lock


def _pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.\[\]-]+)==(\S+)", path.read_text(), re.MULTILINE))


@pytest.mark.parametrize("name", ["barman", "seaweedfs", "valkey"])
def test_each_python_tool_is_locked_by_hash_at_its_pin(name: str) -> None:
    wanted = _pins(IMAGES / f"{name}.in")
    lock_text = (IMAGES / f"{name}.lock.txt").read_text()
    assert _pins(IMAGES / f"{name}.lock.txt") == wanted, f"run `make images-lock` ({name}.in changed)"
    for block in re.split(r"\n(?=\S)", lock_text.strip()):
        if block.startswith("#"):
            continue
        assert "--hash=sha256:" in block, f"no hash for {block.splitlines()[0]}"
