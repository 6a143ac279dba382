"""The agent's pod label on the real API server, with the access the operator gives it (kanri.cache.children): a
token of the Cache's agent ServiceAccount may get and patch its Cache's pods and nothing else, and
:class:`~kanri.cache.agent.labels.PodLabel` writes the role, puts back a label someone removed, takes the
``primary`` label from another pod once its pod is the Sentinels' sole primary, and outlives an API server that
refuses (tests/unit/test_cache_agent_labels.py: one that does not answer). With real valkey-server processes under
the agent's code: a replica whose primary freezes leaves ``-ro`` by itself once past ``readPolicy.maxLagSeconds``,
with no operator running, and the operator's pass puts it back once it has caught up, never from a look older than
the withdrawal (kanri.cache.agent.readable)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from valkey.exceptions import ValkeyError

from kanri.cache.agent.fencing import History
from kanri.cache.agent.labels import VERIFY_EVERY, ApiServer, LabelError, PodLabel
from kanri.cache.agent.node import history, manage_role, runtime_config, start_server
from kanri.cache.agent.readable import MAX_LAG_SECONDS, READABLE, WITHDRAWN_AT, ReadGuard, bound_of, within_bound
from kanri.cache.api import CacheSpec
from kanri.cache.children import ROLE, agent_role, agent_role_binding, agent_service_account
from kanri.cache.config import server_config
from kanri.cache.observe import assess
from kanri.cache.steps import label_pods
from kanri.local.controlplane import Endpoint
from kanri.runtime import Client
from kanri.runtime.kinds import POD, ROLE_BINDING, SERVICE_ACCOUNT, SUBJECT_ACCESS_REVIEW
from kanri.runtime.kinds import ROLE as RBAC_ROLE
from tests.cache_support import BINARY, LocalCache
from tests.support import eventually

Obj = dict[str, Any]


def pod(name: str) -> Obj:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "valkey", "image": "kanri.dev/valkey:9.1"}]}}


def ca_file(control_plane: Endpoint, tmp_path: Path) -> Path:
    cluster = yaml.safe_load(control_plane.kubeconfig.read_text())["clusters"][0]["cluster"]
    path = tmp_path / "ca.crt"
    if "certificate-authority-data" in cluster:
        path.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    else:
        path.write_bytes((control_plane.kubeconfig.parent / cluster["certificate-authority"]).read_bytes())
    return path


async def agent_api(client: Client, control_plane: Endpoint, namespace: str, tmp_path: Path) -> ApiServer:
    """The ServiceAccount, Role and RoleBinding the operator writes for cache ``orders`` (2 pods), and a token of
    that ServiceAccount as the kubelet would mount it."""
    for kind, body in ((SERVICE_ACCOUNT, agent_service_account("orders")), (RBAC_ROLE, agent_role("orders", 2)),
                       (ROLE_BINDING, agent_role_binding("orders"))):  # fmt: skip
        await client.create(kind, {**body, "metadata": {**body["metadata"], "namespace": namespace}})
    # the API server's authorizer learns new RBAC objects from its own watch, a moment later: wait until it grants
    # the agent what the Role says, so that the tests see the agent's behaviour and not that moment
    user = f"system:serviceaccount:{namespace}:orders-agent"
    review = {"spec": {"user": user, "resourceAttributes": {"namespace": namespace, "verb": "patch",
                                                           "resource": "pods", "name": "orders-1"}}}  # fmt: skip

    async def granted() -> bool:
        return bool((await client.create(SUBJECT_ACCESS_REVIEW, review))["status"].get("allowed"))

    await eventually(granted, timeout=30)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    answer = await client.create_subresource(SERVICE_ACCOUNT, "orders-agent", "token", request, namespace)
    token = tmp_path / "token"
    token.write_text(answer["status"]["token"])
    server = urlsplit(control_plane.server)
    assert server.hostname is not None
    assert server.port is not None
    return ApiServer(server.hostname, server.port, ca_file(control_plane, tmp_path), token)


async def test_the_agent_labels_its_own_pod_and_no_other(
    client: Client, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    for name in ("orders-1", "orders-2", "payments-0"):
        await client.create(POD, {**pod(name), "metadata": {"name": name, "namespace": namespace}})
    api = await agent_api(client, control_plane, namespace, tmp_path)
    now = [0.0]
    label = PodLabel(api, namespace, "orders-1", ROLE, clock=lambda: now[0])

    async def labels(name: str) -> dict[str, str]:
        return dict((await client.get(POD, name, namespace))["metadata"].get("labels") or {})

    await label.keep("primary")
    assert (await labels("orders-1")).get(ROLE) == "primary"
    await label.keep("replica")  # a step-down is written at once, not at the next read-back
    assert (await labels("orders-1")).get(ROLE) == "replica"
    # the operator removed it (it could not reach the server): put back at the next read-back, not before
    await client.patch(POD, "orders-1", {"metadata": {"labels": {ROLE: None}}}, namespace)
    now[0] += 1.0
    await label.keep("replica")
    assert ROLE not in await labels("orders-1")
    now[0] += 5.0
    await label.keep("replica")
    assert (await labels("orders-1")).get(ROLE) == "replica"

    # the primary a majority of Sentinels name takes the label from another pod of its cache (a cut-off old primary's)
    sole = PodLabel(api, namespace, "orders-1", ROLE, others=("orders-0",), clock=lambda: now[0])
    await sole.keep("primary", sole=True)  # orders-0 does not exist (yet): nothing to do, no failure
    assert not sole.failing
    await client.create(POD, {**pod("orders-0"), "metadata": {"name": "orders-0", "namespace": namespace,
                                                                "labels": {ROLE: "primary"}}})  # fmt: skip
    await sole.keep("primary")  # not (yet) named by a majority: other pods are left alone
    assert (await labels("orders-0")).get(ROLE) == "primary"
    await sole.keep("primary", sole=True)  # once it is: at once, not at the next read-back
    assert ROLE not in await labels("orders-0")
    assert (await labels("orders-1")).get(ROLE) == "primary"

    # the Role names orders-0 and orders-1 only: a pod past the StatefulSet's count, or another cache's, is refused
    for other in ("orders-2", "payments-0"):
        with pytest.raises(LabelError, match="403"):
            await PodLabel(api, namespace, other, ROLE).write("primary")
        assert ROLE not in await labels(other)
    with pytest.raises(LabelError, match="403"):
        await api.request("GET", f"/api/v1/namespaces/{namespace}/secrets")


RO_SPEC = CacheSpec.model_validate(
    {"dataPolicy": "Regenerable", "replicas": 2, "readPolicy": {"serveFrom": "Replicas", "maxLagSeconds": 2}}
)
BOUND = 2


async def start_agent_pod(cache: LocalCache, index: int, label: PodLabel) -> None:
    """Pod ``index``'s server under the agent's whole job, as ``python -m kanri.cache.agent server`` runs it: the
    role and its label, and the ``-ro`` guard. No Sentinel: the fault below must not fail over."""
    pod = cache.pods[index]
    config = pod.dir / "valkey.conf"
    config.write_text(runtime_config("\n".join(server_config(cache.spec)), pod.server, data_dir=pod.dir))
    pod.process = await start_server(BINARY, config)
    pod.role = asyncio.create_task(manage_role(pod.server, publish=label.offer, guard=ReadGuard(label).offer))


async def look(cache: LocalCache) -> dict[str, History | None]:
    """The operator's look at the servers, keyed by pod name; a replica's primary named by its pod's DNS name, as
    the servers announce themselves in a cluster (here they are 127.0.0.1 ports)."""
    pods = {pod.server.me: f"{cache.name}-{pod.index}" for pod in cache.pods}
    seen: dict[str, History | None] = {}
    for address, history_ in zip(pods, await cache.histories(), strict=True):
        if history_ is not None and history_.primary_host in pods:
            history_ = replace(history_, primary_host=f"{pods[history_.primary_host]}.{cache.name}-hl:6379")
        seen[pods[address]] = history_
    return seen


async def operator_pass(client: Client, namespace: str, view: dict[str, History | None]) -> None:
    """The labelling part of the operator's pass (kanri.cache.steps.observe_pods), from the look ``view``."""
    silent = {name: (h.silent_seconds if h is not None else None) for name, h in view.items()}
    seen = assess(view, silent, RO_SPEC.read_policy)
    pods, _ = await client.list(POD, namespace)
    await label_pods(client, namespace, pods, seen, view, RO_SPEC.read_policy)


