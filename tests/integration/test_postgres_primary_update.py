"""Updating the primary by switchover (primary_update.py), against the real API server and StatefulSet controller.

The operator's real reconciler and HTTP client; instance managers doubled at the HTTP boundary (the failover
tests' :class:`HaFake`, which also restarts and applies pending parameters on demotion as the real one does); a
stand-in kubelet that marks every pod the StatefulSet controller (re)creates Running and Ready at its instance's
address. What is proven: the order (replicas, then the switchover, then the old primary as a replica), that a
restart lowering standby limits restarts the primary first in place, and that a switchover that does not happen
leaves the update waiting, not retrying, until the spec changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from kanri.local.controlplane import Endpoint
from kanri.postgres.api.v1alpha1.storage import DEFAULT_REQUESTS
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha import switchover
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import POD, STATEFUL_SET
from tests.integration.test_postgres_failover import HaFake, event_reasons, ready, role_label, status_of
from tests.integration.test_postgres_reconciler import SYSID, pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import NotYet, eventually

Obj = dict[str, Any]
NEW_CPU = {"requests": {"cpu": "150m"}}
OLD_CPU = DEFAULT_REQUESTS["cpu"]
"""What an instance requests before the change: the default (the cluster names no resources)."""


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


class UpdateFake(HaFake):
    """An :class:`HaFake` that also answers ``POST /restart``; both a restart and a demotion (a restart as a
    replica) apply the pending parameters, as the real instance manager's do."""

    async def start(self, port: int) -> int:
        app = web.Application()
        app.router.add_get("/status", self._status)
        for path in ("/replication/pause", "/replication/resume", "/promote", "/demote", "/fence", "/unfence",
                     "/rejoin", "/restart"):  # fmt: skip
            app.router.add_post(path, self._update_action)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.address, port).start()
        self.port = int(self.runner.addresses[0][1])
        return self.port

    async def _update_action(self, request: web.Request) -> web.Response:
        if request.path in ("/restart", "/demote"):
            self.report.update(pendingRestart=False, pendingRestartLowers=[])
        if request.path == "/restart":
            self.asked.append("/restart")
            return web.json_response({"restarting": True})
        return await self._action(request)


@contextlib.asynccontextmanager
async def fakes_for(cluster: str, count: int) -> AsyncIterator[tuple[dict[str, UpdateFake], HttpInstanceClient]]:
    """``<cluster>-1`` primary, the others streaming replicas, every one at 0/3000060."""
    prefix = f"127.79.{secrets.randbelow(250) + 1}"
    fakes: dict[str, UpdateFake] = {}
    for n in range(1, count + 1):
        fake = UpdateFake(f"{cluster}-{n}", f"{prefix}.{n}", "primary" if n == 1 else "replica")
        fake.report.update(systemIdentifier=SYSID, dataVersion=16, binaryVersion=16, problems=[])
        fakes[fake.name] = fake
    port = 0
    for fake in fakes.values():
        port = await fake.start(port)
    instances = HttpInstanceClient(port=port, timeout=1.0, plain=True)  # the fakes serve plain HTTP
    try:
        yield fakes, instances
    finally:
        await instances.close()
        for fake in fakes.values():
            with contextlib.suppress(Exception):
                await fake.runner.cleanup()


async def kubelet(client: Client, namespace: str, fakes: dict[str, UpdateFake]) -> None:
    """Each pod of an instance Running and Ready at the fake's address, including those recreated by a rollout."""
    while True:
        with contextlib.suppress(Exception):
            pods, _ = await client.list(POD, namespace)
            for pod in pods:
                instance = pod["metadata"]["name"].removesuffix("-0")
                fake = fakes.get(instance)
                status = pod.get("status") or {}
                if fake is None or pod["metadata"].get("deletionTimestamp"):
                    continue
                if status.get("podIP") and (get_condition(status.get("conditions"), "Ready") or {}).get("status"):
                    continue
                await client.patch_status(POD, pod["metadata"]["name"], {"status": running(fake.address)}, namespace)
        await asyncio.sleep(0.2)


def running(address: str) -> Obj:
    started = "2026-12-02T00:00:00Z"
    return {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}],
            "containerStatuses": [{"name": "postgres", "ready": True, "restartCount": 0, "image": "x", "imageID": "",
                                   "state": {"running": {"startedAt": started}}, "lastState": {}}]}  # fmt: skip


