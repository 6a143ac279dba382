"""Image layers are reproducible (same files → same digests, whatever their dates or the order they were made in),
the base layer keeps exactly the closure of what the processes need, and a changed blob is detected."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from kanri.images import debian, layers
from kanri.images.oci import LayerBuilder, put_blob, write_compressed_layer
from kanri.images.signing import VerificationError, check_blobs

EPOCH = 1_796_515_200


def _tree(root: Path, order: list[str], mtime: int) -> Path:
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {name}\n")
        os.utime(path, (mtime, mtime))
    return root


def _layer(source: Path, target: Path) -> str:
    def write(out: io.RawIOBase) -> None:
        layer = LayerBuilder(EPOCH)
        layer.tree(source, "opt/x")
        layer.write(out)  # type: ignore[arg-type]

    return write_compressed_layer(target, write, "test").digest


def test_the_same_files_give_the_same_digest_whatever_their_dates_and_order(tmp_path: Path) -> None:
    first = _tree(tmp_path / "a", ["b/z.txt", "a.txt", "b/c/d.txt"], 1_000)
    second = _tree(tmp_path / "b", ["b/c/d.txt", "a.txt", "b/z.txt"], 2_000_000_000)
    assert _layer(first, tmp_path / "1.tar.gz") == _layer(second, tmp_path / "2.tar.gz")
    (second / "a.txt").write_text("changed\n")
    assert _layer(first, tmp_path / "3.tar.gz") != _layer(second, tmp_path / "4.tar.gz")


def test_entries_are_sorted_dated_and_owned_by_numbers_with_their_parents(tmp_path: Path) -> None:
    layer = LayerBuilder(EPOCH)
    layer.file("usr/local/bin/tool", b"#!/bin/sh\n", mode=0o755)
    layer.directory("home/kanri", 0o700, 65532, 65532)
    out = io.BytesIO()
    layer.write(out)
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) == ["home", "home/kanri", "usr", "usr/local", "usr/local/bin", "usr/local/bin/tool"]
    assert {m.mtime for m in members} == {EPOCH}
    assert {(m.uname, m.gname) for m in members} == {("", "")}
    home = members[1]
    assert (home.uid, home.mode) == (65532, 0o700)


STATUS = """\
Package: python3
Version: 3.11.2-1+b1
Depends: libc6 (>= 2.36), mawk | awk, libpython3-stdlib (= 3.11.2-1+b1)
Pre-Depends: dpkg (>= 1.17)

Package: libc6
Version: 2.36-9
Description: GNU C Library
 continuation line

Package: mawk
Version: 1.3.4
Provides: awk

Package: libpython3-stdlib
Version: 3.11.2-1+b1

Package: dpkg
Version: 1.21.22
Depends: tar

