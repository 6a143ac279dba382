"""Reproducible image layers and OCI image layouts, written without a container daemon.

A layer is a tar whose entries are sorted by name, owned by numeric ids, and dated ``SOURCE_DATE_EPOCH``; it is
compressed by gzip with no name and a zero timestamp, so the same files give the same bytes, hence the same digests.
A layout is the OCI image-layout folder (``oci-layout``, ``index.json``, ``blobs/sha256/``) that skopeo, umoci,
cosign, crane and containerd read.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "INDEX",
    "LAYER_GZIP",
    "MANIFEST",
    "Blob",
    "Layer",
    "LayerBuilder",
    "blob_path",
    "canonical_json",
    "put_blob",
    "read_index",
    "write_compressed_layer",
]

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
GZIP_LEVEL = 6


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces: one byte string per value (a digest must not depend on dict order)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Blob:
    """A content-addressed blob: its OCI descriptor fields."""

    media_type: str
    digest: str
    size: int

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size, **extra}


@dataclass(frozen=True)
class Layer:
    """A compressed layer file and what a config and manifest say of it."""

    path: Path
    digest: str
    diff_id: str
    size: int
    uncompressed_size: int
    created_by: str

    @property
    def blob(self) -> Blob:
        return Blob(LAYER_GZIP, self.digest, self.size)


class _Hashing(io.RawIOBase):
    """A write-only stream that counts and hashes what passes through to ``target``."""

    def __init__(self, target: IO[bytes] | gzip.GzipFile | None) -> None:
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += len(view)
        if self.target is not None:
            self.target.write(view)
        return len(view)


@dataclass
class _Entry:
    info: tarfile.TarInfo
    source: Path | bytes | None


class LayerBuilder:
    """Collects a layer's entries, then writes them sorted, dated ``epoch`` and owned by numeric ids.

    Parent directories a path needs are added (root-owned, 0755) unless given. Files are read when written.
    """

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self._entries: dict[str, _Entry] = {}

    def _info(self, name: str, kind: bytes, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.strip("/"))
        info.type = kind
        info.mode = mode
        info.uid, info.gid = uid, gid
        info.uname = info.gname = ""
        info.mtime = self.epoch
        return info

    def directory(self, name: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        self._entries[name.strip("/")] = _Entry(self._info(name, tarfile.DIRTYPE, mode, uid, gid), None)

    def file(self, name: str, content: bytes | Path, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        info = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        info.size = len(content) if isinstance(content, bytes) else content.stat().st_size
        self._entries[name.strip("/")] = _Entry(info, content)

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777, 0, 0)
        info.linkname = target
        self._entries[name.strip("/")] = _Entry(info, None)

    def tree(self, source: Path, dest: str, uid: int = 0, gid: int = 0, skip: Iterable[str] = ()) -> None:
        """Everything under ``source`` at ``dest``: modes kept (made world-readable), symlinks kept, hard links
        as copies; names in ``skip`` (any path component) left out."""
        skipped = set(skip)
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source)
            if skipped.intersection(relative.parts):
                continue
            name = f"{dest.rstrip('/')}/{relative.as_posix()}"
            if path.is_symlink():
                self.symlink(name, os.readlink(path))
            elif path.is_dir():
                self.directory(name, 0o755, uid, gid)
            else:
                executable = path.stat().st_mode & 0o111
                self.file(name, path, 0o755 if executable else 0o644, uid, gid)

    def _with_parents(self) -> list[str]:
        names = set(self._entries)
        for name in list(names):
            parts = name.split("/")
            for cut in range(1, len(parts)):
                parent = "/".join(parts[:cut])
                if parent not in self._entries:
                    self.directory(parent)
        return sorted(self._entries)

    def write(self, out: IO[bytes]) -> None:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in self._with_parents():
                entry = self._entries[name]
                if isinstance(entry.source, Path):
                    with entry.source.open("rb") as handle:
                        tar.addfile(entry.info, handle)
                elif isinstance(entry.source, bytes):
                    tar.addfile(entry.info, io.BytesIO(entry.source))
                else:
                    tar.addfile(entry.info)


def write_compressed_layer(target: Path, write_tar: Any, created_by: str) -> Layer:
    """Runs ``write_tar(stream)`` into ``target`` gzip-compressed (no name, time 0); returns the layer's digests."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as raw:
        compressed = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=compressed, mtime=0) as gz:
            uncompressed = _Hashing(gz)
            write_tar(uncompressed)
    partial.rename(target)
    return Layer(
        path=target,
        digest=f"sha256:{compressed.sha.hexdigest()}",
        diff_id=f"sha256:{uncompressed.sha.hexdigest()}",
        size=compressed.size,
        uncompressed_size=uncompressed.size,
        created_by=created_by,
    )


def blob_path(layout: Path, digest: str) -> Path:
    algorithm, hexdigest = digest.split(":", 1)
    return layout / "blobs" / algorithm / hexdigest


def put_blob(layout: Path, media_type: str, content: bytes | Path) -> Blob:
    """Stores ``content`` in the layout (a file is hard-linked when it can be: the cache's layers are large)."""
    if isinstance(content, bytes):
        digest = f"sha256:{hashlib.sha256(content).hexdigest()}"
        size = len(content)
    else:
        sha = hashlib.sha256()
        with content.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
        digest, size = f"sha256:{sha.hexdigest()}", content.stat().st_size
    target = blob_path(layout, digest)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            try:
                os.link(content, target)
            except OSError:
                shutil.copyfile(content, target)
    return Blob(media_type, digest, size)


def read_index(layout: Path) -> dict[str, Any]:
    index: dict[str, Any] = json.loads((layout / "index.json").read_text())
    return index


def iter_blobs(layout: Path) -> Iterator[Path]:
    yield from sorted((layout / "blobs" / "sha256").glob("*"))
