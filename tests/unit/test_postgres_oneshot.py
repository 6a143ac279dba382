"""One-shot pods are trusted only as the operator's own (issue 33 item 5): uid recorded in status and the cluster
their controller. A pod someone else made under the rehearsal's or an upgrade pod's name is never read, never
deleted, and reported as ForeignPod; the rehearsal waits until it is gone."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.images import DEFAULT_IMAGES, PostgresImages
from kanri.postgres.pods import oneshot
from kanri.postgres.recovery import rehearsal as restore_test
from kanri.postgres.upgrade import step as upgrade_step
from kanri.runtime import ApiError, Kind

Obj = dict[str, Any]
CLUSTER: Obj = {"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster",
                "metadata": {"name": "orders", "namespace": "shop", "uid": "cluster-uid",
                             "creationTimestamp": "2026-12-01T00:00:00Z",
                             "annotations": {"kanri.dev/restore-test": "now"}}}  # fmt: skip
FORGED = json.dumps({"result": "Succeeded", "message": "all good, trust me", "durationSeconds": 1})


def pod(name: str, uid: str, owner_uid: str | None = "cluster-uid", finished: bool = True) -> Obj:
    meta: Obj = {"name": name, "namespace": "shop", "uid": uid, "creationTimestamp": "2026-12-06T05:00:00Z",
                 "annotations": {"kanri.dev/restore-test-request": "now"}}  # fmt: skip
    if owner_uid is not None:
        meta["ownerReferences"] = [{"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster", "name": "orders",
                                    "uid": owner_uid, "controller": True}]  # fmt: skip
    status: Obj = {"phase": "Succeeded" if finished else "Running"}
    if finished:
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": 0, "message": FORGED}}}]
    return {"metadata": meta, "status": status}


def test_only_the_recorded_uid_with_the_cluster_as_controller_is_trusted() -> None:
    status = {"oneShotPods": {"orders-restore-test": "pod-uid"}}
    assert oneshot.trusted(pod("orders-restore-test", "pod-uid"), CLUSTER, status)
    # an owner reference anyone can write is not enough, nor a name, nor a label
    assert not oneshot.trusted(pod("orders-restore-test", "forged-uid"), CLUSTER, status)
    assert not oneshot.trusted(pod("orders-restore-test", "pod-uid"), CLUSTER, {})
    # the recorded uid under another controller (a recreated cluster of the same name) is not ours either
    assert not oneshot.trusted(pod("orders-restore-test", "pod-uid", owner_uid="old-cluster"), CLUSTER, status)
    assert not oneshot.trusted(pod("orders-restore-test", "pod-uid", owner_uid=None), CLUSTER, status)


def test_a_pod_made_under_a_pending_record_is_trusted_by_its_nonce_only() -> None:
    """An operator killed between its create and the uid's record: the next one still knows the pod as its own."""
    status = {"oneShotPods": {"orders-upgrade": oneshot.nonce_hash("n0nce")}}
    ours = pod("orders-upgrade", "pod-uid")
    ours["metadata"]["annotations"][oneshot.NONCE_ANNOTATION] = "n0nce"
    assert oneshot.trusted(ours, CLUSTER, status)
    # the hash in status cannot be turned back into the nonce: a forgery without it, or with another, is foreign
    assert not oneshot.trusted(pod("orders-upgrade", "forged"), CLUSTER, status)
    forged = pod("orders-upgrade", "forged")
    forged["metadata"]["annotations"][oneshot.NONCE_ANNOTATION] = status["oneShotPods"]["orders-upgrade"]
    assert not oneshot.trusted(forged, CLUSTER, status)
    # and the nonce under another controller is not ours either
    other = pod("orders-upgrade", "pod-uid", owner_uid="old-cluster")
    other["metadata"]["annotations"][oneshot.NONCE_ANNOTATION] = "n0nce"
    assert not oneshot.trusted(other, CLUSTER, status)


