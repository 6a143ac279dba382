"""``kanri promote | restart | restore-test | hibernate | wake`` against the real API server: each writes the
documented annotation or field on a real PostgresCluster (so the API server's schema accepts it), and a refused
operation exits 1 and writes nothing."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner

from kanri.cli.main import app
from kanri.cli.operations import HIBERNATED_REPLICAS, RESTORE_TEST
from kanri.local.controlplane import Endpoint
from kanri.postgres.children.statefulset import RESTART
from kanri.postgres.ha.failover import APPROVE, SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from tests.integration.test_cli_status import installed  # noqa: F401  (the CRD fixture)

NAME = "shop"


async def kanri(control_plane: Endpoint, namespace: str, *args: str) -> tuple[int, str]:
    argv = [*args, "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    result = await asyncio.to_thread(CliRunner().invoke, app, argv)
    return result.exit_code, result.output


async def test_operations_write_the_documented_annotations_and_fields(
    installed: None,  # noqa: F811
    client: Client,
    namespace: str,
    control_plane: Endpoint,
) -> None:
    spec = {"version": 15, "replicas": 2, "storage": {"size": "1Gi"}, "backup": {"retentionDays": 14}}
    await client.create(POSTGRES_CLUSTER, {"metadata": {"name": NAME, "namespace": namespace}, "spec": spec})
    instances = [{"name": "shop-1", "role": "Primary", "ready": True}, {"name": "shop-2", "role": "Replica"}]
    await client.patch_status(POSTGRES_CLUSTER, NAME, {"status": {"currentPrimary": "shop-1", "instances": instances}},
                              namespace)  # fmt: skip

    async def annotations() -> dict[str, str]:
        obj = await client.get(POSTGRES_CLUSTER, NAME, namespace)
        return dict(obj["metadata"].get("annotations") or {})

    code, output = await kanri(control_plane, namespace, "promote", NAME, "shop-9")
    assert code == 1
    assert "shop-9 is not an instance of shop (instances: shop-1, shop-2)" in output
    assert SWITCHOVER not in await annotations()

    code, output = await kanri(control_plane, namespace, "promote", NAME, "shop-2")
    assert code == 0, output
    assert (await annotations())[SWITCHOVER] == "shop-2"

    await client.patch_status(
        POSTGRES_CLUSTER,
        NAME,
        {
            "status": {
                "failover": {
                    "phase": "Blocked",
                    "from": "shop-1",
                    "reason": "PrimaryUnreachable",
                    "started": "2026-12-02T07:00:00Z",
                }
            }
        },
        namespace,
    )
    code, output = await kanri(control_plane, namespace, "promote", NAME, "shop-2")
    assert code == 0, output
    assert (await annotations())[APPROVE] == "shop-2"

    for command, key in (("restart", RESTART), ("restore-test", RESTORE_TEST)):
        code, output = await kanri(control_plane, namespace, command, NAME)
        assert code == 0, output
        assert (await annotations())[key].endswith("Z")

    code, output = await kanri(control_plane, namespace, "hibernate", NAME)
    assert code == 0, output
    obj = await client.get(POSTGRES_CLUSTER, NAME, namespace)
    assert obj["spec"]["replicas"] == 0
    assert obj["metadata"]["annotations"][HIBERNATED_REPLICAS] == "2"
    code, output = await kanri(control_plane, namespace, "restart", NAME)
    assert code == 1
    assert "is hibernated" in output

    code, output = await kanri(control_plane, namespace, "wake", NAME)
    assert code == 0, output
    obj = await client.get(POSTGRES_CLUSTER, NAME, namespace)
    assert obj["spec"]["replicas"] == 2
    assert HIBERNATED_REPLICAS not in (obj["metadata"].get("annotations") or {})


async def test_an_operation_on_a_missing_cluster_says_so(
    installed: None,  # noqa: F811
    namespace: str,
    control_plane: Endpoint,
) -> None:
    code, output = await kanri(control_plane, namespace, "restart", "nope")
    assert code == 1
    assert f"PostgresCluster {namespace}/nope not found" in output
