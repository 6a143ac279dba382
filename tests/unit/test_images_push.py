"""kanri.images.push and .registry without a registry: destinations as users write them, and which manifests of an
OCI layout are pushed in their own right (referrers travel with their subject).

:func:`make_layout` builds a tiny OCI image layout with an SBOM and a signature attached as referrers, the shape
``make images`` produces (docs/images.md "Layout"); the integration tests push it to real registries.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kanri.images.push import layout_roots
from kanri.images.registry import Destination
from kanri.local.imagemap import default_image_map
from kanri.local.node.images import ImageEntry, ImageMap

SBOM_TYPE = "application/vnd.cyclonedx+json"
SIGNATURE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
EMPTY = {
    "mediaType": "application/vnd.oci.empty.v1+json",
    "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest(),
    "size": 2,
    "data": "e30=",
}


@dataclass(frozen=True)
class Layout:
    path: Path
    tag: str
    digest: str
    sbom_digest: str
    signature_digest: str


def _put(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _manifest(layout: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return {"mediaType": manifest["mediaType"], **_put(layout, data)}


def _referrer(layout: Path, subject: dict[str, Any], artifact_type: str, content: bytes) -> dict[str, Any]:
    _put(layout, b"{}")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": artifact_type,
        "config": EMPTY,
        "layers": [{"mediaType": artifact_type, **_put(layout, content)}],
        "subject": subject,
    }
    return {**_manifest(layout, manifest), "artifactType": artifact_type}


def _cosign_signature(layout: Path, image: dict[str, Any]) -> dict[str, Any]:
    """A signature as ``cosign save`` lays it out: no ``subject``; the index entry's ``kind`` ties it to the image."""
    payload = json.dumps({"critical": {"image": {"docker-manifest-digest": image["digest"]}}}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_put(layout, b'{"rootfs":{}}')},
        "layers": [
            {
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                **_put(layout, payload),
                "annotations": {"dev.cosignproject.cosign/signature": "MEUCIQ=="},
            }
        ],
    }
    return {**_manifest(layout, manifest), "annotations": {"kind": "dev.cosignproject.cosign/sigs"}}


def make_layout(path: Path, tag: str = "1.0", content: bytes = b"kanri test layer", *, cosign: bool = False) -> Layout:
    """An OCI layout at ``path``: one image tagged ``tag`` (a config and one layer holding ``content``), an SBOM
    attached as a referrer and a signature — a referrer too, or with ``cosign`` as ``cosign save`` writes it (what
    ``make images`` does, docs/images.md "Layout")."""
    (path / "blobs" / "sha256").mkdir(parents=True)
    (path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"User": "65532"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(content).hexdigest()]},
    }
    image = _manifest(
        path,
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                **_put(path, json.dumps(config).encode()),
            },
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **_put(path, content)}],
        },
    )
    sbom = _referrer(path, image, SBOM_TYPE, b'{"bomFormat":"CycloneDX","components":[]}')
    signature = _cosign_signature(path, image) if cosign else _referrer(path, image, SIGNATURE_TYPE, b'{"sig":"t"}')
    tagged = {**image, "annotations": {"org.opencontainers.image.ref.name": tag}}
    (path / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [tagged, sbom, signature],
            }
        )
    )
    return Layout(path, tag, image["digest"], sbom["digest"], signature["digest"])


def write_catalog(root: Path, repository: str, layout: Layout) -> None:
    """An ``images.json`` in ``root`` naming ``layout`` as image ``repository:tag`` (the catalog's fields)."""
    entry = {
        "name": repository,
        "repository": repository,
        "tag": layout.tag,
        "digest": layout.digest,
        "layout": str(layout.path),
        "sbom": str(layout.path / "sbom.json"),
        "sbom_digest": layout.sbom_digest,
        "signature_digest": layout.signature_digest,
        "user": "65532",
        "size": 16,
        "compressed_size": 16,
    }
    (root / "images.json").write_text(json.dumps([entry]))


def test_a_destination_is_registry_and_prefix() -> None:
    dest = Destination.parse("registry.example.com/platform/kanri/")
    assert (dest.registry, dest.prefix) == ("registry.example.com", "platform/kanri")
    assert dest.repository("kanri-operator") == "registry.example.com/platform/kanri/kanri-operator"
    assert Destination.parse("127.0.0.1:5000").repository("kanri-postgres") == "127.0.0.1:5000/kanri-postgres"
    assert Destination.parse("localhost/x").registry == "localhost"


@pytest.mark.parametrize(
    "text",
    [
        "https://registry.example.com/kanri",
        "registry.example.com/kanri:1.0",
        "registry.example.com/k@sha256:00",
        "platform/kanri",
        "",
    ],
)
def test_a_destination_names_a_host_and_no_tag_digest_or_scheme(text: str) -> None:
    with pytest.raises(ValueError, match=r"REGISTRY|registry"):
        Destination.parse(text)


def test_referrers_are_not_pushed_on_their_own(tmp_path: Path) -> None:
    layout = make_layout(tmp_path / "layout", tag="17")
    roots = layout_roots(layout.path)
    assert [(r.digest, r.tag) for r in roots] == [(layout.digest, "17")]


def test_an_untagged_manifest_that_refers_to_nothing_is_pushed_by_digest(tmp_path: Path) -> None:
    layout = make_layout(tmp_path / "layout")
    index = json.loads((layout.path / "index.json").read_text())
    del index["manifests"][0]["annotations"]
    (layout.path / "index.json").write_text(json.dumps(index))
    assert [(r.digest, r.tag) for r in layout_roots(layout.path)] == [(layout.digest, "")]


def test_a_cosign_signature_goes_under_the_tag_cosign_looks_for(tmp_path: Path) -> None:
    layout = make_layout(tmp_path / "layout", tag="0.1.0", cosign=True)
    roots = [(r.digest, r.tag) for r in layout_roots(layout.path)]
    assert roots == [(layout.digest, "0.1.0"), (layout.signature_digest, layout.digest.replace(":", "-") + ".sig")]


@pytest.mark.parametrize(
    ("reference", "program"),
    [
        ("kanri.dev/kanri-operator:0.1.0", "kanri.cli.main"),
        ("registry.example.com:5000/k/kanri-operator:0.1.0@sha256:" + "a" * 64, "kanri.cli.main"),
        ("kanri.dev/kanri-postgres:17@sha256:" + "b" * 64, "kanri.instance"),
        ("127.0.0.1:5000/kanri/kanri-postgres:17", "kanri.instance"),
    ],
)
def test_the_local_node_runs_the_references_the_chart_and_operator_name(reference: str, program: str) -> None:
    images = ImageMap([ImageEntry.parse(e) for e in default_image_map()])
    entry = images.resolve(reference)
    assert entry is not None, reference
    assert program in entry.command
    if "kanri-postgres:17" in reference:
        assert entry.env == images.resolve("kanri.dev/postgres:17").env  # type: ignore[union-attr]


def test_an_upgrade_image_is_not_taken_for_an_instance_image() -> None:
    images = ImageMap([ImageEntry.parse(e) for e in default_image_map()])
    assert images.resolve("r.example/kanri-postgres:99") is None
    upgrade = images.resolve("r.example/kanri-postgres-upgrade:18")
    assert upgrade is not None  # make pg-binaries installed 14-18
    assert any(key.startswith("KANRI_PG_BIN_") for key in upgrade.env)
