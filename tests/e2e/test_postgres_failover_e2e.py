"""Failover under faults, end to end (issue 12): three nodes, real PostgreSQL, the chaos verbs, a ledger.

Each test runs a three-instance cluster on a host of three local nodes (one instance per node), a :class:`Ledger`
writing through ``-rw`` and recording every acknowledged commit, and a :class:`RoleWatcher` probing every instance
every 150 ms. A fault is injected for real with the host's chaos verbs; then what was promised is counted:

- mode Sync: no acknowledged commit is missing from the new primary;
- mode Async: whatever is missing is reported (``lastFailover.dataLossPossible``), and the reported position of the
  old primary is not below the last lost commit's WAL position;
- never two servers acknowledging ledger writes at once, and (mode Sync) never two instances taking the watcher's
  write in one round;
- the old primary comes back as a replica of the new timeline (``pg_rewind``), and every instance has every row.

The time from the fault to the first commit acknowledged by the new primary is printed (``-s`` shows it;
``bench/failover.py`` measures it over several runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import APPROVE, REJOIN, SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import EVENT, POD, PVC
from tests.e2e.ledger import Ack, Ledger, RoleWatcher, ids_on, lsn_bytes
from tests.e2e.postgres_helpers import (
    cluster,
    cluster_ip,
    credentials,
    pod_ips,
    ready,
)
from tests.local_node_support import running_nodes, with_test_network
from tests.postgres_support import Operator
from tests.support import NotYet, eventually

Obj = dict[str, Any]
NAME = "ha"

pytestmark = [pytest.mark.timeout(600), pytest.mark.faults]


@pytest_asyncio.fixture(loop_scope="session")
async def host(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[NodeHost]:
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path / "nodes",
            name=f"test-ha-{secrets.token_hex(3)}",
            images=default_image_map(),
            restart_backoff_base=0.5,
            restart_backoff_max=5.0,
        )
    )
    async with running_nodes(control_plane.kubeconfig, options, count=3) as nodes:
        yield nodes


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str) -> AsyncIterator[Operator]:
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances)
    finally:
        await instances.close()


def one_per_node() -> Obj:
    term = {"labelSelector": {"matchLabels": {"kanri.dev/cluster": NAME}}, "topologyKey": "kubernetes.io/hostname"}
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


async def status_of(client: Client, namespace: str) -> Obj:
    return dict((await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {})


async def event_reasons(client: Client, namespace: str) -> list[str]:
    items, _ = await client.list(EVENT, namespace)
    return [e["reason"] for e in items if (e.get("involvedObject") or {}).get("name") == NAME]


@contextlib.asynccontextmanager
async def workload(client: Client, namespace: str, *, write_probe: bool) -> AsyncIterator[tuple[Ledger, RoleWatcher]]:
    """The ledger through ``-rw`` and the role watcher over every pod, running until the block ends."""
    user, password = await credentials(client, namespace, NAME)
    rw = await cluster_ip(client, namespace, f"{NAME}-rw")
    addresses: dict[str, str] = dict(await pod_ips(client, namespace, NAME))
    ledger = Ledger(rw, user, password)
    await ledger.prepare()
    watcher = RoleWatcher(lambda: addresses, user, password, write_probe=write_probe)
    await watcher.prepare(rw)
    stop = asyncio.Event()

    async def follow_pods() -> None:  # a recreated pod gets a new address
        while not stop.is_set():
            with contextlib.suppress(Exception):
                addresses.clear()
                addresses.update(await pod_ips(client, namespace, NAME))
            await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(t) for t in (ledger.run(), watcher.run(), follow_pods())]
    try:
        yield ledger, watcher
    finally:
        ledger.stop()
        watcher.stop()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def primary_and_node(client: Client, namespace: str) -> tuple[str, str, str]:
    primary = str((await status_of(client, namespace))["currentPrimary"])
    pod = await client.get(POD, f"{primary}-0", namespace)
    return primary, str(pod["spec"]["nodeName"]), str(pod["status"]["podIP"])


async def failed_over_from(client: Client, namespace: str, old: str) -> Obj | None:
    status = await status_of(client, namespace)
    record = status.get("lastFailover") or {}
    if record.get("from") == old and status.get("currentPrimary") == record.get("to") and not status.get("failover"):
        return record
    return None


async def rejoined(client: Client, namespace: str, old: str) -> bool:
    claim = await client.get(PVC, old, namespace)
    if REJOIN in (claim["metadata"].get("annotations") or {}):
        return False
    return await ready(client, namespace, NAME, 3) is not None


async def rejoin_story(client: Client, namespace: str) -> tuple[int, str]:
    """The number of rejoin requests the operator sent (its ``Rejoining`` Events' counts) and the ``Rejoined``
    Event's message."""
    items, _ = await client.list(EVENT, namespace)
    mine = [e for e in items if (e.get("involvedObject") or {}).get("name") == NAME]
    asks = sum(int(e.get("count") or 1) for e in mine if e.get("reason") == "Rejoining")
    how = "; ".join(str(e.get("message")) for e in mine if e.get("reason") == "Rejoined")
    return asks, how


async def instances_agree(client: Client, namespace: str, ledger: Ledger) -> str | None:
    """None once every instance holds every acknowledged commit the primary kept; else what each one lacks.

    In mode Async a failover may lose acknowledged commits (the test counts and checks those against the report):
    waiting for all of them on every instance would never end then. What the primary kept, every instance must hold.
    """
    user, password = await credentials(client, namespace, NAME)
    on_primary = await ids_on(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
    if on_primary is None:
        return "the primary does not answer through -rw"
    wanted = ledger.acked_ids() & on_primary
    ips = await pod_ips(client, namespace, NAME)
    found = await asyncio.gather(*(ids_on(ip, user, password) for ip in ips.values()))
    lacking = {
        name: "no answer" if held is None else f"lacks {len(wanted - held)} of {len(wanted)}"
        for name, held in zip(ips, found, strict=True)
        if held is None or not wanted <= held
    }
    if len(ips) == 3 and not lacking:
        return None
    return f"{len(ips)} pods; {lacking}"


async def wait_until_instances_agree(client: Client, namespace: str, ledger: Ledger) -> None:
    last: list[str | None] = [None]

    async def agreed() -> bool:
        last[0] = await instances_agree(client, namespace, ledger)
        return last[0] is None

    try:
        await eventually(agreed, timeout=60, interval=1)
    except NotYet:
        raise NotYet(f"the instances do not hold what the primary kept after 60 s: {last[0]}") from None


async def run_fault(
    client: Client, host: NodeHost, operator: Operator, namespace: str, *, fault: str, recover: str, mode: str,
    record_property: Callable[[str, object], None] | None = None,
) -> tuple[Ledger, RoleWatcher, Obj, float]:  # fmt: skip
    """Create the cluster, run the workload, inject ``fault`` on the primary's node, wait for the failover, then
    ``recover`` the node and wait for the old primary to rejoin. Returns the workload, lastFailover and the time from
    the fault to the first commit the new primary acknowledged. Each phase's end (seconds since the cluster was
    created) goes to ``record_property`` (the JUnit report), so a slow run says which phase was slow."""
    started = time.monotonic()

    def phase(name: str) -> None:
        if record_property is not None:
            record_property(f"phase_{name}", round(time.monotonic() - started, 1))

    replication = {"mode": "Sync", "syncStandbys": 1} if mode == "Sync" else {"mode": "Async"}
    spec = {"replication": replication, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3, **spec))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
        phase("ready")
        async with workload(client, namespace, write_probe=mode == "Sync") as (ledger, watcher):
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
            old, node, old_ip = await primary_and_node(client, namespace)
            fault_at = time.monotonic()
            assert await host.chaos(fault, node)
            try:
                record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=90,
                                          interval=0.5)  # fmt: skip
                first = await eventually(functools.partial(ack_elsewhere, ledger, fault_at, old_ip), timeout=30)
            except NotYet:
                print(await diagnosis(client, str(operator.control_plane.kubeconfig), namespace, ledger))
                raise
            outage = first.at - fault_at
            phase("failed_over")
            print(
                f"\n{fault} ({mode}): first commit on the new primary {outage:.2f} s after the fault; "
                f"lastFailover {record}"
            )
            print(await promoted_line(str(operator.control_plane.kubeconfig), namespace, record))
            await asyncio.sleep(2)  # writes on the new timeline the old primary must not have
            assert await host.chaos(recover, node)
            await eventually(lambda: rejoined(client, namespace, old), timeout=180, interval=1)
            phase("rejoined")
            if record_property is not None:  # how many asks the rejoin took, and how it was done (a slow run's why)
                asks, how = await rejoin_story(client, namespace)
                record_property("rejoin_asks", asks)
                record_property("rejoined_by", how)
            await asyncio.sleep(1)
        await wait_until_instances_agree(client, namespace, ledger)
        phase("holds")
        reasons = await event_reasons(client, namespace)
        assert {"FailoverStarted", "FailedOver", "Rejoined", "FailoverLossMeasured"} <= set(reasons), reasons
        status = await status_of(client, namespace)
        degraded = get_condition(status.get("conditions"), "Degraded")
        assert degraded is not None
        # the old primary measured what it had written past the switchpoint before its rewind: the record's gap is
        # now that measurement (or the estimate, when the estimate was higher)
        measured = dict(status["lastFailover"])
        print(f"measured at the rejoin: {measured}")
        assert measured["divergedBytes"] is not None
        assert measured["lsnGapBytes"] >= measured["divergedBytes"]
        return ledger, watcher, measured, outage