Package: tar
Version: 1.34
"""


def test_the_closure_follows_depends_provides_and_never_takes_a_dropped_package() -> None:
    stanzas = debian.parse_status(STATUS)
    assert debian.closure(stanzas, ["python3"], ["dpkg"]) == {"python3", "libc6", "mawk", "libpython3-stdlib"}
    assert "tar" in debian.closure(stanzas, ["python3"], [])


def _rootfs(path: Path) -> Path:
    files = {
        "./var/lib/dpkg/status": STATUS.encode(),
        "./var/lib/dpkg/info/dpkg.list": b"/.\n/usr\n/usr/bin\n/usr/bin/dpkg\n",
        "./var/lib/dpkg/info/dpkg.postinst": b"#!/bin/sh\n",
        "./var/lib/dpkg/info/python3.list": b"/.\n/usr\n/usr/bin\n/usr/bin/python3\n",
        "./var/lib/dpkg/info/mawk.list": b"/usr/bin/mawk\n",
        "./usr/bin/mawk": b"ELF mawk",
        "./var/lib/dpkg/info/tar.list": b"/bin/tar\n/usr/sbin/rmt-tar\n",
        "./usr/bin/dpkg": b"ELF dpkg",
        "./usr/bin/python3": b"ELF python",
        "./usr/bin/tar": b"ELF tar",
        "./usr/sbin/rmt-tar": b"ELF rmt",
        # made by tar's maintainer scripts, listed by no package: its alternative and a generated file
        "./var/lib/dpkg/alternatives/rmt": b"auto\n/usr/sbin/rmt\n",
        "./etc/tar/generated.conf": b"made by a postinst",
        "./etc/passwd": b"root:x:0:0:root:/root:/bin/bash\n",
        "./etc/group": b"root:x:0:\n",
        "./var/cache/apt/pkgcache.bin": b"cache",
    }
    with tarfile.open(path, "w") as tar:
        for directory in ("./", "./usr/", "./usr/bin/", "./etc/", "./var/", "./var/cache/", "./var/cache/apt/"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = EPOCH + 100
            tar.addfile(info, io.BytesIO(data))
        # /usr/sbin/rmt → /etc/alternatives/rmt → rmt-tar (tar's); /usr/bin/awk → mawk's alternative (base's)
        links = {"./usr/sbin/rmt": "/etc/alternatives/rmt", "./etc/alternatives/rmt": "../../usr/sbin/rmt-tar",
                 "./usr/bin/awk": "/etc/alternatives/awk", "./etc/alternatives/awk": "/usr/bin/mawk"}  # fmt: skip
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def test_the_base_layer_drops_the_package_tools_and_says_so_in_the_status_file(tmp_path: Path) -> None:
    out = io.BytesIO()
    users = [debian.User("postgres", 26, "/var/lib/postgresql")]
    kept = debian.write_base_layer(_rootfs(tmp_path / "r.tar"), ["python3"], ["dpkg"], users, EPOCH, out)
    assert kept == ["libc6", "libpython3-stdlib", "mawk", "python3"]
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        names = tar.getnames()
        status = debian.parse_status(tar.extractfile("./var/lib/dpkg/status").read().decode())  # type: ignore[union-attr]
        passwd = tar.extractfile("./etc/passwd").read().decode()  # type: ignore[union-attr]
        assert {m.mtime for m in tar.getmembers()} == {EPOCH}
    assert "./usr/bin/python3" in names
    assert "./usr/bin/dpkg" not in names
    assert "./usr/bin/tar" not in names
    assert "./var/lib/dpkg/info/dpkg.list" not in names
    assert "./var/lib/dpkg/info/dpkg.postinst" not in names
    assert "./var/cache/apt/pkgcache.bin" not in names
    assert [s["Package"] for s in status] == ["python3", "libc6", "mawk", "libpython3-stdlib"]
    assert status[1]["Description"] == "GNU C Library\n continuation line"
    assert "postgres:x:26:26:postgres:/var/lib/postgresql:/usr/sbin/nologin" in passwd
    assert "var/lib/postgresql" in names


def test_a_blob_with_one_byte_changed_fails_the_layout_check(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    blob = put_blob(layout, "application/octet-stream", b"layer bytes")
    (layout / "index.json").write_text(f'{{"manifests": [{{"digest": "{blob.digest}", "size": {blob.size}}}]}}')
    check_blobs(layout)
    path = layout / "blobs" / "sha256" / blob.digest.split(":")[1]
    path.write_bytes(b"layer bytez")
    with pytest.raises(VerificationError, match="does not match"):
        check_blobs(layout)


def test_a_package_layer_adds_only_what_the_base_lacks_and_a_status_listing_both(tmp_path: Path) -> None:
    out = io.BytesIO()
    added = debian.write_package_layer(_rootfs(tmp_path / "r.tar"), ["python3"], ["tar"], ["dpkg"], EPOCH, out)
    assert added == ["tar"]
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        names = set(tar.getnames())
        status = debian.parse_status(tar.extractfile("./var/lib/dpkg/status").read().decode())  # type: ignore[union-attr]
    assert "./usr/bin/tar" in names
    assert "./var/lib/dpkg/info/tar.list" in names
    assert "./usr/bin/python3" not in names  # the base layer's
    assert "./usr/bin/dpkg" not in names
    assert [s["Package"] for s in status] == ["python3", "libc6", "mawk", "libpython3-stdlib", "tar"]


def test_links_scripts_made_and_generated_files_go_with_their_package_s_layer(tmp_path: Path) -> None:
    rootfs = _rootfs(tmp_path / "r.tar")
    generated = ["/etc/tar/*"]
    base, layer = io.BytesIO(), io.BytesIO()
    debian.write_base_layer(rootfs, ["python3"], ["dpkg"], [], EPOCH, base, elsewhere=generated)
    debian.write_package_layer(rootfs, ["python3"], ["tar"], ["dpkg"], EPOCH, layer, generated=generated)
    moved = {"./usr/sbin/rmt", "./etc/alternatives/rmt", "./var/lib/dpkg/alternatives/rmt", "./etc/tar/generated.conf"}
    base.seek(0)
    with tarfile.open(fileobj=base) as tar:
        base_names = set(tar.getnames())
    layer.seek(0)
    with tarfile.open(fileobj=layer) as tar:
        layer_names = set(tar.getnames())
    assert moved & base_names == set()  # nothing dangling below the package
    assert moved <= layer_names
    assert {"./usr/bin/awk", "./etc/alternatives/awk", "./usr/bin/mawk"} <= base_names  # the base's own alternative
    assert "./usr/bin/awk" not in layer_names


def test_a_package_s_top_level_lib_goes_under_usr_and_never_replaces_the_base_s_link(tmp_path: Path) -> None:
    """pgbouncer's .deb ships /lib/systemd/system/: as a real lib/ folder in a layer it hid the base's ``lib ->
    usr/lib`` link, and with it the dynamic loader (``exec /usr/bin/python3: no such file or directory``)."""
    root = tmp_path / "root"
    (root / "lib" / "systemd" / "system").mkdir(parents=True)
    (root / "lib" / "systemd" / "system" / "x.service").write_text("unit\n")
    (root / "usr" / "lib" / "x").mkdir(parents=True)
    (root / "usr" / "sbin").mkdir(parents=True)
    (root / "usr" / "sbin" / "prog").write_text("binary\n")
    layers.merge_usr(root)
    assert not (root / "lib").exists()
    assert (root / "usr" / "lib" / "systemd" / "system" / "x.service").read_text() == "unit\n"
    assert (root / "usr" / "lib" / "x").is_dir()
    assert (root / "usr" / "sbin" / "prog").read_text() == "binary\n"