async def test_a_replica_leaves_ro_by_itself_past_its_bound_and_the_operator_puts_it_back(
    client: Client, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    for name in ("orders-0", "orders-1"):
        await client.create(POD, {**pod(name), "metadata": {"name": name, "namespace": namespace}})
    api = await agent_api(client, control_plane, namespace, tmp_path)
    labels = [PodLabel(api, namespace, f"orders-{index}", ROLE) for index in (0, 1)]
    cache = LocalCache(tmp_path / "cache", RO_SPEC)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    acked: list[float] = []

    async def metadata(name: str) -> Obj:
        meta = (await client.get(POD, name, namespace))["metadata"]
        return {"labels": {}, "annotations": {}} | dict(meta)

    async def write() -> None:  # a client writing every 50 ms: the replica hears its primary all the time
        writer = cache.client(cache.pods[0].server.me)
        try:
            while not stop.is_set():
                with contextlib.suppress(ValkeyError, OSError):
                    await writer.set("tick", loop.time())
                    acked.append(loop.time())
                await asyncio.sleep(0.05)
        finally:
            await writer.aclose()

    try:
        for index in (0, 1):
            await start_agent_pod(cache, index, labels[index])

        async def linked() -> bool:
            replica = (await look(cache))["orders-1"]
            labelled = (await metadata("orders-1"))["labels"].get(ROLE) == "replica"
            return replica is not None and replica.link_up and labelled

        await eventually(linked, timeout=30)
        writer = asyncio.create_task(write())
        before = await look(cache)  # the operator's look before the fault: the replica within its bound
        await operator_pass(client, namespace, before)
        routed = await metadata("orders-1")
        assert routed["labels"].get(READABLE) == "true"
        assert routed["annotations"][MAX_LAG_SECONDS] == str(BOUND)

        async def told() -> bool:  # at its next look at its own pod (every VERIFY_EVERY s), no request of its own
            return bound_of(labels[1].seen) == BOUND

        await eventually(told, timeout=VERIFY_EVERY + 5)

        # no operator from here: the primary freezes, its replica hears nothing
        cache.freeze(0)
        frozen = loop.time()
        await asyncio.sleep(0.1)
        last_heard = max(t for t in acked if t <= frozen)
        reported: list[float] = []

        async def gone() -> float | None:  # and when the server itself first reports silence past the bound
            replica = await history(cache.pods[1].server, cache.pods[1].server.me)  # not the frozen one: no wait
            if not reported and replica is not None and not within_bound(replica.silent_seconds, BOUND):
                reported.append(loop.time())
            return loop.time() if READABLE not in (await metadata("orders-1")).get("labels", {}) and reported else None

        left = await eventually(gone, timeout=BOUND + 10, interval=0.05)
        exceeded = last_heard + BOUND
        print(f"\n-ro left {left - exceeded:.2f} s after the replica's data passed the {BOUND} s bound, "
              f"{left - reported[0]:.2f} s after its server first reported it")  # fmt: skip
        assert left - exceeded < 4.0, f"left -ro {left - exceeded:.2f} s after the bound was exceeded"
        withdrawn = await metadata("orders-1")
        assert WITHDRAWN_AT in withdrawn["annotations"]

        # the operator's look from before the fault, written after the withdrawal: the pod stays out
        await operator_pass(client, namespace, before)
        assert READABLE not in (await metadata("orders-1"))["labels"]
        # and a fresh look while the primary is still frozen: past the bound, out
        await operator_pass(client, namespace, await look(cache))
        assert READABLE not in (await metadata("orders-1"))["labels"]

        cache.freeze(0, frozen=False)

        async def back() -> Obj | None:  # the operator's pass, every 0.5 s here (5 s in the operator)
            await operator_pass(client, namespace, await look(cache))
            found = await metadata("orders-1")
            return found if found["labels"].get(READABLE) == "true" else None

        returned = await eventually(back, timeout=20, interval=0.5)
        assert WITHDRAWN_AT not in (returned.get("annotations") or {})
        stop.set()
        await writer
    finally:
        stop.set()
        await cache.close()
