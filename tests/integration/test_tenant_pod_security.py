"""Pod security by default on the local cluster (issue 33): a namespace admin is not node root.

The tenant is what a platform hands a team: a ServiceAccount bound to the built-in ``admin`` ClusterRole by a
RoleBinding in its own namespace only, played with the real ``kubectl --as``. Its namespace carries no Pod Security
label, so the control plane's defaults apply (``enforce: baseline``, ``warn``/``audit: restricted``; see
kanri.local.controlplane and docs/security.md):

- a privileged pod mounting the local cluster's state directory (the admin kubeconfig and the CA's key live there)
  with ``hostPath``, a ``hostNetwork`` pod, and a root pod adding ``SYS_ADMIN`` are refused with the PodSecurity
  message naming each violation — on the old control plane (no default level) all three were admitted;
- the tenant cannot opt its own namespace into ``privileged``: namespaces are cluster-scoped and ``admin`` may not
  patch them (RBAC refuses the label); once the platform sets that label, the same privileged pod is admitted, so the
  refusal above was the level and nothing else;
- a ``restricted``-compliant pod is admitted without a word; a ``baseline``-but-not-``restricted`` pod is admitted
  and kubectl prints the ``restricted`` warning;
- every pod kanri runs (instance, rehearsal, upgrade check and upgrade pods, the operator as the chart renders it,
  the local object store ``kanri-s3``) passes the default without even a warning.

Only the control plane takes part (admission decides before a node sees a pod; the admitted pods carry a scheduling
gate, so nothing runs), which makes this an integration test.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kanri.local import Endpoint
from kanri.local.seaweedfs import object_store
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import NAMESPACE, POD, ROLE_BINDING, SERVICE_ACCOUNT
from tests.integration.test_pod_security import operator_pods

Obj = dict[str, Any]
KUBECTL = Path(sys.executable).parent / "kubectl"
PSA = "pod-security.kubernetes.io"
TENANT = "tenant"
REFUSED = 'violates PodSecurity "baseline:latest"'
WARNED = 'Warning: would violate PodSecurity "restricted:latest"'
# Never scheduled: an admitted pod stays an API object, whatever nodes other tests of the session started.
GATE = [{"name": "kanri.dev/never-scheduled"}]


def tenant(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:{TENANT}"


async def make_tenant(client: Client, namespace: str) -> None:
    """The namespace admin: a ServiceAccount with the built-in ``admin`` ClusterRole in its own namespace only."""
    await client.create(SERVICE_ACCOUNT, {"metadata": {"name": TENANT, "namespace": namespace}})
    binding = {
        "metadata": {"name": f"{TENANT}-admin", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}],
    }
    await client.create(ROLE_BINDING, binding)


async def kubectl(control_plane: Endpoint, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """Run kubectl with the admin kubeconfig (``--as`` in ``args`` narrows it to the tenant)."""
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL), f"--kubeconfig={control_plane.kubeconfig}", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"kubectl {' '.join(args)} did not answer in 60 s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def as_tenant(
    control_plane: Endpoint, namespace: str, *args: str, stdin: str | None = None
) -> tuple[int, str, str]:
    return await kubectl(control_plane, f"--as={tenant(namespace)}", "-n", namespace, *args, stdin=stdin)


def pod(name: str, spec: Obj, container: Obj | None = None) -> Obj:
    main = {"name": "main", "image": "kanri.dev/shell", "command": ["sleep", "3600"], **(container or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulingGates": GATE, "containers": [main], **spec}}  # fmt: skip


def hostile_pods(state_dir: Path) -> dict[str, tuple[Obj, list[str]]]:
    """The tenant's ways out of its pod, each with what the refusal must name."""
    state = {"volumes": [{"name": "state", "hostPath": {"path": str(state_dir)}}]}
    return {
        "privileged, the state dir by hostPath": (
            pod("escape", state, {"securityContext": {"privileged": True, "runAsUser": 0},
                                  "volumeMounts": [{"name": "state", "mountPath": "/state"}]}),
            ['privileged (container "main" must not set securityContext.privileged=true)',
             'hostPath volumes (volume "state")'],
        ),
        "hostNetwork": (
            pod("on-the-host", {"hostNetwork": True}),
            ["host namespaces (hostNetwork=true)"],
        ),
        "root with SYS_ADMIN": (
            pod("sysadmin", {}, {"securityContext": {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}}}),
            ['non-default capabilities (container "main" must not include "SYS_ADMIN" in '
             "securityContext.capabilities.add)"],
        ),
    }  # fmt: skip