async def diagnosis(client: Client, kubeconfig: str, namespace: str, ledger: Ledger) -> str:
    """What a failed wait leaves for the reader: the cluster's status, the ledger's counts and each instance's last
    log lines (``kubectl logs``)."""
    status = await status_of(client, namespace)
    lines = [f"status: {status!r:.3000}", f"ledger: {len(ledger.acks)} acks, {ledger.errors} errors, "
             f"last ack {ledger.acks[-1] if ledger.acks else None}"]  # fmt: skip
    for n in (1, 2, 3):
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace, "logs",
            "--tail=40", f"{NAME}-{n}-0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 20)
        except TimeoutError:
            proc.kill()
            out = b"(kubectl logs did not answer in 20 s)"
        lines += [f"--- {NAME}-{n}-0", out.decode(errors="replace")[-6000:]]
    return "\n".join(lines)


async def promoted_line(kubeconfig: str, namespace: str, record: Obj) -> str:
    """The promoted instance's own account of its promotion (where the time went), from ``kubectl logs``."""
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace, "logs",
        f"{record['to']}-0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return next((line for line in out.decode(errors="replace").splitlines() if '"promoted"' in line), "")


async def lost_commits(client: Client, namespace: str, ledger: Ledger) -> set[int]:
    user, password = await credentials(client, namespace, NAME)
    present = await ids_on(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
    assert present is not None
    return ledger.acked_ids() - present


async def test_a_frozen_primary_fails_over_in_sync_mode_without_losing_an_acknowledged_commit(
    client: Client, host: NodeHost, operator: Operator, namespace: str, record_property: Callable[[str, object], None]
) -> None:
    ledger, watcher, record, _ = await run_fault(client, host, operator, namespace, fault="freeze", recover="thaw",
                                                 mode="Sync", record_property=record_property)  # fmt: skip
    assert await lost_commits(client, namespace, ledger) == set()
    assert record["dataLossPossible"] is False
    assert ledger.servers_overlap() == []
    assert watcher.double_writers() == []
    assert len(watcher.rounds) > 20  # a round waits for its slowest probe (1 s for a frozen instance)


async def test_a_stopped_primary_node_fails_over_in_async_mode_and_every_loss_is_reported(
    client: Client, host: NodeHost, operator: Operator, namespace: str, record_property: Callable[[str, object], None]
) -> None:
    ledger, _, record, _ = await run_fault(client, host, operator, namespace, fault="stop", recover="start",
                                           mode="Async", record_property=record_property)  # fmt: skip
    lost = await lost_commits(client, namespace, ledger)
    # async: said at the promotion, lost or not; once the old primary measured what it discarded, only if anything
    # was (issue 29 item 13: never dataLossPossible with a gap of 0)
    assert record["dataLossPossible"] is (record["lsnGapBytes"] > 0), record
    if lost:
        # The reported gap covers every lost commit: from where the new timeline branched off to the last lost
        # commit's WAL position (as its own statement read it) is within it.
        last_lost = max(lsn_bytes(a.lsn) for a in ledger.acks if a.id in lost)
        print(f"lost {len(lost)} acknowledged commits (last at {last_lost}); reported gap {record['lsnGapBytes']}")
        assert record["lsnGapBytes"] >= last_lost - lsn_bytes(record["divergedAt"]), record
        assert record["divergedBytes"] > 0, record
    assert ledger.servers_overlap() == []


async def test_manual_policy_blocks_until_approved_and_survives_an_operator_restart(
    client: Client, host: NodeHost, operator: Operator, namespace: str
) -> None:
    spec = {"failover": {"policy": "Manual"}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3, **spec))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
        old, node, _ = await primary_and_node(client, namespace)
        assert await host.chaos("stop", node)

        async def blocked() -> Obj | None:
            found = get_condition((await status_of(client, namespace)).get("conditions"), "FailoverBlocked")
            return dict(found) if found is not None and found["status"] == "True" else None

        condition = await eventually(blocked, timeout=90, interval=0.5)
        assert condition["reason"] == "ManualPolicy"
    # The operator is gone mid-failover; nothing is promoted while it is, nor by the next one without approval.
    progress = (await status_of(client, namespace))["failover"]
    assert progress["phase"] == "Blocked"
    candidate = str(progress["target"])
    assert candidate != old
    async with operator.running(refresh=10.0):
        await asyncio.sleep(5)
        status = await status_of(client, namespace)
        assert status["failover"]["phase"] == "Blocked"
        assert status["currentPrimary"] == old
        await client.patch(POSTGRES_CLUSTER, NAME, {"metadata": {"annotations": {APPROVE: candidate}}}, namespace)
        record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=60, interval=0.5)
        assert record["to"] == candidate
        assert record["approvedBy"] == candidate
        assert await host.chaos("start", node)
        await eventually(lambda: rejoined(client, namespace, old), timeout=180, interval=1)
    assert "FailoverBlocked" in await event_reasons(client, namespace)


