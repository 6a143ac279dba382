"""kanri.kit pieces against the real API server: the status ledger, the child writer, the finalizer and one-shot pods.

The primary kind is the stateful example's KeyValueStore (a CRD with a status subresource); each test drives one
kit piece directly, with a cache of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio

from examples.stateful.api import KIND, LABELS, KeyValueStore
from kanri import kit
from kanri.local import Endpoint
from kanri.runtime import ApiError, Cache, Client, EventRecorder, Result, install_crd, set_condition
from kanri.runtime.kinds import CONFIG_MAP, EVENT, POD, SECRET
from tests.support import eventually

Obj = dict[str, Any]
MANAGER = "kit-tests"


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        await install_crd(c, KeyValueStore, field_manager=MANAGER)
        yield c


@contextlib.asynccontextmanager
async def cache_of(client: Client, namespace: str, *kinds: Any) -> AsyncIterator[Cache]:
    cache = Cache(client, namespace=namespace)
    for kind in (KIND, *kinds):
        cache.informer(kind)
    client.add_write_listener(cache.observe_write)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.wait_for_sync(), 30)
        yield cache
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def new_store(client: Client, namespace: str, name: str = "s", **spec: Any) -> Obj:
    body = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    return await client.create(KIND, body)


async def cached(cache: Cache, kind: Any, name: str, namespace: str, version: str | None = None) -> Obj:
    """The cached object once the cache has it (at ``version`` or later when given)."""

    async def seen() -> Obj | None:
        found = cache.get(kind, name, namespace)
        if found is None or (version is not None and int(found["metadata"]["resourceVersion"]) < int(version)):
            return None
        return found

    return await eventually(seen, timeout=30)


def open_pass(client: Client, cache: Cache, obj: Obj) -> kit.ObjectPass:
    return kit.ObjectPass(client=client, cache=cache, events=EventRecorder(client, component=MANAGER), kind=KIND,
                          obj=obj, labels=LABELS, field_manager=MANAGER)  # fmt: skip


# --- status ledger -------------------------------------------------------------------------------------------------


async def test_the_ledger_writes_once_per_pass_and_not_at_all_when_unchanged(client: Client, namespace: str) -> None:
    store = await new_store(client, namespace)
    ledger = kit.StatusLedger(client, KIND, store, field_manager=MANAGER)
    ledger.stage("keys", 2)
    ledger.condition("Ready", True, "Published", "2 keys")
    ledger.condition("Degraded", False, "AsExpected", "fine")
    assert await ledger.flush()
    assert ledger.writes == 1
    fresh = await client.get(KIND, "s", namespace)
    assert fresh["status"]["keys"] == 2
    assert {c["type"]: c["status"] for c in fresh["status"]["conditions"]} == {"Ready": "True", "Degraded": "False"}
    again = kit.StatusLedger(client, KIND, fresh, field_manager=MANAGER)
    again.stage("keys", 2)
    again.condition("Ready", True, "Published", "2 keys")
    assert not await again.flush()
    assert again.writes == 0
    assert (await client.get(KIND, "s", namespace))["metadata"]["resourceVersion"] == fresh["metadata"][
        "resourceVersion"
    ]


async def test_a_record_is_committed_at_once_and_refused_from_a_stale_view(client: Client, namespace: str) -> None:
    store = await new_store(client, namespace)
    ledger = kit.StatusLedger(client, KIND, store, field_manager=MANAGER)
    assert await ledger.commit("rotation", {"request": "one", "phase": "Rotating"})
    assert (await client.get(KIND, "s", namespace))["status"]["rotation"] == {"request": "one", "phase": "Rotating"}
    assert not await ledger.commit("rotation", {"request": "one", "phase": "Rotating"})  # already says so: no write
    # someone else writes meanwhile: a commit decided from the view before that is refused
    stale = kit.StatusLedger(client, KIND, store, field_manager=MANAGER)
    with pytest.raises(ApiError) as refused:
        await stale.commit("rotation", {"request": "two", "phase": "Rotating"})
    assert refused.value.conflict
    # a record removed is gone from status, not left behind by the merge patch
    await ledger.commit("rotation", None)
    assert "rotation" not in ((await client.get(KIND, "s", namespace)).get("status") or {})
    # a record the CRD's schema does not declare would be pruned without a trace: said at once
    with pytest.raises(kit.PrunedFieldError, match=r"status\.undeclared"):
        await ledger.commit("undeclared", {"phase": "Starting"})


async def test_a_flush_after_a_concurrent_write_reads_again_and_keeps_the_other_writers_condition(
    client: Client, namespace: str
) -> None:
    store = await new_store(client, namespace)
    ledger = kit.StatusLedger(client, KIND, store, field_manager=MANAGER)
    conditions: list[Obj] = []
    set_condition(conditions, type="Other", status=True, reason="Theirs", message="x", observed_generation=1)
    await client.patch_status(KIND, "s", {"status": {"conditions": conditions}}, namespace)  # our view is stale now
    ledger.condition("Ready", True, "Published", "0 keys")
    assert await ledger.flush()
    final = (await client.get(KIND, "s", namespace))["status"]["conditions"]
    assert sorted(c["type"] for c in final) == ["Other", "Ready"]


# --- child writer --------------------------------------------------------------------------------------------------


async def test_the_child_writer_creates_leaves_alone_and_reverts(client: Client, namespace: str) -> None:
    store = await new_store(client, namespace)
    async with cache_of(client, namespace, CONFIG_MAP) as cache:
        desired = {"metadata": {"name": "s-data", "labels": LABELS.labels("s")}, "data": {"a": "1"}}
        ctx = open_pass(client, cache, store)
        assert await ctx.children.apply(CONFIG_MAP, desired) == "created"
        made = await cached(cache, CONFIG_MAP, "s-data", namespace)
        assert made["metadata"]["ownerReferences"][0]["uid"] == store["metadata"]["uid"]
        ctx = open_pass(client, cache, store)
        assert await ctx.children.apply(CONFIG_MAP, desired) == "unchanged"
        assert ctx.children.writes == 0
        # someone edits a field we own, and adds a key of their own: ours is reverted, theirs is theirs (server-side
        # apply shares the object; a list entry they add is reverted too, a map key is not)
        edited = await client.patch(CONFIG_MAP, "s-data", {"data": {"a": "2", "extra": "x"}}, namespace)
        await cached(cache, CONFIG_MAP, "s-data", namespace, edited["metadata"]["resourceVersion"])
        assert await ctx.children.apply(CONFIG_MAP, desired) == "updated"
        assert (await client.get(CONFIG_MAP, "s-data", namespace))["data"] == {"a": "1", "extra": "x"}


async def test_a_child_held_by_another_owner_is_a_conflict_and_never_written(client: Client, namespace: str) -> None:
    store = await new_store(client, namespace)
    other = await new_store(client, namespace, "other")
    async with cache_of(client, namespace, CONFIG_MAP, SECRET) as cache:
        theirs = open_pass(client, cache, other)
        assert (
            await theirs.children.apply(CONFIG_MAP, {"metadata": {"name": "s-data"}, "data": {"b": "2"}}) == "created"
        )
        await cached(cache, CONFIG_MAP, "s-data", namespace)
        ctx = open_pass(client, cache, store)
        assert await ctx.children.apply(CONFIG_MAP, {"metadata": {"name": "s-data"}, "data": {"a": "1"}}) == "conflict"
        assert await ctx.children.delete(CONFIG_MAP, "s-data") == "conflict"
        assert ctx.children.writes == 0
        assert ctx.problems.reasons() == ["ChildConflict"]
        assert "KeyValueStore other" in ctx.problems.ordered()[0].message
        assert (await client.get(CONFIG_MAP, "s-data", namespace))["data"] == {"b": "2"}
        assert await ctx.finish() == Result(requeue_after=10.0)  # looked at again: the other owner may be going


async def test_a_refused_write_becomes_a_problem_and_the_pass_goes_on(client: Client, namespace: str) -> None:
    store = await new_store(client, namespace)
    async with cache_of(client, namespace, CONFIG_MAP, SECRET) as cache:
        ctx = open_pass(client, cache, store)
        bad = {"metadata": {"name": "s-data"}, "data": {"not a key": "x"}}  # ConfigMap keys allow no spaces
        assert await ctx.children.apply(CONFIG_MAP, bad) == "rejected"
        assert await ctx.children.create_once(SECRET, {"metadata": {"name": "s-key"}, "stringData": {"k": "v"}},
                                              owned=False) == "created"  # fmt: skip
        assert ctx.problems.reasons() == ["ChildRejected"]
        assert "ConfigMap s-data (422)" in ctx.problems.ordered()[0].message
        # create-once adopts what is there and never overwrites it
        await cached(cache, SECRET, "s-key", namespace)
        again = open_pass(client, cache, store)
        assert await again.children.create_once(SECRET, {"metadata": {"name": "s-key"},
                                                         "stringData": {"k": "other"}}) == "unchanged"  # fmt: skip
        # a problem reaches Degraded and one Warning Event, once
        assert await ctx.finish() is None
        status = (await client.get(KIND, "s", namespace))["status"]
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "ChildRejected")

        async def warnings() -> list[Obj]:
            events, _ = await client.list(EVENT, namespace)
            return [e for e in events if e["reason"] == "ChildRejected" and e["type"] == "Warning"]

        assert len(await eventually(warnings)) == 1
        fresh = await cached(cache, KIND, "s", namespace)
        repeat = open_pass(client, cache, fresh)
        assert await repeat.children.apply(CONFIG_MAP, bad) == "rejected"
        await repeat.finish()
        assert [e.get("count", 1) for e in await warnings()] == [1]  # told once, not every pass


async def test_delete_removes_only_our_own_child(client: Client, namespace: str) -> None:
    store = await new_store(client, namespace)
    await client.create(CONFIG_MAP, {"metadata": {"name": "users", "namespace": namespace}, "data": {}})
    async with cache_of(client, namespace, CONFIG_MAP) as cache:
        ctx = open_pass(client, cache, store)
        await ctx.children.apply(CONFIG_MAP, {"metadata": {"name": "s-data"}, "data": {}})
        await cached(cache, CONFIG_MAP, "s-data", namespace)
        await cached(cache, CONFIG_MAP, "users", namespace)
        assert await ctx.children.delete(CONFIG_MAP, "s-data") == "deleted"
        assert await ctx.children.delete(CONFIG_MAP, "users") == "conflict"  # no owner: the user's, left alone
        assert await ctx.children.delete(CONFIG_MAP, "never-there") == "absent"
        assert ctx.problems.reasons() == []
        await client.get(CONFIG_MAP, "users", namespace)


# --- finalizer + deletionPolicy --------------------------------------------------------------------------------------


async def test_finalize_adds_first_cleans_up_on_deletion_and_keeps_other_finalizers(
    client: Client, namespace: str
) -> None:
    store = await new_store(client, namespace)
    calls: list[str] = []

    async def apply(obj: Obj) -> None:
        calls.append("apply:" + ",".join(obj["metadata"].get("finalizers") or []))

    async def cleanup(obj: Obj) -> None:
        calls.append("cleanup")

    await kit.finalize(client, KIND, store, "example.kanri.dev/cleanup", apply=apply, cleanup=cleanup)
    assert calls == ["apply:example.kanri.dev/cleanup"]  # added before the first apply
    added = await client.patch(KIND, "s", [{"op": "add", "path": "/metadata/finalizers/-", "value": "x.dev/keep"}],
                               namespace, patch_type="json")  # fmt: skip
    await client.delete(KIND, "s", namespace)
    deleting = await client.get(KIND, "s", namespace)
    assert deleting["metadata"]["resourceVersion"] != added["metadata"]["resourceVersion"]
    await kit.finalize(client, KIND, deleting, "example.kanri.dev/cleanup", apply=apply, cleanup=cleanup)
    assert calls[-1] == "cleanup"
    after = await client.get(KIND, "s", namespace)
    assert after["metadata"]["finalizers"] == ["x.dev/keep"]  # ours removed, the other controller's kept
    await kit.finalize(client, KIND, after, "example.kanri.dev/cleanup", apply=apply, cleanup=cleanup)
    assert calls.count("cleanup") == 1  # "done": our cleanup ran already


async def test_a_cleanup_that_writes_the_object_still_removes_the_finalizer_once(
    client: Client, namespace: str
) -> None:
    store = await new_store(client, namespace, "writes")
    cleanups: list[str] = []

    async def apply(obj: Obj) -> None:
        return None

    async def cleanup(obj: Obj) -> None:
        # a cleanup that records what it did on the object itself makes the object it was given stale
        cleanups.append(obj["metadata"]["resourceVersion"])
        await client.patch(
            KIND, "writes", {"metadata": {"annotations": {"example.kanri.dev/cleaned": "yes"}}}, namespace
        )

    await kit.finalize(client, KIND, store, "example.kanri.dev/cleanup", apply=apply, cleanup=cleanup)
    await client.patch(KIND, "writes", [{"op": "add", "path": "/metadata/finalizers/-", "value": "x.dev/keep"}],
                       namespace, patch_type="json")  # fmt: skip
    await client.delete(KIND, "writes", namespace)
    deleting = await client.get(KIND, "writes", namespace)
    await kit.finalize(client, KIND, deleting, "example.kanri.dev/cleanup", apply=apply, cleanup=cleanup)
    after = await client.get(KIND, "writes", namespace)
    assert after["metadata"]["finalizers"] == ["x.dev/keep"], after["metadata"]  # ours gone despite the conflict
    assert len(cleanups) == 1, cleanups  # and the cleanup ran once, not again for the conflict it caused


async def test_retain_keeps_the_data_and_releases_it_delete_deletes_it(client: Client, namespace: str) -> None:
    kept = await new_store(client, namespace, "kept")
    gone = await new_store(client, namespace, "gone", deletionPolicy="Delete")
    async with cache_of(client, namespace, SECRET) as cache:
        for owner in (kept, gone):
            name = owner["metadata"]["name"]
            secret = {"metadata": {"name": f"{name}-key", "namespace": namespace, "labels": LABELS.labels(name)},
                      "stringData": {"key": "k"}}  # fmt: skip
            await client.create(SECRET, secret)
            # an owner reference added by hand would let the garbage collector take kept data
            ref = {"apiVersion": KIND.api_version, "kind": KIND.kind, "name": name, "uid": owner["metadata"]["uid"]}
            await client.patch(SECRET, f"{name}-key", {"metadata": {"ownerReferences": [ref]}}, namespace)
        # another operator's look-alike of the same owner name is never touched
        lookalike = {"metadata": {"name": "gone-valkey", "namespace": namespace,
                                  "labels": {**LABELS.labels("gone"), "app.kubernetes.io/name": "valkey"}}}  # fmt: skip
        await client.create(SECRET, lookalike)
        events = EventRecorder(client, component=MANAGER)
        for owner in (kept, gone):
            name = owner["metadata"]["name"]
            await cached(cache, SECRET, f"{name}-key", namespace)
            data = kit.data_of(cache, [SECRET], LABELS, owner)
            assert [o["metadata"]["name"] for _, o in data] == [f"{name}-key"]
            await kit.carry_out(kit.deletion_policy(owner), client, events, owner, data)
    assert (await client.get(SECRET, "kept-key", namespace))["metadata"].get("ownerReferences") is None
    with pytest.raises(ApiError) as missing:
        await client.get(SECRET, "gone-key", namespace)
    assert missing.value.not_found
    await client.get(SECRET, "gone-valkey", namespace)
    reasons = {e["reason"] for e in (await client.list(EVENT, namespace))[0]}
    assert {"DataRetained", "DataDeleted"} <= reasons


# --- one-shot pods ---------------------------------------------------------------------------------------------------


def job_pod(name: str) -> Obj:
    return {"metadata": {"name": name, "labels": LABELS.labels("s")},
            "spec": {"containers": [{"name": "job", "image": "example.invalid/job:1"}]}}  # fmt: skip


async def test_a_one_shot_pods_verdict_is_read_only_from_the_pod_the_operator_created(
    client: Client, namespace: str
) -> None:
    store = await new_store(client, namespace)
    async with cache_of(client, namespace, POD) as cache:
        ctx = open_pass(client, cache, store)
        pods = kit.OneShotPods(ctx)
        assert await pods.start(job_pod("s-job"))
        uid = ctx.ledger.status["oneShotPods"]["s-job"]  # committed at once
        assert (await client.get(KIND, "s", namespace))["status"]["oneShotPods"] == {"s-job": uid}
        pod = await cached(cache, POD, "s-job", namespace)
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pods.verdict("s-job", timeout=timedelta(hours=1)) is None  # still pending
        # the pod ends and answers (what the kubelet writes from the termination message)
        line = '{"message":"3 tables","result":"Succeeded","tables":3}'
        terminated = {"exitCode": 0, "reason": "Completed", "message": line,
                      "startedAt": "2026-12-06T06:00:00Z", "finishedAt": "2026-12-06T06:01:00Z"}  # fmt: skip
        status = {"phase": "Succeeded", "containerStatuses": [{"name": "job", "image": "example.invalid/job:1",
                  "imageID": "", "ready": False, "restartCount": 0, "state": {"terminated": terminated}}]}  # fmt: skip
        ended = await client.patch_status(POD, "s-job", {"status": status}, namespace)
        await cached(cache, POD, "s-job", namespace, ended["metadata"]["resourceVersion"])
        verdict = pods.verdict("s-job", timeout=timedelta(hours=1))
        assert verdict == kit.Verdict("Succeeded", "3 tables", {"tables": 3})
        # a pod someone else made under a one-shot name, with the owner reference forged, is never read or deleted
        forged = {**job_pod("s-forged"), "metadata": {**job_pod("s-forged")["metadata"], "ownerReferences": [
            {"apiVersion": KIND.api_version, "kind": KIND.kind, "name": "s", "uid": store["metadata"]["uid"],
             "controller": True}]}}  # fmt: skip
        await client.create(POD, {**forged, "metadata": {**forged["metadata"], "namespace": namespace}})
        await cached(cache, POD, "s-forged", namespace)
        assert pods.foreign("s-forged", "the job")
        assert pods.verdict("s-forged", timeout=timedelta(seconds=0)) is None
        await pods.clear("s-forged")
        await client.get(POD, "s-forged", namespace)  # still there
        assert ctx.problems.reasons() == ["ForeignPod"]
        # ours is cleared: deleted, and its record dropped
        await pods.clear("s-job")
        assert "oneShotPods" not in ((await client.get(KIND, "s", namespace)).get("status") or {})
        with pytest.raises(ApiError) as gone:  # never scheduled, so deleted at once
            await client.get(POD, "s-job", namespace)
        assert gone.value.not_found


# --- agent directory -------------------------------------------------------------------------------------------------


async def test_the_pod_directory_lists_only_this_operators_running_pods_and_the_token_comes_from_a_secret(
    client: Client, namespace: str
) -> None:
    store = await new_store(client, namespace)
    pods = {"s-0": LABELS.labels("s"), "s-1": LABELS.labels("s"),
            "valkey-s-0": {**LABELS.labels("s"), "app.kubernetes.io/name": "valkey"}}  # fmt: skip
    for i, (name, labels) in enumerate(pods.items()):
        body = {"metadata": {"name": name, "namespace": namespace, "labels": labels},
                "spec": {"containers": [{"name": "agent", "image": "example.invalid/agent:1"}]}}  # fmt: skip
        await client.create(POD, body)
        if name != "s-1":  # s-1 has no IP yet
            await client.patch_status(POD, name, {"status": {"podIP": f"10.0.0.{i + 1}"}}, namespace)
    token = {"metadata": {"name": "s-api", "namespace": namespace}, "stringData": {"token": "t0ken"}}
    await client.create(SECRET, token)
    async with cache_of(client, namespace, POD, SECRET) as cache:

        async def listed() -> dict[str, str]:
            return kit.pod_addresses(cache, LABELS, store)

        assert await eventually(listed, timeout=30) == {"s-0": "10.0.0.1"}
        await cached(cache, SECRET, "s-api", namespace)
        assert kit.secret_token(cache, namespace, "s-api") == "t0ken"
        assert kit.secret_token(cache, namespace, "s-api", "missing") is None
        assert kit.secret_token(cache, namespace, "nothing") is None
