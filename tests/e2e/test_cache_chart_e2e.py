"""The chart's Cache operator as a pod of the local node (values cache.enabled), in namespaced mode
(watchNamespaces): under the chart's ServiceAccount and the Role it grants in the watched namespace, it makes a Cache
there Ready — pods running the agent, valkey-server and Sentinel, one primary named in status — and leaves a Cache in a
namespace it does not watch alone. `helm uninstall` removes the operator and keeps the Cache's pods serving (Sentinel's
failover and the agents need no operator)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from kanri.cache.api import KIND, Cache
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.runtime import ApiError, Client, get_condition, install_crd
from kanri.runtime.kinds import DEPLOYMENT, NAMESPACE, POD, STATEFUL_SET
from tests.helm_support import CHART, helm_async, pod_log_tails
from tests.support import eventually

Obj = dict[str, Any]
OPERATOR_LABEL = "app.kubernetes.io/name=kanri-cache-operator"


async def ready(client: Client, namespace: str, name: str) -> Obj | None:
    found = await client.get(KIND, name, namespace)
    condition = get_condition((found.get("status") or {}).get("conditions"), "Ready")
    return found if condition is not None and condition["status"] == "True" else None


async def statefulsets(client: Client, namespace: str) -> list[str]:
    items, _ = await client.list(STATEFUL_SET, namespace)
    return [s["metadata"]["name"] for s in items]


@pytest.mark.timeout(420)
async def test_the_charts_cache_operator_runs_a_cache_in_its_namespace_only_and_uninstall_keeps_it(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    release = f"kanri-{secrets.token_hex(3)}"
    kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    home = tmp_path / "helm"
    elsewhere = f"cache-unwatched-{secrets.token_hex(3)}"
    await install_crd(client, Cache, field_manager="kanri-tests")  # crds/ brings it on a first install; shared here
    await client.create(NAMESPACE, {"metadata": {"name": elsewhere}})
    installed = False
    try:
        values = ["--set", f"watchNamespaces={{{namespace}}}", "--set", "cache.enabled=true"]
        await helm_async("install", release, str(CHART), *kubeconfig, *values, "--wait", "--timeout", "180s",
                         home=home)  # fmt: skip
        installed = True
        # --wait returned: both operators' pods passed their readiness probes (caches synced under the chart's RBAC).
        operators, _ = await client.list(POD, namespace, label_selector=OPERATOR_LABEL)
        assert len(operators) == 1
        spec = {"dataPolicy": "Regenerable", "replicas": 2}
        await client.create(KIND, {"metadata": {"name": "sessions", "namespace": namespace}, "spec": spec})
        await client.create(KIND, {"metadata": {"name": "ignored", "namespace": elsewhere}, "spec": spec})
        found = await eventually(lambda: ready(client, namespace, "sessions"), timeout=240, interval=1)
        primary = found["status"]["currentPrimary"]
        assert primary.startswith("sessions-"), found["status"]
        # not watched: no child, no status, nothing written there (its Role is in the watched namespace only)
        assert await statefulsets(client, elsewhere) == []
        assert not (await client.get(KIND, "ignored", elsewhere)).get("status")

        await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
        installed = False
        with pytest.raises(ApiError) as gone:
            await client.get(DEPLOYMENT, f"{release}-cache-operator", namespace)
        assert gone.value.not_found
        # the Cache and its pods stay; the primary still serves without the operator
        assert await ready(client, namespace, "sessions") is not None
        pods, _ = await client.list(POD, namespace, label_selector="cache.kanri.dev/cache=sessions")
        assert {p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"} >= {primary}
    finally:
        print(await pod_log_tails(tmp_path / "node", "*cache-operator*"))
        if installed:
            await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
        await client.delete(NAMESPACE, elsewhere)