@contextlib.asynccontextmanager
async def running_cluster(
    control_plane: Endpoint, client: Client, namespace: str, name: str, **spec: Any
) -> AsyncIterator[tuple[dict[str, UpdateFake], Operator]]:
    """A two-instance cluster created and Ready under the operator and the stand-in kubelet."""
    async with contextlib.AsyncExitStack() as stack:
        fakes, instances = await stack.enter_async_context(fakes_for(name, 2))
        await client.create(POSTGRES_CLUSTER, pgc(name, namespace, replicas=len(fakes), **spec))
        operator = Operator(control_plane, namespace, instances=instances)
        pods = asyncio.create_task(kubelet(client, namespace, fakes))
        stack.push_async_callback(_cancel, pods)
        await stack.enter_async_context(operator.running(refresh=0.5))
        await eventually(lambda: ready(client, namespace, name), timeout=60)
        yield fakes, operator


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def cpu_of(client: Client, namespace: str, instance: str) -> str | None:
    sts = await client.get(STATEFUL_SET, instance, namespace)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    return ((container.get("resources") or {}).get("requests") or {}).get("cpu")


async def _value(value: Any) -> Any:
    return value


async def test_a_template_change_rolls_the_replica_then_switches_over_then_rolls_the_old_primary(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with running_cluster(control_plane, client, namespace, "ru") as (fakes, _):
        await client.patch(POSTGRES_CLUSTER, "ru", {"spec": {"resources": NEW_CPU}}, namespace)
        # The replica first; the primary's turn demotes it (a switchover), it is not rolled in place.
        await eventually(lambda: _value("/demote" in fakes["ru-1"].asked or None), timeout=60)
        assert await cpu_of(client, namespace, "ru-2") == "150m"
        assert await cpu_of(client, namespace, "ru-1") == OLD_CPU  # not rolled yet
        progress = (await status_of(client, namespace, "ru"))["failover"]
        assert (progress["reason"], progress["from"], progress["target"]) == ("RollingUpdate", "ru-1", "ru-2")
        # Not rolled while the target has not received the shutdown checkpoint (never two at once).
        assert await cpu_of(client, namespace, "ru-1") == OLD_CPU  # not rolled yet
        fakes["ru-2"].report.update(receiveLsn="0/3000128", replayLsn="0/3000128")

        async def switched() -> Obj | None:
            return (await status_of(client, namespace, "ru")).get("lastFailover")

        record = await eventually(switched, timeout=30)
        assert (record["from"], record["to"], record["reason"]) == ("ru-1", "ru-2", "RollingUpdate")
        assert record["dataLossPossible"] is False
        # Then the old primary, now a replica, is rolled; the cluster ends Ready on its new primary.
        await eventually(lambda: _is(cpu_of(client, namespace, "ru-1"), "150m"), timeout=60)

        async def converged() -> Obj | None:
            status = await status_of(client, namespace, "ru")
            progressing = get_condition(status.get("conditions"), "Progressing") or {}
            ok = status.get("phase") == "Ready" and progressing.get("reason") == "Converged"
            return status if ok and status.get("currentPrimary") == "ru-2" else None

        await eventually(converged, timeout=60)
        assert await role_label(client, namespace, "ru-2") == "primary"
        assert await role_label(client, namespace, "ru-1") == "replica"
        assert fakes["ru-1"].asked.count("/demote") == 1
        assert "/restart" not in fakes["ru-1"].asked
        reasons = await event_reasons(client, namespace, "ru")
        assert {"SwitchoverStarted", "SwitchedOver"} <= set(reasons)
        assert "FailoverStarted" not in reasons


async def _is(value: Awaitable[Any], wanted: Any) -> bool:
    return bool(await value == wanted)


async def test_a_pending_restart_restarts_the_replica_then_switches_over_instead_of_restarting_the_primary(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with running_cluster(control_plane, client, namespace, "pr") as (fakes, _):
        for fake in fakes.values():
            fake.report["pendingRestart"] = True
        await eventually(lambda: _value("/demote" in fakes["pr-1"].asked or None), timeout=60)
        assert fakes["pr-2"].asked.count("/restart") == 1  # the replica first
        fakes["pr-2"].report.update(receiveLsn="0/3000128", replayLsn="0/3000128")

        async def switched() -> Obj | None:
            return (await status_of(client, namespace, "pr")).get("lastFailover")

        record = await eventually(switched, timeout=30)
        assert (record["from"], record["to"], record["reason"]) == ("pr-1", "pr-2", "PendingRestart")
        await eventually(lambda: ready(client, namespace, "pr"), timeout=30)
        # The demotion restarted pr-1 with the new parameters: it is never restarted on its own.
        assert "/restart" not in fakes["pr-1"].asked
        assert fakes["pr-2"].asked.count("/restart") == 1


async def test_a_restart_lowering_a_standby_limit_restarts_the_primary_first_in_place(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with running_cluster(control_plane, client, namespace, "lo") as (fakes, _):
        for fake in fakes.values():
            fake.report.update(pendingRestart=True, pendingRestartLowers=["max_connections"])
        # A switchover would promote a replica still running the higher limit; the demoted primary, its standby
        # with the lower one, could not start. So: the primary first, in place, then the replica.
        await eventually(lambda: _value("/restart" in fakes["lo-2"].asked or None), timeout=60)
        assert fakes["lo-1"].asked == ["/restart"]
        assert "/demote" not in fakes["lo-1"].asked
        assert (await status_of(client, namespace, "lo")).get("lastFailover") is None


async def test_an_abandoned_switchover_leaves_the_primary_update_waiting_until_the_spec_changes(
    control_plane: Endpoint, client: Client, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(switchover, "SWITCHOVER_TIMEOUT", 3.0)  # the target never catches up: no need for 60 s
    async with running_cluster(control_plane, client, namespace, "ab") as (fakes, operator):
        await client.patch(POSTGRES_CLUSTER, "ab", {"spec": {"resources": NEW_CPU}}, namespace)

        seen: list[object] = []

        async def waiting() -> Obj | None:
            status = await status_of(client, namespace, "ab")
            progressing = get_condition(status.get("conditions"), "Progressing") or {}
            seen[:] = [progressing.get("reason"), status.get("failover"), status.get("currentPrimary")]
            done = progressing.get("reason") == "PrimaryUpdateWaiting" and not status.get("failover")
            return status if done and status.get("currentPrimary") == "ab-1" else None

        # the replica's restart, the switchover's start and its 3 s timeout, each a pass or more apart: 27 s on a
        # quiet machine, more than 60 s once in a loaded CI run (both tiers at once)
        try:
            status = await eventually(waiting, timeout=150)
        except NotYet as exc:
            raise AssertionError(f"{exc}; last seen (Progressing reason, failover, currentPrimary): {seen}") from exc
        assert status["primaryUpdate"]["reason"] == "SwitchoverAbandoned"
        assert "ab-2" in status["primaryUpdate"]["message"]
        (progressing,) = [c for c in status["conditions"] if c["type"] == "Progressing"]
        assert "primaryUpdateStrategy InPlace" in progressing["message"]
        assert status["lastFailover"]["to"] == "ab-1"  # promoted back: it has every commit
        assert await role_label(client, namespace, "ab-1") == "primary"
        # It waits: no second switchover, the primary not rolled, over many passes.
        passes = operator.reconciles()
        await eventually(lambda: _value(operator.reconciles() >= passes + 12 or None), timeout=30)
        assert fakes["ab-1"].asked.count("/demote") == 1
        assert await cpu_of(client, namespace, "ab-1") == OLD_CPU  # not rolled yet
        assert "SwitchoverAbandoned" in await event_reasons(client, namespace, "ab")
        # A new spec (here: in place) moves it on; the record goes once the primary is updated.
        await client.patch(POSTGRES_CLUSTER, "ab", {"spec": {"primaryUpdateStrategy": "InPlace"}}, namespace)
        await eventually(lambda: _is(cpu_of(client, namespace, "ab-1"), "150m"), timeout=60)

        async def cleared() -> bool:
            status = await status_of(client, namespace, "ab")
            return "primaryUpdate" not in status and status.get("phase") == "Ready"

        await eventually(cleared, timeout=60)
        assert fakes["ab-1"].asked.count("/demote") == 1
