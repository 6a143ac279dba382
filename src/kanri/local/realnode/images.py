"""The images a real node imports into containerd at start: OCI layouts ``make images`` built under
``.build/images/`` (listed in its ``images.json``), each named ``kanri.local/<repository>:<tag>`` on the node.

The catalog's reader is ``kanri.images.catalog``; kanri.local may import only the runtime (tests/unit/test_layers.py,
and kanri.images imports kanri.local), so the three fields a node needs are read here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: The registry part of every imported image's name: nothing is pulled from it, it only says where they came from.
IMAGE_REGISTRY = "kanri.local"


@dataclass(frozen=True)
class BuiltImage:
    """One built image: its layout directory and the name pods use for it on a real node."""

    name: str
    repository: str
    tag: str
    layout: Path

    @property
    def base_name(self) -> str:
        return f"{IMAGE_REGISTRY}/{self.repository}"

    @property
    def ref(self) -> str:
        return f"{self.base_name}:{self.tag}"


def built_images(images_dir: Path) -> dict[str, BuiltImage]:
    """Every image of ``images_dir/images.json`` by its name (``kanri-pause``, ``kanri-tools``, ...)."""
    index = images_dir / "images.json"
    if not index.is_file():
        raise FileNotFoundError(f"{index} is missing: run `make images` first")
    return {
        entry["name"]: BuiltImage(entry["name"], entry["repository"], entry["tag"], images_dir / entry["layout"])
        for entry in json.loads(index.read_text())
    }
