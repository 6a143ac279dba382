"""What ``make images`` built: ``.build/images/images.json``, the one source of image digests (docs/images.md).

Every other part of kanri (the push to a registry, the chart's digests, the local cluster) reads the images through
:func:`built_images` and never recomputes a digest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.local.paths import build_dir

__all__ = ["BuiltImage", "built_images", "catalog_file", "images_dir"]

CATALOG = "images.json"


def images_dir() -> Path:
    """``.build/images``: one OCI image layout per image, their SBOMs and ``images.json``."""
    return build_dir() / "images"


def catalog_file(root: Path | None = None) -> Path:
    return (root or images_dir()) / CATALOG


@dataclass(frozen=True)
class BuiltImage:
    """One built image as ``images.json`` records it (paths resolved against the catalog's folder).

    ``digest`` is the image manifest's digest: what a registry serves under ``repository:tag`` and what the chart
    names. ``sbom_digest`` and ``signature_digest`` are the manifests attached to it in its layout (docs/images.md).
    """

    name: str
    repository: str
    tag: str
    digest: str
    layout: Path
    sbom: Path
    sbom_digest: str
    signature_digest: str
    user: str
    size: int
    """Bytes of the uncompressed layers."""
    compressed_size: int
    """Bytes of the compressed layers plus config and manifest: what a pull transfers."""

    @property
    def reference(self) -> str:
        """``repository:tag@digest`` (prefix a registry to pull it)."""
        return f"{self.repository}:{self.tag}@{self.digest}"

    @classmethod
    def from_json(cls, entry: dict[str, Any], root: Path) -> BuiltImage:
        return cls(
            name=entry["name"],
            repository=entry["repository"],
            tag=entry["tag"],
            digest=entry["digest"],
            layout=root / entry["layout"],
            sbom=root / entry["sbom"],
            sbom_digest=entry["sbom_digest"],
            signature_digest=entry["signature_digest"],
            user=entry["user"],
            size=int(entry["size"]),
            compressed_size=int(entry["compressed_size"]),
        )


def built_images(root: Path | None = None) -> list[BuiltImage]:
    """The images of the last ``make images`` in ``root`` (default :func:`images_dir`), in catalog order.

    Raises FileNotFoundError when nothing was built yet (run ``make images``).
    """
    root = root or images_dir()
    entries = json.loads(catalog_file(root).read_text())
    return [BuiltImage.from_json(entry, root) for entry in entries]
