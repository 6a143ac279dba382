"""Restricted pods (issue 16 item 3), end to end: in a namespace whose Pod Security Admission level is ``restricted``
(enforced by the real API server), a PostgresCluster's pods are admitted, run real PostgreSQL and become Ready.

The first step proves the API server enforces the level at all: a pod that runs as root is refused in the same
namespace, so the cluster becoming Ready is not a test that could not fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import NAMESPACE, POD
from tests.e2e.postgres_helpers import cluster, ready, ready_with_row
from tests.postgres_support import Operator

Obj = dict[str, Any]
PSA = "pod-security.kubernetes.io"
RESTRICTED = {f"{PSA}/enforce": "restricted", f"{PSA}/enforce-version": "latest"}


def root_pod(namespace: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "as-root", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "kanri.dev/postgres:15",
                                     "securityContext": {"runAsUser": 0}}]}}  # fmt: skip


async def test_a_cluster_becomes_ready_in_a_restricted_namespace(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.patch(NAMESPACE, namespace, {"metadata": {"labels": RESTRICTED}})
    with pytest.raises(ApiError) as refused:
        await client.create(POD, root_pod(namespace))
    assert refused.value.status == 403
    assert 'violates PodSecurity "restricted:latest"' in refused.value.message, refused.value.message

    await client.create(POSTGRES_CLUSTER, cluster("locked", namespace, 1))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, "locked", 1)  # admitted, running, and PostgreSQL takes writes
        assert await ready(client, namespace, "locked", 1)
    running = await client.get(POD, "locked-1-0", namespace)  # as admitted: the restricted fields are kept
    (container,) = running["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert running["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