async def test_the_pending_record_is_written_before_the_create_and_the_uid_after_it() -> None:
    api = Api()
    step = Pass(api)
    seen: list[Obj] = []

    async def create(kind: Kind, obj: Obj) -> Obj:  # what status holds when the pod is created
        seen.append(json.loads(json.dumps(api.status)))
        made = {**obj, "metadata": {**obj["metadata"], "uid": "new-uid"}}
        api.pods[obj["metadata"]["name"]] = made
        return made

    api.get = lambda kind, name, namespace=None: None  # type: ignore[method-assign]
    api.create = create  # type: ignore[method-assign]
    await restore_test.run(step, 16, archiving=True)  # type: ignore[arg-type]
    nonce = api.pods["orders-restore-test"]["metadata"]["annotations"][oneshot.NONCE_ANNOTATION]
    assert seen == [{"oneShotPods": {"orders-restore-test": oneshot.nonce_hash(nonce)}}]
    assert api.status["oneShotPods"]["orders-restore-test"] == "new-uid"


def test_a_foreign_pod_under_any_one_shot_name_is_reported_naming_it() -> None:
    status = {"oneShotPods": {"orders-restore-test": "pod-uid"}}
    pods: dict[str, Obj | None] = {
        "orders-restore-test": pod("orders-restore-test", "pod-uid"),  # ours
        "orders-upgrade-check": pod("orders-upgrade-check", "x"),  # someone else's
        "orders-upgrade": None,
    }
    found = oneshot.foreign_problems(pods, CLUSTER, status)
    assert [p.reason for p in found] == ["ForeignPod"]
    assert found[0].message.startswith("Pod orders-upgrade-check was not created by the operator")
    assert "the major upgrade's check waits until it is gone" in found[0].message
    going = pod("orders-upgrade-check", "x")
    going["metadata"]["deletionTimestamp"] = "2026-12-06T05:01:00Z"
    assert oneshot.foreign_problems({"orders-upgrade-check": going}, CLUSTER, status) == []


