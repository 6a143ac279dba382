"""A container's root filesystem: the steps the launcher takes to assemble it (:func:`root_layout`).

There is no image filesystem on the local node, so the root is made of the host's: on a fresh tmpfs (one per
container, in its own mount namespace, gone with it), read-only binds of the system directories
(:data:`SYSTEM_DIRS`; merged-usr symlinks such as ``/bin -> usr/bin`` recreated), a snapshot of ``/etc`` (files
copied, directories bound read-only — a host that renames a new ``/etc/passwd`` into place, as package installs
do, no longer reaches the container), empty ``/home``, ``/root``, ``/mnt``, ``/media``, ``/srv``, a ``/run`` of
its own, a per-container ``/tmp`` on disk (emptied at each start, as a new container's is), a minimal ``/dev``, a
new ``/proc`` and a read-only ``/sys``. The programs standing for images may live anywhere (a checkout under
``/tmp``, a venv under ``/work``): every absolute path the image entry and the container's command line name
(:func:`named_paths`), and every directory the entry lists as the image's own files (its ``paths``: an install's
``share/`` is read by its programs but named nowhere), is bound read-only at the same place.

The pod's volumes and ``/etc`` files are bound over that root afterwards (:mod:`kanri.local.node.launcher`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt", "var")
"""Host directories every container sees (read-only): what an image of the host's distribution would hold."""
EMPTY_DIRS = {"home": 0o755, "root": 0o700, "mnt": 0o755, "media": 0o755, "srv": 0o755}
PRIVATE = ("etc", "run", "tmp", "dev", "proc", "sys")
"""The container's own; a named path there is not bound from the host (but ``/tmp/...`` is: see module doc)."""


def named_paths(words: Iterable[str]) -> list[str]:
    """Absolute paths among ``words`` (command, args, env values; ``:``-separated lists such as ``PYTHONPATH``
    split) that exist on the host: a directory itself, a file's directory."""
    found: set[str] = set()
    for word in words:
        for part in word.split(":"):
            if not part.startswith("/") or "\n" in part:
                continue
            path = os.path.normpath(part)
            if os.path.isdir(path):
                found.add(path)
            elif os.path.isfile(path):
                found.add(os.path.dirname(path))
    return sorted(found)


def _under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def root_layout(tmp_dir: Path, extra_paths: Iterable[str] = (), host: Path = Path("/")) -> tuple[list[Obj], list[str]]:
    """The launcher's layout steps and the host paths they bind read-only (what a missing mountpoint must be made
    in on the host, see :func:`host_mountpoint`). ``tmp_dir`` becomes ``/tmp``."""
    steps: list[Obj] = []
    bound: list[str] = []
    for name in SYSTEM_DIRS:
        system = host / name
        if system.is_symlink():
            steps.append({"op": "symlink", "target": f"/{name}", "link": os.readlink(system)})
        elif system.is_dir():
            steps.append({"op": "bind", "source": str(system), "target": f"/{name}", "readOnly": True})
            bound.append(f"/{name}")
    steps += [{"op": "dir", "target": f"/{name}", "mode": mode} for name, mode in EMPTY_DIRS.items()]
    steps.append({"op": "snapshot", "source": str(host / "etc"), "target": "/etc"})
    with os.scandir(host / "etc") as entries:
        bound += [f"/etc/{e.name}" for e in entries if e.is_dir(follow_symlinks=False)]
    steps += [
        {"op": "tmpfs", "target": "/run", "mode": 0o755},
        {"op": "dir", "target": "/run/lock", "mode": 0o1777},
        {"op": "bind", "source": str(tmp_dir), "target": "/tmp", "readOnly": False},
        {"op": "dev", "target": "/dev"},
        {"op": "proc", "target": "/proc"},
        {"op": "sys", "target": "/sys"},
    ]
    private = [f"/{name}" for name in PRIVATE if name != "tmp"]
    chosen: list[str] = []
    symlinks = [f"/{step['target'].lstrip('/')}" for step in steps if step["op"] == "symlink"]
    for path in sorted(set(extra_paths), key=len):  # shortest first: a path inside a chosen one is covered
        if path in ("/", "/tmp") or _under(path, [*bound, *symlinks, *private, *chosen]):
            continue
        if _under(os.path.realpath(path), bound):  # e.g. through a symlink into /usr
            continue
        chosen.append(path)
    steps += [{"op": "bind", "source": path, "target": path, "readOnly": True} for path in chosen]
    return steps, bound + chosen


def host_mountpoint(target: str, bound: Iterable[str]) -> bool:
    """Whether a volume's mountpoint must exist on the host: it lies in a directory the root binds read-only
    (the launcher makes the others in the container's own tmpfs). Symlinks are followed as on the host
    (``/var/run`` → ``/run``, the container's own)."""
    return _under(os.path.realpath(target), bound)