def restricted_pod() -> Obj:
    return pod(
        "compliant",
        {"securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}}},
        {"securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}},
    )


@pytest.mark.parametrize("which", list(hostile_pods(Path("/state"))))
async def test_a_namespace_admin_cannot_create_a_pod_that_reaches_the_node(
    client: Client, control_plane: Endpoint, namespace: str, which: str
) -> None:
    await make_tenant(client, namespace)
    manifest, violations = hostile_pods(control_plane.kubeconfig.parent)[which]
    code, out, err = await as_tenant(control_plane, namespace, "create", "-f", "-", stdin=json.dumps(manifest))
    assert code != 0, f"{which}: admitted without any Pod Security level ({out.strip()})"
    assert "is forbidden" in err, err
    assert REFUSED in err, err
    for violation in violations:
        assert violation in err, err
    with pytest.raises(ApiError) as missing:  # nothing was stored
        await client.get(POD, manifest["metadata"]["name"], namespace)
    assert missing.value.status == 404


async def test_a_namespace_admin_cannot_opt_its_namespace_out_but_the_platform_can(
    client: Client, control_plane: Endpoint, namespace: str
) -> None:
    await make_tenant(client, namespace)
    code, out, err = await as_tenant(control_plane, namespace, "auth", "can-i", "patch", f"namespaces/{namespace}")
    assert (code, out.strip()) == (1, "no"), (code, out, err)
    code, out, err = await as_tenant(control_plane, namespace, "label", "namespace", namespace,
                                     f"{PSA}/enforce=privileged")  # fmt: skip
    assert code != 0, out
    assert f'User "{tenant(namespace)}" cannot patch resource "namespaces"' in err, err
    labels = (await client.get(NAMESPACE, namespace))["metadata"].get("labels") or {}
    assert f"{PSA}/enforce" not in labels, labels

    # The platform's opt-in (the cluster admin labels the namespace): the same pod is admitted, so what refused it
    # before was the default level. A server-side dry run: admission runs in full, nothing is stored.
    await client.patch(NAMESPACE, namespace, {"metadata": {"labels": {f"{PSA}/enforce": "privileged"}}})
    manifest, _ = hostile_pods(control_plane.kubeconfig.parent)["privileged, the state dir by hostPath"]
    code, out, err = await as_tenant(control_plane, namespace, "create", "--dry-run=server", "-f", "-",
                                     stdin=json.dumps(manifest))  # fmt: skip
    assert code == 0, err
    assert "pod/escape created (server dry run)" in out, out


async def test_a_restricted_pod_is_admitted_quietly_and_a_baseline_pod_with_a_warning(
    client: Client, control_plane: Endpoint, namespace: str
) -> None:
    await make_tenant(client, namespace)
    code, out, err = await as_tenant(control_plane, namespace, "create", "-f", "-", stdin=json.dumps(restricted_pod()))
    assert code == 0, err
    assert "pod/compliant created" in out, out
    assert "Warning" not in err, err

    # Root, no seccomp profile, capabilities kept: fine for baseline, not for restricted.
    code, out, err = await as_tenant(control_plane, namespace, "create", "-f", "-",
                                     stdin=json.dumps(pod("plain", {})))  # fmt: skip
    assert code == 0, err
    assert "pod/plain created" in out, out
    assert WARNED in err, err
    for check in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                  "seccompProfile"):  # fmt: skip
        assert check in err, err
    for name in ("compliant", "plain"):  # stored, as admitted
        assert (await client.get(POD, name, namespace))["metadata"]["name"] == name


def kanri_pods(namespace: str) -> dict[str, Obj]:
    """Every pod kanri runs: the operator's (tests/integration/test_pod_security.py) and the object store's."""
    (store,) = [doc for doc in object_store(namespace) if doc["kind"] == "StatefulSet"]
    template = store["spec"]["template"]
    # what the StatefulSet controller makes: the template, plus a claim volume per volumeClaimTemplate
    claims = [
        {"name": c["metadata"]["name"], "persistentVolumeClaim": {"claimName": f"{c['metadata']['name']}-0"}}
        for c in store["spec"].get("volumeClaimTemplates", [])
    ]
    store_pod = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {**template["metadata"], "name": "kanri-s3-0", "namespace": namespace},
                 "spec": {**template["spec"], "volumes": [*template["spec"].get("volumes", []), *claims]}}  # fmt: skip
    return {**operator_pods(namespace), "object store (kanri-s3)": store_pod}


async def test_every_pod_kanri_runs_passes_the_default_without_a_warning(
    client: Client, control_plane: Endpoint, namespace: str
) -> None:
    await make_tenant(client, namespace)
    for account in ("orders-instance", "kanri-operator"):  # so that nothing but Pod Security could refuse a pod
        await client.create(SERVICE_ACCOUNT, {"metadata": {"name": account, "namespace": namespace}})
    pods = kanri_pods(namespace)
    assert len(pods) == 8, list(pods)
    for which, manifest in pods.items():
        code, out, err = await as_tenant(control_plane, namespace, "create", "--dry-run=server", "-f", "-",
                                         stdin=json.dumps(manifest))  # fmt: skip
        assert code == 0, f"{which}: {err}"
        assert "created (server dry run)" in out, f"{which}: {out}"
        assert "Warning" not in err, f"{which}: {err}"
