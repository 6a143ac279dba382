"""An image's SBOM is the union of its layers' documents: each component once, under the image as subject, and the
same inputs give the same document."""

from __future__ import annotations

from typing import Any

from kanri.images.sbom import image_sbom


def _layer(*components: tuple[str, str]) -> dict[str, Any]:
    return {
        "specVersion": "1.6",
        "metadata": {"tools": {"components": [{"name": "syft"}]}, "timestamp": "2026-12-06T00:00:00Z"},
        "components": [
            {"type": "library", "name": n, "version": v, "purl": f"pkg:deb/debian/{n}@{v}"} for n, v in components
        ],
    }


def test_components_of_every_layer_appear_once_lowest_layer_first() -> None:
    base = _layer(("libc6", "2.36"), ("libssl3", "3.0.22"))
    libs = _layer(("libc6", "2.36"), ("libxml2", "2.9.14"))  # its status file repeats the base's packages
    document = image_sbom([base, libs], "kanri-postgres-18", "kanri-postgres:18", "sha256:abc")
    assert [(c["name"], c["version"]) for c in document["components"]] == [
        ("libc6", "2.36"),
        ("libssl3", "3.0.22"),
        ("libxml2", "2.9.14"),
    ]


def test_another_version_of_a_package_is_a_component_of_its_own() -> None:
    document = image_sbom([_layer(("six", "1.16")), _layer(("six", "1.17"))], "x", "x:1", "sha256:abc")
    assert sorted(c["version"] for c in document["components"]) == ["1.16", "1.17"]


def test_the_subject_is_the_image_and_the_document_carries_no_time() -> None:
    one = image_sbom([_layer(("a", "1"))], "kanri-operator", "kanri-operator:0.1.0", "sha256:abc")
    two = image_sbom([_layer(("a", "1"))], "kanri-operator", "kanri-operator:0.1.0", "sha256:abc")
    assert one == two
    assert one["metadata"]["component"]["version"] == "sha256:abc"
    assert one["metadata"]["component"]["name"] == "kanri-operator:0.1.0"
    assert "timestamp" not in one["metadata"]
    assert one["serialNumber"] != image_sbom([_layer(("a", "1"))], "x", "x:1", "sha256:def")["serialNumber"]
