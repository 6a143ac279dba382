"""Build the control-plane binary from ``controlplane/`` when, and only when, its sources changed."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from kanri.local import paths

BINARY_NAME = "kanri-controlplane"


class BuildError(RuntimeError):
    """The Go build failed or Go is missing; the message carries the compiler's output."""


def source_digest(source: Path) -> str:
    """Hash of everything the build reads from ``source``, plus the Go toolchain version."""
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file() and _is_build_input(p)):
        digest.update(str(path.relative_to(source)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    digest.update(_go_version().encode())
    return digest.hexdigest()


def _is_build_input(path: Path) -> bool:
    return path.name in {"go.mod", "go.sum"} or (path.suffix == ".go" and not path.name.endswith("_test.go"))


def _go_version() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("the Go toolchain (`go`) is not on PATH; it is needed to build the control plane")
    return subprocess.run([go, "version"], check=True, capture_output=True, text=True).stdout.strip()


def controlplane_binary(
    source: Path | None = None,
    out_dir: Path | None = None,
    *,
    on_build: Callable[[str], None] | None = None,
) -> Path:
    """Return the path of an up-to-date control-plane binary, building it first if its sources changed.

    The build is CGO-free and written atomically; concurrent callers wait on a lock instead of building twice.
    ``on_build`` is told when a (slow, possibly cold) build starts.
    """
    source = source or paths.source_root() / "controlplane"
    out_dir = out_dir or paths.build_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / BINARY_NAME
    stamp = out_dir / f"{BINARY_NAME}.sha256"
    with (out_dir / f"{BINARY_NAME}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        digest = source_digest(source)
        if binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
            return binary
        cached = _cache_entry(digest)
        if cached.is_file():  # built before on this machine (another clone): copied, not relinked
            tmp = out_dir / f".{BINARY_NAME}.tmp"
            shutil.copy2(cached, tmp)
            tmp.replace(binary)
            stamp.write_text(digest + "\n")
            if on_build:
                on_build(f"reused {BINARY_NAME} built before on this machine ({cached})")
            return binary
        if on_build:
            on_build(f"building {BINARY_NAME} from {source} (a cold build takes several minutes)")
        started = time.monotonic()
        tmp = out_dir / f".{BINARY_NAME}.tmp"
        env = {**os.environ, "CGO_ENABLED": "0"}
        result = subprocess.run(
            ["go", "build", "-trimpath", "-o", str(tmp), "."],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise BuildError(f"go build failed in {source}:\n{result.stderr[-8000:]}")
        tmp.replace(binary)
        stamp.write_text(digest + "\n")
        _keep_in_cache(binary, cached)
        if on_build:
            on_build(f"built {binary} in {time.monotonic() - started:.0f}s")
        return binary


def bin_cache() -> Path:
    """The machine-wide cache of built binaries (hack/bincache.sh keeps the Go tools there too): ``KANRI_BIN_CACHE``,
    else ``$XDG_CACHE_HOME/kanri/bin``, else ``~/.cache/kanri/bin``. A fresh clone copies the control plane from it
    instead of relinking it (about 27 s of every clean-clone CI run)."""
    if env := os.environ.get("KANRI_BIN_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kanri" / "bin"


def _cache_entry(digest: str) -> Path:
    return bin_cache() / f"{BINARY_NAME}@{digest[:24]}"


def _keep_in_cache(binary: Path, entry: Path) -> None:
    """Store ``binary`` as ``entry``, replacing older builds (one control plane per machine: each is ~200 MB)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        for old in entry.parent.glob(f"{BINARY_NAME}@*"):
            if old != entry:
                old.unlink(missing_ok=True)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}")
        shutil.copy2(binary, tmp)
        tmp.replace(entry)
    except OSError:  # a cache that cannot be written only costs the next clone a build
        pass
