"""The chart's conversion webhook on the local cluster (values conversionWebhook.enabled): the operator's pod brings
the two-version CRDs naming its Service, the API server reaches the webhook through that Service, and the pod is
ready only once a conversion went through; objects stored in v1alpha1 then read in v1beta1 with kubectl.

A PostgresBackup of no cluster is the stored object the webhook's readiness check converts (cheap: no PostgreSQL
starts). The session's CRDs are put back to v1alpha1 alone afterwards (this release keeps v1alpha1 the storage
version, so nothing was stored in v1beta1), as the other modules install them.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import pytest

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.api import v1alpha1
from kanri.runtime import Client, Kind
from kanri.runtime.kinds import CRD, POD
from tests.helm_support import CHART, helm_async, pod_log_tails
from tests.postgres_support import put_back_single_version_crds

BACKUP = v1alpha1.PostgresBackup.resource.api_kind
NEW_BACKUP = Kind("kanri.dev/v1beta1", "PostgresBackup", "postgresbackups")


@pytest.mark.timeout(300)
async def test_the_chart_serves_v1beta1_through_the_operators_webhook(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    release = f"kanri-{secrets.token_hex(3)}"
    kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    backup = {"metadata": {"name": "stored-in-v1alpha1", "namespace": namespace}, "spec": {"cluster": "none"}}
    await client.create(BACKUP, backup)
    home = tmp_path / "helm"
    try:
        # --wait returns once the pod is ready: the API server converted the backup through the Service to the pod.
        values = ["--set", f"watchNamespaces={{{namespace}}}", "--set", "conversionWebhook.enabled=true"]
        await helm_async("install", release, str(CHART), *kubeconfig, *values, "--wait", "--timeout", "100s", home=home)
        crd = await client.get(CRD, v1alpha1.PostgresBackup.resource.crd_name)
        service = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
        assert (service["name"], service["namespace"]) == (f"{release}-operator-webhook", namespace)
        read = await client.get(NEW_BACKUP, "stored-in-v1alpha1", namespace)
        assert read["apiVersion"] == "kanri.dev/v1beta1"
        process = await asyncio.create_subprocess_exec(
            # a discovery cache of its own: the shared one would remember v1beta1 as the group's preferred version
            # after the CRDs are put back, and later kubectl calls of the session would ask for it (404)
            "kubectl", "--kubeconfig", str(control_plane.kubeconfig), "--cache-dir", str(tmp_path / "kube-cache"),
            "-n", namespace, "get",
            "postgresbackups.v1beta1.kanri.dev", "-o", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, err.decode()
        assert [i["metadata"]["name"] for i in json.loads(out)["items"]] == ["stored-in-v1alpha1"]
        pods, _ = await client.list(POD, namespace, label_selector="kanri.dev/conversion-webhook=serving")
        assert len(pods) == 1
    finally:
        # the operator's own log, shown when the test fails (kubectl logs cannot reach the test network's kubelet)
        print(await pod_log_tails(tmp_path / "node", "*operator*"))
        await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
        await put_back_single_version_crds(client)