async def test_a_partitioned_primary_fences_itself_before_a_replica_is_promoted(
    client: Client, host: NodeHost, operator: Operator, namespace: str, record_property: Callable[[str, object], None]
) -> None:
    ledger, watcher, _record, _ = await run_fault(client, host, operator, namespace, fault="partition", recover="heal",
                                                 mode="Sync", record_property=record_property)  # fmt: skip
    assert await lost_commits(client, namespace, ledger) == set()
    assert ledger.servers_overlap() == []
    assert watcher.double_writers() == []


async def test_a_switchover_under_load_loses_nothing_and_needs_no_rewind(
    client: Client, host: NodeHost, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3, podTemplate=one_per_node()))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
        async with workload(client, namespace, write_probe=True) as (ledger, watcher):
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
            old, _, old_ip = await primary_and_node(client, namespace)
            target = next(i for i in (f"{NAME}-1", f"{NAME}-2", f"{NAME}-3") if i != old)
            asked_at = time.monotonic()
            patch = {"metadata": {"annotations": {SWITCHOVER: target}}}
            await client.patch(POSTGRES_CLUSTER, NAME, patch, namespace)
            record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=90, interval=0.5)
            first = await eventually(functools.partial(ack_elsewhere, ledger, asked_at, old_ip), timeout=30)
            print(f"\nswitchover: first commit on {target} {first.at - asked_at:.2f} s after the request; {record}")
            await eventually(lambda: ready(client, namespace, NAME, 3), timeout=120, interval=1)
            await asyncio.sleep(1)
        assert record["to"] == target
        assert record["reason"] == "Switchover"
        assert record["dataLossPossible"] is False
        assert await lost_commits(client, namespace, ledger) == set()
        assert ledger.servers_overlap() == []
        assert watcher.double_writers() == []
        await wait_until_instances_agree(client, namespace, ledger)
        reasons = await event_reasons(client, namespace)
        assert "SwitchedOver" in reasons
        assert "Rejoining" not in reasons  # the old primary followed as a replica without pg_rewind
        claim = await client.get(PVC, old, namespace)
        assert REJOIN not in (claim["metadata"].get("annotations") or {})