@dataclass
class Api:
    """The cache and the client of a pass, in memory (pods by name; status patches merged)."""

    pods: dict[str, Obj] = field(default_factory=dict)
    status: Obj = field(default_factory=dict)
    writes: list[tuple[str, str]] = field(default_factory=list)

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        return self.pods.get(name) if kind.kind == "Pod" else None

    async def create(self, kind: Kind, obj: Obj) -> Obj:
        name = obj["metadata"]["name"]
        if name in self.pods:
            raise ApiError(409, {"reason": "AlreadyExists"})
        made = {**obj, "metadata": {**obj["metadata"], "uid": f"uid-{len(self.writes)}"}}
        self.pods[name] = made
        self.writes.append(("create", name))
        return made

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        self.writes.append(("delete", name))
        self.pods.pop(name, None)

    async def patch_status(self, kind: Kind, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        for key, value in patch["status"].items():
            if isinstance(value, dict) and isinstance(self.status.get(key), dict):
                merged = {**self.status[key], **value}
                self.status[key] = {k: v for k, v in merged.items() if v is not None}
            else:
                self.status[key] = value
        self.writes.append(("status", ",".join(sorted(patch["status"]))))
        return {"status": json.loads(json.dumps(self.status))}


class Events:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def normal(self, obj: Obj, reason: str, message: str) -> None:
        self.sent.append(reason)

    async def warning(self, obj: Obj, reason: str, message: str) -> None:
        self.sent.append(reason)


@dataclass
class Pass:
    api: Api
    name: str = "orders"
    namespace: str = "shop"
    running: bool = True
    spec: PostgresClusterSpec = field(default_factory=lambda: PostgresClusterSpec.model_validate(
        {"version": 16, "storage": {"size": "1Gi"}, "backup": {}}))  # fmt: skip
    r: Any = field(default_factory=lambda: SimpleNamespace(events=Events(), metrics=None))
    refused: list[str] = field(default_factory=list)
    images: PostgresImages = DEFAULT_IMAGES

    def __post_init__(self) -> None:
        self.cluster: Obj = {**CLUSTER, "status": self.api.status}

    @property
    def status(self) -> Obj:
        return self.api.status

    @status.setter
    def status(self, value: Obj) -> None:
        self.api.status.clear()
        self.api.status.update(value)

    @property
    def cache(self) -> Api:
        return self.api

    @property
    def client(self) -> Api:
        return self.api

    @property
    def events(self) -> Events:
        return self.r.events  # type: ignore[no-any-return]

    @property
    def metrics(self) -> None:
        return self.r.metrics  # type: ignore[no-any-return]

    def adopt_status(self, updated: Obj) -> None:
        self.status = updated.get("status") or {}
        self.cluster = {**self.cluster, "status": self.status}

    def rejected(self, kind: Kind, name: str, exc: ApiError) -> None:
        self.refused.append(name)


async def test_a_forged_rehearsal_pod_is_neither_read_nor_deleted_and_the_rehearsal_waits() -> None:
    api = Api(pods={"orders-restore-test": pod("orders-restore-test", "forged", owner_uid="cluster-uid")})
    step = Pass(api)
    await restore_test.run(step, 16, archiving=True)  # type: ignore[arg-type]
    assert "lastRestoreTest" not in (api.status.get("backup") or {})  # before: Succeeded, from the forged message
    assert api.writes == []  # before: the pod was deleted too
    assert "orders-restore-test" in api.pods
    # once the tenant's pod is gone, the operator's own runs under the name, its uid recorded
    del api.pods["orders-restore-test"]
    await restore_test.run(step, 16, archiving=True)  # type: ignore[arg-type]
    mine = api.pods["orders-restore-test"]
    assert api.status["oneShotPods"] == {"orders-restore-test": mine["metadata"]["uid"]}
    assert step.r.events.sent == ["RestoreTestStarted"]


async def test_the_operators_own_finished_rehearsal_is_recorded_deleted_and_then_forgotten() -> None:
    api = Api()
    step = Pass(api)
    await restore_test.run(step, 16, archiving=True)  # type: ignore[arg-type]
    created = api.pods["orders-restore-test"]
    verdict = json.dumps({"result": "Succeeded", "message": "restored", "durationSeconds": 4})
    created["status"] = {"phase": "Succeeded", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 0, "message": verdict}}}]}  # fmt: skip
    await restore_test.run(step, 16, archiving=True)  # type: ignore[arg-type]
    assert api.status["backup"]["lastRestoreTest"]["result"] == "Succeeded"
    assert ("delete", "orders-restore-test") in api.writes
    step.cluster = {**CLUSTER, "status": api.status}
    await restore_test.run(step, 16, archiving=True)  # type: ignore[arg-type]
    assert "orders-restore-test" not in (api.status.get("oneShotPods") or {})  # answered and gone: forgotten


async def test_a_409_on_create_is_never_taken_as_the_operators_pod() -> None:
    api = Api()
    step = Pass(api)
    racing = pod("orders-restore-test", "tenant", finished=False)

    async def first_create(kind: Kind, obj: Obj) -> Obj:  # the tenant's pod lands before the cache shows it
        api.pods["orders-restore-test"] = racing
        raise ApiError(409, {"reason": "AlreadyExists"})

    api.get = lambda kind, name, namespace=None: None  # type: ignore[method-assign]
    api.create = first_create  # type: ignore[method-assign]
    await restore_test.run(step, 16, archiving=True)  # type: ignore[arg-type]
    assert not (api.status.get("oneShotPods") or {}).get("orders-restore-test"), "no uid, no pending record kept"
    assert not oneshot.trusted(racing, CLUSTER, api.status)


async def test_the_upgrade_sweep_leaves_a_foreign_pod_alone() -> None:
    api = Api(pods={"orders-upgrade-check": pod("orders-upgrade-check", "tenant")})
    step = Pass(api)
    await upgrade_step.sweep(step, {"phase": "Succeeded"})  # type: ignore[arg-type]
    assert api.writes == []  # before: deleted as a leftover
    api.status["oneShotPods"] = {"orders-upgrade-check": "tenant"}
    await upgrade_step.sweep(step, {"phase": "Succeeded"})  # type: ignore[arg-type]
    assert ("delete", "orders-upgrade-check") in api.writes  # the operator's own leftover goes
