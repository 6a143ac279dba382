"""The failover state machine against the real API server, with instance managers doubled at the HTTP boundary.

The fast tier of the failover tests: the real kube-apiserver, the operator's real reconciler and HTTP client, and
instance-manager doubles that answer the contract (``/status``, ``/replication/pause``, ``/promote``, ``/demote``,
...) and record what they were asked. The real thing — PostgreSQL, the chaos verbs, a ledger — is in
``tests/e2e/test_postgres_failover_e2e.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest_asyncio
from aiohttp import web

from kanri.local.controlplane import Endpoint
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import APPROVE, REJOIN, SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.operator import OperatorOptions, build_manager
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT, POD, PVC
from tests.integration.test_postgres_reconciler import SYSID, FakeInstance, pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


class HaFake(FakeInstance):
    """A :class:`FakeInstance` that also answers the failover actions, and can be made to stop answering."""

    def __init__(self, name: str, address: str, role: str) -> None:
        super().__init__(name, address, role)
        self.asked: list[str] = []
        self.port = 0
        self.hang: dict[str, float] = {}
        """Seconds an action waits after it was carried out before it answers (a response the operator loses)."""
        self.refuse: set[str] = set()
        """Actions answered 503 without being carried out."""
        self.then: dict[str, Callable[[], object]] = {}
        """Called once an action was carried out, before it answers (e.g. killing the operator)."""
        self.freeze_on: set[str] = set()
        """Actions on whose arrival the fake freezes: from then on nothing is carried out or answered (a primary
        whose node was frozen while it was being asked)."""
        self.thawed = asyncio.Event()
        self.thawed.set()

    async def start(self, port: int) -> int:
        app = web.Application()
        app.router.add_get("/status", self._frozen_or_status)
        for path in ("/replication/pause", "/replication/resume", "/promote", "/demote", "/fence", "/unfence",
                     "/rejoin"):  # fmt: skip
            app.router.add_post(path, self._action)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.address, port).start()
        self.port = int(self.runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        """Stop answering (a frozen or lost primary)."""
        await self.runner.cleanup()

    @property
    def frozen(self) -> bool:
        return not self.thawed.is_set()

    async def _hold_while_frozen(self) -> None:
        await self.thawed.wait()

    async def _frozen_or_status(self, request: web.Request) -> web.Response:
        await self._hold_while_frozen()
        return await self._status(request)

    async def _action(self, request: web.Request) -> web.Response:
        if request.path in self.freeze_on:
            self.asked.append(request.path)
            self.thawed.clear()
        await self._hold_while_frozen()
        if request.path in self.refuse:
            self.asked.append(request.path)
            return web.json_response({"error": "not now"}, status=503)
        response = self._carry_out(request.path)
        if (hook := self.then.get(request.path)) is not None:
            hook()
        await asyncio.sleep(self.hang.get(request.path, 0))
        return response

    def _carry_out(self, path: str) -> web.Response:
        self.asked.append(path)
        r = self.report
        if path == "/replication/pause":
            if r["role"] != "replica":
                return web.json_response({"error": "not a replica"}, status=409)
            r["replicationPaused"] = True
            return web.json_response({"paused": True, "receiveLsn": r["receiveLsn"], "replayLsn": r["replayLsn"],
                                      "timeline": r["timeline"]})  # fmt: skip
        if path == "/replication/resume":
            r["replicationPaused"] = False
            return web.json_response({"resumed": True})
        if path == "/promote":
            r.update(role="primary", inRecovery=False, timeline=r["timeline"] + 1, replicationPaused=False,
                     writeLsn=r["receiveLsn"])  # fmt: skip
            return web.json_response({"promoted": True, "timeline": r["timeline"], "lsn": r["writeLsn"]})
        if path == "/demote":
            r.update(role="replica", inRecovery=True, replayLsn="0/3000100", receiveLsn="0/3000100")
            return web.json_response({"demoted": True, "checkpointLsn": "0/3000100", "timeline": r["timeline"]})
        if path == "/fence":
            r.update(fenced=True, fenceReason="failover", running=False, ready=False)
            return web.json_response({"fenced": True})
        if path == "/unfence":
            r.update(fenced=False, fenceReason=None, running=True, ready=True)
            return web.json_response({"fenced": False})
        return web.json_response({"rejoin": "started"}, status=202)


@contextlib.asynccontextmanager
async def ha_fakes(cluster: str, lsns: dict[int, str]) -> AsyncIterator[tuple[dict[str, HaFake], HttpInstanceClient]]:
    """``<cluster>-1`` primary at 0/3000060, the others replicas that received ``lsns[n]``."""
    prefix = f"127.78.{secrets.randbelow(250) + 1}"
    fakes: dict[str, HaFake] = {}
    for n in (1, *lsns):
        fake = HaFake(f"{cluster}-{n}", f"{prefix}.{n}", "primary" if n == 1 else "replica")
        fake.report.update(systemIdentifier=SYSID, dataVersion=16, binaryVersion=16, problems=[])
        if n != 1:
            fake.report.update(receiveLsn=lsns[n], replayLsn=lsns[n])
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


async def pods_running(client: Client, namespace: str, fakes: dict[str, HaFake]) -> None:
    """What the kubelet would report once each pod's container runs, at the fake's address."""

    async def pods_exist() -> bool:
        present = {p["metadata"]["name"] for p in (await client.list(POD, namespace))[0]}
        return {f"{name}-0" for name in fakes} <= present

    await eventually(pods_exist, timeout=30)
    for name, fake in fakes.items():
        status = {"phase": "Running", "podIP": fake.address, "podIPs": [{"ip": fake.address}],
                  "containerStatuses": [{"name": "postgres", "ready": True, "restartCount": 0, "image": "x",
                                         "imageID": "", "state": {"running": {"startedAt": "2026-12-02T00:00:00Z"}},
                                         "lastState": {}}]}  # fmt: skip
        await client.patch_status(POD, f"{name}-0", {"status": status}, namespace)


async def status_of(client: Client, namespace: str, name: str) -> Obj:
    return dict((await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {})


async def ready(client: Client, namespace: str, name: str) -> bool:
    status = await status_of(client, namespace, name)
    return status.get("phase") == "Ready"


async def event_reasons(client: Client, namespace: str, name: str) -> list[str]:
    items, _ = await client.list(EVENT, namespace)
    return [e["reason"] for e in items if e["involvedObject"]["name"] == name]


@contextlib.asynccontextmanager
async def role_labels(client: Client, namespace: str, pod: str) -> AsyncIterator[list[str | None]]:
    """Every ``kanri.dev/role`` the pod's watch shows, in order (repeats dropped), while the block runs: a label
    that flips for one pass is caught, where polling could miss it."""
    items, version = await client.list(POD, namespace)
    seen: list[str | None] = [next((p["metadata"].get("labels") or {}).get("kanri.dev/role")
                                   for p in items if p["metadata"]["name"] == pod)]  # fmt: skip

    async def record() -> None:
        async for event in client.watch(POD, namespace, resource_version=version):
            obj = event.get("object") or {}
            if event.get("type") in ("ADDED", "MODIFIED") and obj.get("metadata", {}).get("name") == pod:
                label = (obj["metadata"].get("labels") or {}).get("kanri.dev/role")
                if label != seen[-1]:
                    seen.append(label)

    task = asyncio.create_task(record())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def role_label(client: Client, namespace: str, instance: str) -> str | None:
    pod = await client.get(POD, f"{instance}-0", namespace)
    return (pod["metadata"].get("labels") or {}).get("kanri.dev/role")


async def test_an_unanswering_primary_is_fenced_and_the_most_advanced_replica_promoted(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with ha_fakes("ha", {2: "0/3000000", 3: "0/3000040"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("ha", namespace))
        operator = Operator(control_plane, namespace, instances=instances)
        async with operator.running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "ha"), timeout=30)
            await fakes["ha-1"].stop()

            async def failed_over() -> Obj | None:
                return (await status_of(client, namespace, "ha")).get("lastFailover")

            record = await eventually(failed_over, timeout=40)
            assert record["from"] == "ha-1"
            assert record["to"] == "ha-3"  # received the most WAL
            assert record["reason"] == "PrimaryUnreachable"
            assert record["timeline"] == 2
            assert record["lsnGapBytes"] == 0x20  # 0/3000060 as last seen, against 0/3000040
            assert record["dataLossPossible"] is True  # async: it may have written more after it was last seen
            # Both replicas' receivers were paused before the choice; the loser streams again; ha-3 was promoted.
            assert fakes["ha-2"].asked[:1] == ["/replication/pause"]
            assert "/replication/resume" in fakes["ha-2"].asked
            assert fakes["ha-3"].asked[:2] == ["/replication/pause", "/promote"]
            assert await role_label(client, namespace, "ha-3") == "primary"
            assert await role_label(client, namespace, "ha-1") == "fenced"
            old_claim = await client.get(PVC, "ha-1", namespace)
            assert old_claim["metadata"]["annotations"][REJOIN] == "2"
            assert "kanri.dev/last-primary" not in old_claim["metadata"]["annotations"]

            async def converged() -> Obj | None:
                status = await status_of(client, namespace, "ha")
                return status if status.get("currentPrimary") == "ha-3" and not status.get("failover") else None

            status = await eventually(converged, timeout=20)
            assert status["timeline"] == 2

            def exported(name: str) -> float | None:
                return operator.registry.get_sample_value(name, {"namespace": namespace, "cluster": "ha"})

            await eventually(
                lambda: asyncio.sleep(0, exported("kanri_postgres_last_failover_lsn_gap_bytes")), timeout=10
            )
            assert exported("kanri_postgres_last_failover_lsn_gap_bytes") == 0x20
            assert exported("kanri_postgres_last_failover_data_loss_possible") == 1.0
            assert exported("kanri_postgres_failovers_total") is None  # by reason only
            labels = {"namespace": namespace, "cluster": "ha", "reason": "PrimaryUnreachable"}
            assert operator.registry.get_sample_value("kanri_postgres_failovers_total", labels) == 1.0
            reasons = await event_reasons(client, namespace, "ha")
            assert {"FailoverStarted", "FailedOver"} <= set(reasons)


async def test_a_gap_above_the_limit_blocks_until_approved(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with ha_fakes("rpo", {2: "0/3000000"}) as (fakes, instances):
        spec = {"replicas": 2, "failover": {"maxDataLossBytes": 16}}
        await client.create(POSTGRES_CLUSTER, pgc("rpo", namespace, **spec))
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "rpo"), timeout=30)
            await fakes["rpo-1"].stop()

            async def blocked() -> Obj | None:
                status = await status_of(client, namespace, "rpo")
                found = [c for c in status.get("conditions") or [] if c["type"] == "FailoverBlocked"]
                return status if found and found[0]["status"] == "True" else None

            status = await eventually(blocked, timeout=40)
            (cond,) = [c for c in status["conditions"] if c["type"] == "FailoverBlocked"]
            assert cond["reason"] == "DataLossAboveLimit"
            assert "rpo-2" in cond["message"]
            assert "96 bytes" in cond["message"]
            assert status["phase"] == "FailingOver"
            assert status["failover"]["phase"] == "Blocked"
            assert "/promote" not in fakes["rpo-2"].asked  # nothing promoted without approval
            assert "FailoverBlocked" in await event_reasons(client, namespace, "rpo")

            patch = {"metadata": {"annotations": {APPROVE: "rpo-2"}}}
            await client.patch(POSTGRES_CLUSTER, "rpo", patch, namespace)

            async def failed_over() -> Obj | None:
                return (await status_of(client, namespace, "rpo")).get("lastFailover")

            record = await eventually(failed_over, timeout=20)
            assert record["to"] == "rpo-2"
            assert record["approvedBy"] == "rpo-2"
            assert record["lsnGapBytes"] == 0x60
            cluster = await client.get(POSTGRES_CLUSTER, "rpo", namespace)
            assert APPROVE not in (cluster["metadata"].get("annotations") or {})  # one approval, one failover


async def test_a_switchover_demotes_the_primary_and_promotes_the_target_once_it_caught_up(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with ha_fakes("sw", {2: "0/3000060", 3: "0/3000060"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("sw", namespace))
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "sw"), timeout=30)
            async with role_labels(client, namespace, "sw-1-0") as history:
                asked = {"metadata": {"annotations": {SWITCHOVER: "sw-3"}}}
                await client.patch(POSTGRES_CLUSTER, "sw", asked, namespace)

                async def waiting_for_the_target() -> Obj | None:
                    progress = (await status_of(client, namespace, "sw")).get("failover") or {}
                    return progress if progress.get("phase") == "Promoting" else None

                progress = await eventually(waiting_for_the_target, timeout=20)
                assert "/demote" in fakes["sw-1"].asked

                async def phase() -> str | None:  # a planned switchover is no failure (issue 29 item 13)
                    found = str((await status_of(client, namespace, "sw")).get("phase"))
                    assert found not in ("FailingOver", "Degraded"), found
                    return found if found == "SwitchingOver" else None

                await eventually(phase, timeout=10)
                assert progress["checkpointLSN"] == "0/3000100"
                # The target has not received the shutdown checkpoint yet: no promotion.
                await asyncio.sleep(2)
                assert "/promote" not in fakes["sw-3"].asked
                fakes["sw-3"].report.update(receiveLsn="0/3000128", replayLsn="0/3000128")

                async def switched() -> Obj | None:
                    return (await status_of(client, namespace, "sw")).get("lastFailover")

                record = await eventually(switched, timeout=20)
                assert record["from"] == "sw-1"
                assert record["to"] == "sw-3"
                assert record["reason"] == "Switchover"

                async def relabelled_replica() -> bool:  # the pass after the switchover follows its report again
                    return history[-1] == "replica"

                await eventually(relabelled_replica, timeout=20)
            # -rw never went back to the demoted primary (a hot standby by then): the reports a pass reads before
            # it demotes are not followed for the instances a switchover routes itself
            assert history == ["primary", "fenced", "replica"], history
            assert record["lsnGapBytes"] == 0
            assert record["dataLossPossible"] is False
            old_claim = await client.get(PVC, "sw-1", namespace)
            assert REJOIN not in (old_claim["metadata"].get("annotations") or {})  # a clean demotion needs no rewind
            cluster = await client.get(POSTGRES_CLUSTER, "sw", namespace)
            assert SWITCHOVER not in (cluster["metadata"].get("annotations") or {})
            assert "SwitchedOver" in await event_reasons(client, namespace, "sw")


async def test_an_operator_stopped_after_promoting_but_before_recording_it_is_finished_by_its_successor(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    """The dangerous resume: the target was promoted but the operator never heard back (the response lost, the
    operator stopped). Its successor must find the target primary, record that one failover, and promote nobody
    else: a second promotion would make two primaries."""
    async with ha_fakes("resume", {2: "0/3000000", 3: "0/3000040"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("resume", namespace))
        fakes["resume-3"].hang["/promote"] = 5.0  # promoted at once; the answer never reaches the dead operator
        async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as own:
            options = OperatorOptions(namespace=namespace, leader_election=False, health_port=None, refresh=0.5,
                                      leader_election_namespace=namespace)  # fmt: skip
            manager = build_manager(own, options, instances=instances)
            first = asyncio.create_task(manager.run(handle_signals=False))
            fakes["resume-3"].then["/promote"] = first.cancel  # killed the moment the promotion is carried out
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "resume"), timeout=30)
            await fakes["resume-1"].stop()

            async def killed() -> bool:
                return first.done()

            await eventually(killed, timeout=40)
        assert fakes["resume-3"].asked.count("/promote") == 1
        progress = (await status_of(client, namespace, "resume")).get("failover") or {}
        assert progress.get("phase") == "Promoting", progress
        assert progress.get("target") == "resume-3"
        assert (await status_of(client, namespace, "resume")).get("lastFailover") is None, "not recorded yet"

        fakes["resume-3"].hang.clear()
        second = Operator(control_plane, namespace, instances=instances)
        async with second.running(refresh=0.5):

            async def recorded() -> Obj | None:
                status = await status_of(client, namespace, "resume")
                return status if status.get("lastFailover") and not status.get("failover") else None

            status = await eventually(recorded, timeout=30)
            assert status["lastFailover"]["to"] == "resume-3"
            assert status["lastFailover"]["from"] == "resume-1"
            assert status["currentPrimary"] == "resume-3"
            assert await role_label(client, namespace, "resume-3") == "primary"
        assert "/promote" not in fakes["resume-2"].asked, "a second replica was promoted: two primaries"
        assert fakes["resume-3"].asked.count("/promote") == 1, "the target was promoted again"
        assert fakes["resume-3"].report["timeline"] == 2
        assert status["timeline"] == 2


async def test_a_primary_lost_during_a_switchover_is_failed_over_instead_of_waiting_out_the_switchover(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    """The switchover's primary stops answering before it could be demoted: after the detection window the operator
    fails over (fence, pause, elect, guard) rather than keeping writes stopped until the 60 s switchover timeout."""
    async with ha_fakes("lost", {2: "0/3000060", 3: "0/3000040"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("lost", namespace))
        fakes["lost-1"].refuse.add("/demote")
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "lost"), timeout=30)
            await client.patch(POSTGRES_CLUSTER, "lost", {"metadata": {"annotations": {SWITCHOVER: "lost-3"}}},
                               namespace)  # fmt: skip

            async def demote_asked() -> bool:
                return "/demote" in fakes["lost-1"].asked

            await eventually(demote_asked, timeout=20)
            await fakes["lost-1"].stop()

            async def failed_over() -> Obj | None:
                return (await status_of(client, namespace, "lost")).get("lastFailover")

            record = await eventually(failed_over, timeout=40)  # well inside the 60 s switchover timeout
            assert record["reason"] == "PrimaryUnreachable"
            assert record["from"] == "lost-1"
            assert record["to"] == "lost-2", "the election chose the most advanced replica, not the switchover's target"
            assert "/replication/pause" in fakes["lost-3"].asked
            reasons = await event_reasons(client, namespace, "lost")
            assert "FailoverStarted" in reasons
            assert "SwitchoverFailed" not in reasons
            cluster = await client.get(POSTGRES_CLUSTER, "lost", namespace)
            assert SWITCHOVER not in (cluster["metadata"].get("annotations") or {})
            assert await role_label(client, namespace, "lost-1") == "fenced"


async def test_a_replica_whose_resume_was_lost_after_a_failover_streams_again(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    """The resume at the end of a failover does not reach one replica: once the failover is recorded, the operator
    sees that replica still paused with no failover in progress and resumes it (in Sync mode the new primary's only
    standby may be that replica: left paused, it would stop every write)."""
    async with ha_fakes("lost-resume", {2: "0/3000000", 3: "0/3000040"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("lost-resume", namespace))
        operator = Operator(control_plane, namespace, instances=instances)
        async with operator.running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "lost-resume"), timeout=30)
            loser = fakes["lost-resume-2"]
            loser.refuse.add("/replication/resume")
            await fakes["lost-resume-1"].stop()

            async def failed_over() -> Obj | None:
                status = await status_of(client, namespace, "lost-resume")
                return status.get("lastFailover") if not status.get("failover") else None

            record = await eventually(failed_over, timeout=40)
            assert record["to"] == "lost-resume-3"
            assert loser.report["replicationPaused"] is True
            assert "/replication/resume" in loser.asked  # asked, and refused
            loser.refuse.clear()
            await eventually(lambda: asyncio.sleep(0, loser.report["replicationPaused"] is False), timeout=20)
            reasons = await event_reasons(client, namespace, "lost-resume")
            assert "ReplicationResumed" in reasons


async def test_a_primary_frozen_while_it_is_being_demoted_is_failed_over_without_waiting_for_the_demote_timeout(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    """The switchover's demote request reaches the primary and the primary freezes: neither the request nor its
    status answers again. The operator, probing the status while it waits, gives the request up after the detection
    window and fails over, instead of holding the pass for the 60 s demote timeout."""
    async with ha_fakes("icy", {2: "0/3000060", 3: "0/3000040"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("icy", namespace))
        fakes["icy-1"].freeze_on.add("/demote")
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "icy"), timeout=30)
            await client.patch(POSTGRES_CLUSTER, "icy", {"metadata": {"annotations": {SWITCHOVER: "icy-3"}}},
                               namespace)  # fmt: skip
            await eventually(lambda: asyncio.sleep(0, fakes["icy-1"].frozen), timeout=20)

            async def failed_over() -> Obj | None:
                return (await status_of(client, namespace, "icy")).get("lastFailover")

            record = await eventually(failed_over, timeout=30)  # the demote timeout alone is 60 s
            assert record["reason"] == "PrimaryUnreachable"
            assert record["from"] == "icy-1"
            assert record["to"] == "icy-2"  # elected (most advanced), not the switchover's target
            reasons = await event_reasons(client, namespace, "icy")
            assert "FailoverStarted" in reasons
            assert "SwitchoverFailed" not in reasons
            assert await role_label(client, namespace, "icy-1") == "fenced"
            fakes["icy-1"].thawed.set()
