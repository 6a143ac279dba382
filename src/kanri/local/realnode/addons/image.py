"""An OCI image layout holding one static binary and nothing else, run as a non-root user: how the add-ons built from
Go modules (CoreDNS) become images a real node imports.

The general image builder (``kanri.images``, ``make images``) may not be imported here (kanri.local imports only
the runtime: kanri.images imports kanri.local), and one file in one layer needs none of its machinery: the layer is
an uncompressed tar of one numerically owned, epoch-dated entry, so the same binary gives the same digests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LAYER = "application/vnd.oci.image.layer.v1.tar"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_INDEX = "application/vnd.oci.image.index.v1+json"
#: The user the add-on images run as (the ``kanri`` user of kanri's other images).
NONROOT_USER = "65532:65532"


@dataclass(frozen=True)
class BinaryImage:
    """One static binary as an image: ``/<entrypoint name>`` owned by root, executed as :data:`NONROOT_USER`."""

    binary: Path
    tag: str
    args: tuple[str, ...] = ()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _put(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _put_layer(layout: Path, binary: Path) -> dict[str, Any]:
    """The layer (``/<binary name>``, mode 0755, root's) as a blob, written and hashed as a stream."""
    scratch = layout / "layer.tar"
    with scratch.open("wb") as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(binary.name)
        info.size, info.mode, info.mtime = binary.stat().st_size, 0o755, 0
        with binary.open("rb") as content:
            tar.addfile(info, content)
    sha = hashlib.sha256()
    with scratch.open("rb") as written:
        for chunk in iter(lambda: written.read(1 << 20), b""):
            sha.update(chunk)
    size = scratch.stat().st_size
    scratch.rename(layout / "blobs" / "sha256" / sha.hexdigest())
    return {"digest": f"sha256:{sha.hexdigest()}", "size": size}


def write_binary_image(image: BinaryImage, target: Path) -> None:
    """Write ``image`` as an OCI layout at ``target`` (replaced), its manifest tagged ``image.tag``."""
    if target.exists():
        shutil.rmtree(target)
    (target / "blobs" / "sha256").mkdir(parents=True)
    (target / "oci-layout").write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))
    layer = _put_layer(target, image.binary)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"User": NONROOT_USER, "Entrypoint": [f"/{image.binary.name}"], "Cmd": list(image.args)},
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST,
        "config": {"mediaType": _CONFIG, **_put(target, _canonical(config))},
        "layers": [{"mediaType": _LAYER, **layer}],
    }
    entry = {
        "mediaType": _MANIFEST,
        **_put(target, _canonical(manifest)),
        "annotations": {"org.opencontainers.image.ref.name": image.tag},
    }
    (target / "index.json").write_bytes(_canonical({"schemaVersion": 2, "mediaType": _INDEX, "manifests": [entry]}))
