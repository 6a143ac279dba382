"""``kanri images push``: copy built images, each with its SBOM and signature, from their OCI layouts to a registry,
keeping every digest (the chart names images by digest, and a signature signs one).

What a layout holds is pushed as it is: every manifest its ``index.json`` lists that is not itself a referrer goes
by its tag (``org.opencontainers.image.ref.name``), or by digest when it has none, and oras carries each one's
referrers (manifests with a ``subject``: the SBOM) along. A cosign signature or attestation in the layout (``cosign
save``'s annotation ``kind: dev.cosignproject.cosign/sigs`` or ``/atts``, which refer to the layout's image by
convention, not by ``subject``) goes under the tag cosign looks for: ``sha256-<image digest>.sig`` (``.att``).
After each copy the registry is asked for the digest it now serves under that name; a different one is an error,
never a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.images.catalog import BuiltImage
from kanri.images.registry import Destination, Oras

REF_NAME = "org.opencontainers.image.ref.name"
COSIGN_KIND = "kind"
COSIGN_KINDS = {"dev.cosignproject.cosign/sigs": "sig", "dev.cosignproject.cosign/atts": "att"}


class PushError(RuntimeError):
    """A copy failed or the registry serves another digest than the layout holds."""


@dataclass(frozen=True)
class LayoutRoot:
    """A manifest of a layout that is pushed in its own right: its digest and tag ("" when untagged)."""

    digest: str
    tag: str


@dataclass(frozen=True)
class PushedImage:
    """What the destination now serves: ``repository`` (in full) and ``tag`` name ``digest``."""

    repository: str
    tag: str
    digest: str

    @property
    def reference(self) -> str:
        """``repository@digest``: the pull reference that no later push can change."""
        return f"{self.repository}@{self.digest}"


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, _, hex_digest = digest.partition(":")
    return (layout / "blobs" / algorithm / hex_digest).read_bytes()


def layout_roots(layout: Path) -> list[LayoutRoot]:
    """The manifests of ``layout``'s ``index.json`` that are not referrers (they travel with their subject), in
    index order, each once; cosign's signatures and attestations last, tagged after the image they sign."""
    index: dict[str, Any] = json.loads((layout / "index.json").read_text())
    roots: list[LayoutRoot] = []
    cosign: list[tuple[str, str]] = []
    for descriptor in index.get("manifests") or []:
        digest = str(descriptor["digest"])
        annotations = descriptor.get("annotations") or {}
        if (suffix := COSIGN_KINDS.get(annotations.get(COSIGN_KIND, ""))) is not None:
            cosign.append((digest, suffix))
            continue
        manifest: dict[str, Any] = json.loads(_blob(layout, digest))
        if "subject" in manifest:
            continue
        root = LayoutRoot(digest, str(annotations.get(REF_NAME, "")))
        if root not in roots:
            roots.append(root)
    if cosign and len({r.digest for r in roots}) != 1:
        raise PushError(f"{layout}: cosign signatures need exactly one image in the layout to belong to")
    for digest, suffix in cosign:
        roots.append(LayoutRoot(digest, f"{roots[0].digest.replace(':', '-')}.{suffix}"))
    return roots


def push_layout(oras: Oras, layout: Path, repository: str, dest: Destination) -> list[PushedImage]:
    """Copy every :func:`layout_roots` manifest of ``layout`` (with its referrers) to ``repository`` under
    ``dest``; returns what the registry serves afterwards, checked against the layout's digests."""
    full = dest.repository(repository)
    pushed = []
    for root in layout_roots(layout):
        # by digest from the layout: a cosign tag exists only in the registry
        target = f"{full}:{root.tag}" if root.tag else f"{full}@{root.digest}"
        oras.copy_from_layout(layout, f"@{root.digest}", dest, target)
        served = oras.resolve(target, dest)
        if served != root.digest:
            raise PushError(f"{target}: the registry serves {served}, the layout holds {root.digest}")
        pushed.append(PushedImage(full, root.tag, root.digest))
    return pushed


def push_images(oras: Oras, images: list[BuiltImage], dest: Destination) -> list[PushedImage]:
    """Push every image of the catalog (each layout once) and check the catalog's digest arrived under its tag."""
    pushed: list[PushedImage] = []
    done: set[tuple[Path, str]] = set()
    for image in images:
        if (image.layout, image.repository) not in done:
            pushed += push_layout(oras, image.layout, image.repository, dest)
            done.add((image.layout, image.repository))
        full = dest.repository(image.repository)
        if not any(p.repository == full and p.tag == image.tag and p.digest == image.digest for p in pushed):
            raise PushError(f"{image.name}: {full}:{image.tag} is not {image.digest} after the push")
        # the SBOM and the signature arrived too (by digest: whether as referrers or under cosign's tags)
        for attached in (image.sbom_digest, image.signature_digest):
            if attached and oras.resolve(f"{full}@{attached}", dest) != attached:
                raise PushError(f"{image.name}: {full}@{attached} is missing after the push")
    return pushed
