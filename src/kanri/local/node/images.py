"""The image map: which local program stands for which container image.

There is no image registry and no container engine on the local node, so an explicit map says what to run. Each
entry names an ``image`` — an exact reference, or a shell-style glob (``fnmatch``: ``*``, ``?``, ``[...]``) such as
``kanri.dev/test/*`` — and the program that image stands for: ``command`` (the image's ENTRYPOINT), optional
``args`` (its CMD), ``workingDir``, ``env`` (the image's own environment), ``users`` (its ``/etc/passwd``
entries) and ``paths`` (the host directories that stand for the image's own files, bound read-only into the
container's root at the same place: an install whose programs read data beside them, such as PostgreSQL's
``share/``, which no command line or environment value names). Exact entries win over globs; among
globs the first listed wins.

The map comes from a YAML or JSON file (``NodeOptions.image_map_file``: a list of entries, or ``{"images": [...]}``)
plus entries given in code (``NodeOptions.images``), which come first.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]


@dataclass(frozen=True)
class ImageEntry:
    """One mapped image: the program and defaults it stands for."""

    image: str
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    working_dir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    users: tuple[Mapping[str, Any], ...] = ()
    """The image's own users (``{name, uid, gid, home}``), added to the container's ``/etc/passwd`` and
    ``/etc/group`` when the host lacks them — an image's ``USER 26`` has a name inside the image."""
    paths: tuple[str, ...] = ()
    """Absolute host directories the image's files live in, bound read-only at the same place (besides those the
    command line and environment name: :func:`kanri.local.node.rootfs.named_paths`)."""

    @property
    def is_glob(self) -> bool:
        return any(c in self.image for c in "*?[")

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ImageEntry:
        """An entry from its config form; raises ValueError naming what is wrong."""
        image = raw.get("image")
        command = raw.get("command")
        if not isinstance(image, str) or not image:
            raise ValueError(f"image map entry without an image: {dict(raw)!r}")
        if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
            raise ValueError(f"image map entry {image!r}: command must be a non-empty list of strings")
        args = raw.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"image map entry {image!r}: args must be a list of strings")
        env = raw.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError(f"image map entry {image!r}: env must be a mapping")
        working_dir = raw.get("workingDir")
        users = raw.get("users") or []
        if not isinstance(users, list) or not all(isinstance(u, dict) and "name" in u and "uid" in u for u in users):
            raise ValueError(f"image map entry {image!r}: users must be a list of {{name, uid[, gid, home]}}")
        paths = raw.get("paths") or []
        if not isinstance(paths, list) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
            raise ValueError(f"image map entry {image!r}: paths must be a list of absolute paths")
        return cls(image, tuple(command), tuple(args), str(working_dir) if working_dir else None,
                   {str(k): str(v) for k, v in env.items()}, tuple(users), tuple(paths))  # fmt: skip


class ImageMap:
    """Looks images up; see the module docstring for the rules."""

    def __init__(self, entries: Iterable[ImageEntry], source: Path | None = None) -> None:
        self.entries = list(entries)
        self.source = source
        """The config file the map was read from (named in ``ImageNotMapped`` messages)."""

    @classmethod
    def load(cls, path: Path | None, extra: Sequence[Mapping[str, Any]] = ()) -> ImageMap:
        """``extra`` entries (first) plus those of the file at ``path`` (YAML or JSON), if any."""
        raw: list[Mapping[str, Any]] = list(extra)
        if path is not None:
            loaded = (
                yaml.safe_load(path.read_text())
                if path.suffix in (".yaml", ".yml")
                else json.loads(path.read_text() or "[]")
            )
            if isinstance(loaded, dict):
                loaded = loaded.get("images") or []
            if not isinstance(loaded, list):
                raise ValueError(f"{path}: expected a list of image entries or {{images: [...]}}")
            raw += loaded
        return cls((ImageEntry.parse(r) for r in raw), path)

    def resolve(self, image: str) -> ImageEntry | None:
        """The entry for ``image``: an exact match first, else the first glob that matches, else None."""
        for entry in self.entries:
            if not entry.is_glob and entry.image == image:
                return entry
        for entry in self.entries:
            if entry.is_glob and fnmatch.fnmatchcase(image, entry.image):
                return entry
        return None

    def not_mapped_message(self, image: str) -> str:
        where = f"the image map {self.source}" if self.source else "the node's image map (no image map file set)"
        return f'image "{image}" is not mapped to a local program in {where}'


def command_line(container: Obj, entry: ImageEntry) -> list[str]:
    """The argv Kubernetes would run: the container's ``command`` replaces the image's entrypoint (and then drops
    the image's cmd), its ``args`` replace the image's cmd."""
    command = container.get("command")
    args = container.get("args")
    if command:
        return [*command, *(args or [])]
    return [*entry.command, *(args if args is not None else entry.args)]
