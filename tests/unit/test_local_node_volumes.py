"""The provisioner's pure parts: the PV it makes for a claim, what it refuses, when a claim needs growing, when it
does not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kanri.local.node.provisioner import (
    free_bytes,
    needs_expansion,
    persistent_volume,
    provisioned_here,
    readable_bytes,
    shortfall,
    storage_class,
    unsupported,
)
from kanri.runtime import parse_quantity

Obj = dict[str, Any]


def claim(size: str = "1Gi", phase: str = "Pending", capacity: str | None = None, **spec: Any) -> Obj:
    status: Obj = {"phase": phase}
    if capacity:
        status["capacity"] = {"storage": capacity}
    return {
        "metadata": {"name": "data", "namespace": "ns", "uid": "1234"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec},
        "status": status,
    }


def test_the_volume_is_pre_bound_to_the_claim_and_pinned_to_the_node() -> None:
    retain = storage_class("slow", default=False, reclaim_policy="Retain")
    volume = persistent_volume(claim("5Gi"), retain, "node-a", Path("/data/volumes/pvc-1234"))
    spec = volume["spec"]
    assert volume["metadata"]["name"] == "pvc-1234"
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == "kanri.dev/local"
    assert spec["capacity"] == {"storage": "5Gi"}
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"
    assert spec["storageClassName"] == "slow"
    assert spec["claimRef"] == {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "ns",
                                "name": "data", "uid": "1234"}  # fmt: skip
    assert spec["local"] == {"path": "/data/volumes/pvc-1234"}
    (term,) = spec["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]


def test_the_default_class_is_marked_expandable_and_waits_for_the_first_consumer() -> None:
    default = storage_class("kanri-local", default=True)
    assert default["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
    assert (default["reclaimPolicy"], default["volumeBindingMode"], default["allowVolumeExpansion"]) == (
        "Delete",
        "WaitForFirstConsumer",
        True,
    )


def _claim(selected: str | None) -> dict[str, Any]:
    annotations = {"volume.kubernetes.io/selected-node": selected} if selected else {}
    return {"metadata": {"name": "data", "namespace": "ns", "annotations": annotations}}


def test_only_the_selected_node_provisions_a_waiting_claim() -> None:
    waiting = storage_class("kanri-local", default=True)
    assert provisioned_here(_claim("kanri-2"), waiting, "kanri-2", serves_immediate=False)
    assert not provisioned_here(_claim("kanri-2"), waiting, "kanri-1", serves_immediate=True)
    assert not provisioned_here(_claim(None), waiting, "kanri-1", serves_immediate=True)  # not placed yet
    immediate = {**waiting, "volumeBindingMode": "Immediate"}
    assert provisioned_here(_claim(None), immediate, "kanri-1", serves_immediate=True)
    assert not provisioned_here(_claim(None), immediate, "kanri-2", serves_immediate=False)


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        ({}, False),
        ({"volumeMode": "Filesystem"}, False),
        ({"volumeMode": "Block"}, True),
        ({"selector": {"matchLabels": {"a": "b"}}}, True),
        ({"dataSource": {"kind": "VolumeSnapshot", "name": "s"}}, True),
    ],
)
def test_what_a_directory_cannot_serve(extra: Obj, refused: bool) -> None:
    assert (unsupported(claim(**extra)) is not None) is refused


def test_expansion_is_needed_only_for_a_bound_claim_asking_for_more() -> None:
    assert needs_expansion(claim("2Gi", "Bound", capacity="1Gi"))
    assert not needs_expansion(claim("1024Mi", "Bound", capacity="1Gi"))  # the same size, written differently
    assert not needs_expansion(claim("2Gi", "Pending"))


def test_a_claim_larger_than_the_free_space_names_requested_and_available() -> None:
    gib = 1 << 30
    assert shortfall("10Gi", parse_quantity("10Gi"), 10 * gib, Path("/data/volumes")) is None
    problem = shortfall("1Ei", parse_quantity("1Ei"), 75 * gib + 12345, Path("/data/volumes"))
    assert problem == "requested 1Ei but only 75Gi is available on the filesystem of /data/volumes"


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0"), (1023, "1023"), (1024, "1Ki"), (3 * (1 << 20) - 1, "2Mi"), (1 << 60, "1Ei"), (5 * (1 << 40), "5Ti")],
)
def test_free_space_is_written_in_whole_binary_units_rounded_down(count: int, text: str) -> None:
    assert readable_bytes(count) == text


def test_free_space_of_a_volume_dir_not_made_yet_is_its_parents(tmp_path: Path) -> None:
    assert 0 < free_bytes(tmp_path / "node" / "volumes") == pytest.approx(free_bytes(tmp_path), rel=0.01)
