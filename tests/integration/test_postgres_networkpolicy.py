"""The NetworkPolicy the operator writes, against the real API server: it admits the operator from the namespace the
operator says it runs in (``OperatorOptions.operator_namespace``, which ``kanri run`` takes from ``POD_NAMESPACE``),
not from a hard-coded ``kanri-system``. (The local cluster does not enforce NetworkPolicy; the policy's semantics are
checked in tests/unit/test_postgres_networkpolicy.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest_asyncio

from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.operator import OperatorOptions, build_manager
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import NETWORK_POLICY
from tests.postgres_support import install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    """The conftest's client, with the PostgresCluster CRD installed and Established."""
    await install_postgres_crd(client)
    return client


async def _operator_peer(client: Client, namespace: str, options: OperatorOptions) -> Obj:
    """Run the operator until the cluster's NetworkPolicy exists; the peer it admits to the instance API (8008)."""
    cluster = {"apiVersion": POSTGRES_CLUSTER.api_version, "kind": "PostgresCluster",
               "metadata": {"name": "orders", "namespace": namespace},
               "spec": {"version": 16, "replicas": 1, "storage": {"size": "1Gi"}}}  # fmt: skip
    await client.create(POSTGRES_CLUSTER, cluster)
    instances = HttpInstanceClient()
    manager = build_manager(client, options, instances=instances)
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:

        async def policy() -> Obj | None:
            try:
                return await client.get(NETWORK_POLICY, "orders", namespace)
            except ApiError as exc:
                if exc.not_found:
                    return None
                raise

        found = await eventually(policy, timeout=30)
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
        await instances.close()
    (rule,) = [r for r in found["spec"]["ingress"] if [p["port"] for p in r["ports"]] == [8008]]
    (peer,) = rule["from"]
    return dict(peer)


async def test_the_policy_admits_the_operator_from_its_own_namespace(client: Client, namespace: str) -> None:
    options = OperatorOptions(namespace=namespace, leader_election=False, health_port=None, refresh=1.0,
                              leader_election_namespace=namespace, operator_namespace="platform-ops")  # fmt: skip
    peer = await _operator_peer(client, namespace, options)
    assert peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "platform-ops"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kanri-operator"}},
    }