def postmaster_of(pod_uid: str) -> int | None:
    """The host PID of the postmaster in the pod ``pod_uid``: of the ``postgres`` processes in that pod's cgroup
    (``…/pod<uid>/…``: containers run in mount namespaces, so paths do not tell the pods apart), the one whose parent
    is not a ``postgres`` process (it is the instance manager's child)."""

    def comm_and_parent(pid: str) -> tuple[str, str] | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        return comm, stat.rsplit(")", 1)[1].split()[1]

    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if f"/pod{pod_uid}/" not in Path(f"/proc/{entry}/cgroup").read_text():
                continue
        except OSError:
            continue
        found = comm_and_parent(entry)
        if found is None or found[0] != "postgres":
            continue
        parent = comm_and_parent(found[1])
        if parent is not None and parent[0] != "postgres":
            return int(entry)
    return None


async def test_the_primarys_postgresql_killed_repeatedly_loses_no_acknowledged_commit(
    client: Client, host: NodeHost, operator: Operator, namespace: str
) -> None:
    """SIGKILL the primary's postmaster three times, each time once writes were taken again: whether the instance
    manager restarts it in place or the operator fails over, mode Sync loses nothing and never two primaries."""
    spec = {"replication": {"mode": "Sync", "syncStandbys": 1}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3, **spec))
    outcomes: list[str] = []
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
        async with workload(client, namespace, write_probe=True) as (ledger, watcher):
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
            for _ in range(3):
                primary, _, _ = await primary_and_node(client, namespace)
                pid: int = await eventually(functools.partial(_postmaster, client, namespace, primary), timeout=30)
                killed_at = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                first = await eventually(functools.partial(_ack_after, ledger, killed_at), timeout=90)
                now_primary = str((await status_of(client, namespace))["currentPrimary"])
                outcomes.append(f"{primary}: writes again after {first.at - killed_at:.2f} s on {now_primary}")
                await eventually(lambda: ready(client, namespace, NAME, 3), timeout=180, interval=1)
            await asyncio.sleep(1)
        print("\npostmaster killed:", "; ".join(outcomes))
        await wait_until_instances_agree(client, namespace, ledger)
    assert await lost_commits(client, namespace, ledger) == set()
    assert ledger.servers_overlap() == []
    assert watcher.double_writers() == []


