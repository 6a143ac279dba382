"""Split brain, end to end (issue 12): a replica promoted by hand is fenced; ``-rw`` keeps only the recorded primary.

Real control plane, local node, real PostgreSQL 15 and instance managers, the operator's real Manager. The hostile
round's finding: ``select pg_promote()`` on a replica made it win (highest timeline), both pods were labelled primary,
``-rw`` had two ready endpoints and writes split between them while status said Ready. Here a watcher samples the
``-rw`` EndpointSlice from the promotion on: it must never hold two ready addresses.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any

import aiohttp
import psycopg

from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import ROLE
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import ENDPOINT_SLICE, EVENT, POD, PVC, SECRET
from tests.e2e.postgres_helpers import (
    cluster,
    connect,
    credentials,
    pod_ips,
    ready,
    ready_with_row,
    rows_on,
    write_row,
)
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
NAME = "twin"


async def superuser(client: Client, namespace: str) -> tuple[str, str]:
    secret = await client.get(SECRET, f"{NAME}-superuser", namespace)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return data["username"], data["password"]


async def rw_ready_addresses(client: Client, namespace: str) -> list[str]:
    slices = (await client.list(ENDPOINT_SLICE, namespace, label_selector=f"kubernetes.io/service-name={NAME}-rw"))[0]
    return sorted(
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready", True)
        for address in e["addresses"]
    )


async def status_of(client: Client, namespace: str) -> Obj:
    return (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}


async def degraded(client: Client, namespace: str, reason: str) -> Obj | None:
    found = get_condition((await status_of(client, namespace)).get("conditions"), "Degraded")
    return dict(found) if found is not None and found["status"] == "True" and found["reason"] == reason else None


async def role_label(client: Client, namespace: str, instance: str) -> str | None:
    pod = await client.get(POD, f"{instance}-0", namespace)
    return (pod["metadata"].get("labels") or {}).get(ROLE)


async def refuses_connections(host: str, user: str, password: str) -> bool:
    try:
        async with await connect(host, user, password, "postgres"):
            return False
    except psycopg.OperationalError:
        return True


async def instance_status(client: Client, namespace: str, host: str) -> Obj:
    # the instance API serves TLS (the operator verifies it with the cluster's CA; this look needs no proof); /status
    # needs the cluster's API token, as the operator sends it
    secret = await client.get(SECRET, f"{NAME}-api", namespace)
    headers = {"Authorization": f"Bearer {base64.b64decode(secret['data']['token']).decode()}"}
    async with aiohttp.ClientSession() as http, http.get(f"https://{host}:8008/status", ssl=False,
                                                         headers=headers) as response:  # fmt: skip
        body: Obj = await response.json()
        return body


async def split_brain_events(client: Client, namespace: str) -> list[Obj]:
    events = (await client.list(EVENT, namespace))[0]
    return [e for e in events if e.get("reason") == "SplitBrain" and e.get("type") == "Warning"
            and (e.get("involvedObject") or {}).get("name") == NAME]  # fmt: skip


async def test_a_replica_promoted_by_hand_is_fenced_and_rw_keeps_only_the_recorded_primary(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 3))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, NAME, 3)
        primary = str((await status_of(client, namespace))["currentPrimary"])
        ips = await pod_ips(client, namespace, NAME)
        rogue = sorted(name.removesuffix("-0") for name in ips if not name.startswith(f"{primary}-"))[0]
        other = next(name.removesuffix("-0") for name in ips if name.removesuffix("-0") not in (primary, rogue))
        primary_ip, rogue_ip, other_ip = ips[f"{primary}-0"], ips[f"{rogue}-0"], ips[f"{other}-0"]
        await eventually(lambda: _is(rw_ready_addresses(client, namespace), [primary_ip]), timeout=30, interval=0.5)

        # -rw must never route to two instances: sampled from the promotion until the rogue is fenced
        seen: list[list[str]] = []
        stop = asyncio.Event()

        async def watch_rw() -> None:
            while not stop.is_set():
                seen.append(await rw_ready_addresses(client, namespace))
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch_rw())
        user, password = await superuser(client, namespace)
        # the operator may fence the rogue before this session ends — even while pg_promote() still waits for the
        # end of recovery, which it polls for: the fence's fast shutdown then ends the session (AdminShutdown)
        with contextlib.suppress(psycopg.errors.AdminShutdown):
            async with await connect(rogue_ip, user, password, "postgres") as conn:
                await conn.execute("SELECT pg_promote()")  # waits until the replica is out of recovery
                # a write only the rogue takes: the divergence the fence keeps away from clients
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("INSERT INTO t VALUES (99)")
        try:
            await eventually(lambda: _is(role_label(client, namespace, rogue), "fenced"), timeout=60, interval=0.5)
            app_user, app_password = await credentials(client, namespace, NAME)
            await eventually(lambda: refuses_connections(rogue_ip, app_user, app_password), timeout=60, interval=0.5)
            await eventually(lambda: _is(rw_ready_addresses(client, namespace), [primary_ip]), timeout=60, interval=0.5)
        finally:
            stop.set()
            await watcher
        assert seen, "the watcher never sampled -rw"
        assert all(len(addresses) <= 1 for addresses in seen), [a for a in seen if len(a) > 1][:3]
        assert all(addresses in ([], [primary_ip]) for addresses in seen), seen[-3:]

        # what kubectl describe shows: Degraded SplitBrain naming both, the record, the fenced instance
        condition = await eventually(lambda: degraded(client, namespace, "SplitBrain"), timeout=60, interval=0.5)
        for text in (primary, rogue, "timeline 1", "timeline 2", "the primary the operator recorded",
                     "docs/postgres-operator.md"):  # fmt: skip
            assert text in condition["message"], (text, condition["message"])
        status = await status_of(client, namespace)
        record = status["splitBrain"]
        assert (record["kept"]["name"], record["kept"]["timeline"], record["keptBy"]) == (primary, 1, "LastPrimary")
        assert [(f["name"], f["timeline"]) for f in record["fenced"]] == [(rogue, 2)]
        assert record["kept"]["lsn"]
        assert record["fenced"][0]["lsn"]
        assert (status["currentPrimary"], status["phase"]) == (primary, "Degraded")
        roles = {i["name"]: i["role"] for i in status["instances"]}
        assert roles == {primary: "Primary", rogue: "Fenced", other: "Replica"}
        reported = await instance_status(client, namespace, rogue_ip)
        assert (reported["fenced"], reported["running"], reported["ready"]) == (True, False, False)
        assert [p["reason"] for p in reported["problems"]] == ["Fenced"]
        # the record stays on the primary's claim: a restarted operator keeps the same primary
        claim = await client.get(PVC, primary, namespace)
        assert claim["metadata"]["annotations"]["kanri.dev/last-primary"] == "true"

        # writes go on through -rw, to the recorded primary and its replica
        await write_row(client, namespace, NAME, 2)
        await eventually(lambda: _is(rows_on(other_ip, app_user, app_password), [1, 2]), timeout=60, interval=0.5)
        assert await rows_on(primary_ip, app_user, app_password) == [1, 2]
        # one Warning Event for the occurrence, however many passes saw it
        events = await eventually(lambda: split_brain_events(client, namespace), timeout=30, interval=0.5)
        assert len(events) == 1, events
        assert (events[0].get("count") or 1) == 1, events
        assert rogue in events[0]["message"]
        assert primary in events[0]["message"]

        # the documented recovery: discard the fenced instance's volume; it re-clones as a replica of the primary
        await client.delete(PVC, rogue, namespace)
        await client.delete(POD, f"{rogue}-0", namespace)
        await eventually(lambda: _no_split_brain(client, namespace), timeout=240, interval=1)
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=180, interval=1)
        assert (await status_of(client, namespace))["currentPrimary"] == primary
        assert await role_label(client, namespace, rogue) == "replica"
        new_ip = (await pod_ips(client, namespace, NAME))[f"{rogue}-0"]
        await eventually(lambda: _is(rows_on(new_ip, app_user, app_password), [1, 2]), timeout=60, interval=0.5)
        assert len(await split_brain_events(client, namespace)) == 1


async def _no_split_brain(client: Client, namespace: str) -> bool:
    status = await status_of(client, namespace)
    found = get_condition(status.get("conditions"), "Degraded")
    return "splitBrain" not in status and found is not None and found["reason"] != "SplitBrain"


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
