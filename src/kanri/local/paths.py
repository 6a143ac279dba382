"""Where kanri's sources, build outputs and local clusters live on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def source_root() -> Path:
    """The kanri checkout holding ``controlplane/`` (``KANRI_SOURCE_ROOT`` overrides the search)."""
    if env := os.environ.get("KANRI_SOURCE_ROOT"):
        return Path(env).resolve()
    for parent in Path(__file__).resolve().parents:
        if (parent / "controlplane" / "go.mod").is_file():
            return parent
    raise FileNotFoundError(
        "cannot find kanri's controlplane/ sources above the installed package; set KANRI_SOURCE_ROOT to the checkout"
    )


def build_dir() -> Path:
    """Git-ignored folder for built binaries (``KANRI_BUILD_DIR`` overrides)."""
    if env := os.environ.get("KANRI_BUILD_DIR"):
        return Path(env).resolve()
    return source_root() / ".build"


def state_home() -> Path:
    """Root of kanri's local state: ``KANRI_HOME``, else ``$XDG_STATE_HOME/kanri``, else ``~/.local/state/kanri``."""
    if env := os.environ.get("KANRI_HOME"):
        return Path(env).resolve()
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "kanri"


def cluster_dir(name: str = "default") -> Path:
    """Data dir of the named local cluster."""
    return state_home() / "clusters" / name