async def _ack_after(ledger: Ledger, moment: float) -> Ack | None:
    return ledger.first_ack_after(moment)


async def ack_elsewhere(ledger: Ledger, moment: float, old_server: str) -> Ack | None:
    """The first commit acknowledged after ``moment`` by a server other than ``old_server`` (the new primary)."""
    return next((a for a in ledger.acks if a.at > moment and a.server != old_server), None)


async def _postmaster(client: Client, namespace: str, instance: str) -> int | None:
    pod = await client.get(POD, f"{instance}-0", namespace)
    return postmaster_of(str(pod["metadata"]["uid"]))


@contextlib.asynccontextmanager
async def operator_process(operator: Operator, namespace: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``kanri run`` in a process of its own, which the test may SIGKILL; killed at the end if still running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kanri.cli.main", "run", f"--kubeconfig={operator.control_plane.kubeconfig}",
        f"--namespace={namespace}", "--no-leader-election", "--health-port=0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def failover_phase(client: Client, namespace: str) -> str | None:
    progress = (await status_of(client, namespace)).get("failover") or {}
    return str(progress["phase"]) if progress.get("phase") else None


async def test_an_operator_killed_in_the_middle_of_a_failover_is_finished_by_the_next_one_exactly_once(
    client: Client, host: NodeHost, operator: Operator, namespace: str
) -> None:
    """The primary's node is frozen; the operator (its own process) is SIGKILLed as soon as it has recorded the
    failover's first phase. A new operator resumes from the recorded phase: one promotion, nothing lost (Sync)."""
    spec = {"replication": {"mode": "Sync", "syncStandbys": 1}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3, **spec))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
    async with workload(client, namespace, write_probe=True) as (ledger, watcher):
        await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
        old, node, old_ip = await primary_and_node(client, namespace)
        async with operator_process(operator, namespace) as first:
            await asyncio.sleep(5)  # its caches filled and the primary seen healthy
            fault_at = time.monotonic()
            assert await host.chaos("freeze", node)
            phase = await eventually(lambda: failover_phase(client, namespace), timeout=90, interval=0.05)
            first.kill()
        cut = await status_of(client, namespace)
        assert cut.get("failover"), f"the failover finished before the kill (phase {phase}): nothing was cut"
        print(f"\noperator killed in phase {cut['failover']['phase']}")
        async with operator.running(refresh=10.0):
            record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=90, interval=0.5)
            await eventually(functools.partial(ack_elsewhere, ledger, fault_at, old_ip), timeout=60)
            await asyncio.sleep(2)
            assert await host.chaos("thaw", node)
            await eventually(lambda: rejoined(client, namespace, old), timeout=180, interval=1)
            await asyncio.sleep(1)
            await wait_until_instances_agree(client, namespace, ledger)
    assert record["dataLossPossible"] is False
    assert await lost_commits(client, namespace, ledger) == set()
    assert ledger.servers_overlap() == []
    assert watcher.double_writers() == []
    reasons = await event_reasons(client, namespace)
    assert reasons.count("FailedOver") == 1, reasons
    promoted = {s for r in watcher.rounds for i, s in r.items() if s == "primary+write" and i != old}
    assert len(promoted) <= 1


