"""The agent's pod label on the real API server, with the access the operator gives it (kanri.cache.children): a
token of the Cache's agent ServiceAccount may get and patch its Cache's pods and nothing else, and
:class:`~kanri.cache.agent.labels.PodLabel` writes the role, puts back a label someone removed, takes the
``primary`` label from another pod once its pod is the Sentinels' sole primary, and outlives an API server that
refuses (tests/unit/test_cache_agent_labels.py: one that does not answer)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from kanri.cache.agent.labels import ApiServer, LabelError, PodLabel
from kanri.cache.children import ROLE, agent_role, agent_role_binding, agent_service_account
from kanri.local.controlplane import Endpoint
from kanri.runtime import Client
from kanri.runtime.kinds import POD, ROLE_BINDING, SERVICE_ACCOUNT
from kanri.runtime.kinds import ROLE as RBAC_ROLE

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