async def test_a_primary_frozen_during_a_switchover_ends_with_one_primary_and_nothing_lost(
    client: Client, host: NodeHost, operator: Operator, namespace: str
) -> None:
    """A switchover is asked for; as soon as it is recorded (Demoting) the primary's node is frozen. Whether the
    demotion got through or the operator fails over after the window, mode Sync loses nothing, one primary ends."""
    spec = {"replication": {"mode": "Sync", "syncStandbys": 1}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3, **spec))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
        async with workload(client, namespace, write_probe=True) as (ledger, watcher):
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
            old, node, old_ip = await primary_and_node(client, namespace)
            target = next(i for i in (f"{NAME}-1", f"{NAME}-2", f"{NAME}-3") if i != old)
            await client.patch(POSTGRES_CLUSTER, NAME, {"metadata": {"annotations": {SWITCHOVER: target}}}, namespace)
            phase = await eventually(lambda: failover_phase(client, namespace), timeout=60, interval=0.05)
            fault_at = time.monotonic()
            assert await host.chaos("freeze", node)
            record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=120, interval=0.5)
            first = await eventually(functools.partial(ack_elsewhere, ledger, fault_at, old_ip), timeout=60)
            print(f"\nfrozen in phase {phase}; ended as {record['reason']} to {record['to']}; first commit on the "
                  f"new primary {first.at - fault_at:.2f} s after the freeze")  # fmt: skip
            await asyncio.sleep(2)
            assert await host.chaos("thaw", node)
            await eventually(lambda: ready(client, namespace, NAME, 3), timeout=180, interval=1)
            await asyncio.sleep(1)
        await wait_until_instances_agree(client, namespace, ledger)
    assert record["dataLossPossible"] is False
    assert await lost_commits(client, namespace, ledger) == set()
    assert ledger.servers_overlap() == []
    assert watcher.double_writers() == []
    status = await status_of(client, namespace)
    assert not status.get("failover")
    cluster_obj = await client.get(POSTGRES_CLUSTER, NAME, namespace)
    assert SWITCHOVER not in (cluster_obj["metadata"].get("annotations") or {})


async def test_a_primary_node_stopped_while_the_operator_was_down_fails_over_by_itself_bounded_by_the_replicas(
    client: Client, host: NodeHost, operator: Operator, namespace: str, record_property: Callable[[str, object], None]
) -> None:
    """Issue 29 item 11: no operator runs when the primary's node stops, so no operator saw the primary's last WAL
    position. The one that starts 20 s later — longer than its own detection could vouch for — bounds the loss with
    what the replicas' WAL receivers last heard of the primary (their instance managers remembered it), measured
    against the node's last Lease renewal once the node is marked Ready=Unknown, and fails over by itself in mode
    Async; lastFailover and the FailedOver Event say where the position came from. Before, it blocked
    (DataLossUnknown) until a human approved."""
    spec = {"replication": {"mode": "Async"}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3, **spec))
    started = time.monotonic()
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
    record_property("phase_ready", round(time.monotonic() - started, 1))
    async with workload(client, namespace, write_probe=False) as (ledger, _):
        await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
        old, node, _ = await primary_and_node(client, namespace)
        assert await host.chaos("stop", node)  # the operator is down: nobody sees the primary's last position
        await asyncio.sleep(20)  # longer than the operator's own detection can vouch for the replicas' evidence
        async with operator.running(refresh=10.0):
            try:
                record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=90,
                                          interval=0.5)  # fmt: skip
            except NotYet:
                print(await diagnosis(client, str(operator.control_plane.kubeconfig), namespace, ledger))
                raise
            record_property("phase_failed_over", round(time.monotonic() - started, 1))
            print(f"\nafter an operator outage: lastFailover {record}")
            assert record["primaryLSNSource"] == "Replicas", record
            assert "approvedBy" not in record  # by itself
            assert record["dataLossPossible"] is True
            assert await host.chaos("start", node)
            await eventually(lambda: rejoined(client, namespace, old), timeout=180, interval=1)
            record_property("phase_rejoined", round(time.monotonic() - started, 1))
    items, _ = await client.list(EVENT, namespace)
    (told,) = [e["message"] for e in items if e["involvedObject"]["name"] == NAME and e["reason"] == "FailedOver"]
    assert "as last seen by the replicas" in told, told
    assert "its node last renewed its Lease" in told, told  # anchored on the node's silence, not the detection
    lost = await lost_commits(client, namespace, ledger)
    measured = (await status_of(client, namespace))["lastFailover"]
    if lost:  # whatever was lost is within the reported (then measured) gap
        last_lost = max(lsn_bytes(a.lsn) for a in ledger.acks if a.id in lost)
        assert measured["lsnGapBytes"] >= last_lost - lsn_bytes(measured["divergedAt"]), measured
    assert ledger.servers_overlap() == []
