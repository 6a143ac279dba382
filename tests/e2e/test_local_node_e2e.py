"""The local node end to end: Deployments, Services, DNS, probes and StatefulSet volumes with real processes in
real network and mount namespaces, driven only through the Kubernetes API (the controller-manager makes the
ReplicaSets, Pods, EndpointSlices and PVCs)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.node import LocalNode, NodeOptions, log_path
from kanri.local.node.kinds import PERSISTENT_VOLUME
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import DEPLOYMENT, ENDPOINT_SLICE, EVENT, POD, PVC, SERVICE, STATEFUL_SET
from tests.local_node_support import allow_privileged_pods, running_node, with_test_network
from tests.support import eventually

Obj = dict[str, Any]

# The system's interpreter: containers run as other users, who cannot enter /root (where pyenv lives).
PYTHON = "/usr/bin/python3"
HTTP = "kanri.dev/test/http:1"
SHELL = "kanri.dev/test/sh:1"
IMAGES = [
    # Serves the pod's own /etc: /hosts names the pod that answered.
    {"image": HTTP, "command": [PYTHON, "-m", "http.server", "8080", "--directory", "/etc"]},
    {"image": SHELL, "command": ["/bin/sh", "-c"]},
]


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(namespace: str, client: Client) -> str:
    """The test's namespace, opted into Pod Security ``privileged`` by the cluster admin: the web pods share a
    host directory (``hostPath``) through which the test flips their readiness, which the local cluster's default
    level (``baseline``) refuses."""
    await allow_privileged_pods(client, namespace)
    return namespace


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[LocalNode]:
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path / "node",
            name=f"test-e2e-{secrets.token_hex(3)}",
            images=IMAGES,
            restart_backoff_base=0.2,
            restart_backoff_max=1.0,
        )
    )
    async with running_node(control_plane.kubeconfig, options) as local:
        yield local


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kanri-e2e-", dir="/var/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def web_deployment(namespace: str, replicas: int, shared: Path) -> Obj:
    labels = {"app": "web"}
    return {
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "securityContext": {"runAsUser": 65534},
                    "volumes": [{"name": "shared", "hostPath": {"path": str(shared)}}],
                    "containers": [
                        {
                            "name": "web",
                            "image": HTTP,
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                            # Unready while /shared/down-<pod name> exists: the test flips it from the host.
                            "readinessProbe": {
                                "exec": {"command": ["/bin/sh", "-c", 'test ! -e "/shared/down-$(hostname)"']},
                                "periodSeconds": 1,
                                "failureThreshold": 1,
                            },
                            # generous: the test asserts an unready pod is not restarted, so a busy machine's
                            # slow answers must not make the kubelet restart it
                            "livenessProbe": {
                                "httpGet": {"path": "/hosts", "port": "http"},
                                "periodSeconds": 2,
                                "timeoutSeconds": 5,
                                "failureThreshold": 5,
                            },
                        }
                    ],
                },
            },
        },
    }


def service(namespace: str) -> Obj:
    return {
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }


def client_pod(namespace: str, name: str, url: str) -> Obj:
    fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": SHELL, "args": [f"{PYTHON} -c {shell_quote(fetch)}"]}],
        },
    }


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


async def ready_pods(client: Client, namespace: str) -> list[Obj]:
    pods = (await client.list(POD, namespace, label_selector="app=web"))[0]
    return [
        p
        for p in pods
        if (c := get_condition(p.get("status", {}).get("conditions"), "Ready")) and c["status"] == "True"
    ]


async def ready_endpoint_ips(client: Client, namespace: str) -> set[str]:
    slices = (await client.list(ENDPOINT_SLICE, namespace, label_selector="kubernetes.io/service-name=web"))[0]
    return {
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready", True)
        for address in e["addresses"]
    }


async def finished(client: Client, namespace: str, name: str) -> Obj | None:
    pod = await client.get(POD, name, namespace)
    return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None


def output_of(node: LocalNode, pod: Obj) -> str:
    meta = pod["metadata"]
    path = log_path(node.options.data_dir, meta["namespace"], meta["name"], meta["uid"], "main", 0)
    return path.read_text()


async def test_deployment_is_reachable_through_its_service_by_name_and_readiness_steers_endpoints(
    client: Client, node: LocalNode, namespace: str
) -> None:
    with shared_dir() as shared:
        await client.create(DEPLOYMENT, web_deployment(namespace, 2, shared))
        await client.create(SERVICE, service(namespace))
        pods = await eventually(lambda: _at_least(ready_pods(client, namespace), 2), timeout=90, interval=0.5)
        ips = {p["status"]["podIP"] for p in pods}
        assert len(ips) == 2
        assert all(ip.startswith("10.246.") for ip in ips), ips  # the test node's pod CIDR
        await eventually(lambda: _equals(ready_endpoint_ips(client, namespace), ips), timeout=30)

        # kube-proxy programs the endpoints a moment after the slice lists them (its minimum sync period): the client
        # pod below tries once
        cluster_ip = (await client.get(SERVICE, "web", namespace))["spec"]["clusterIP"]
        await eventually(lambda: _answers(cluster_ip), timeout=30, interval=0.5)

        # Another pod reaches the Service by its short name (DNS search path + ClusterIP proxy).
        await client.create(POD, client_pod(namespace, "fetch", "http://web/hosts"))
        done = await eventually(lambda: finished(client, namespace, "fetch"), timeout=60)
        assert done["status"]["phase"] == "Succeeded", output_of(node, done)
        answer = output_of(node, done)
        assert any(p["metadata"]["name"] in answer for p in pods), answer

        # The fully qualified name works too.
        fqdn = f"http://web.{namespace}.svc.cluster.local/hosts"
        await client.create(POD, client_pod(namespace, "fetch-fqdn", fqdn))
        done = await eventually(lambda: finished(client, namespace, "fetch-fqdn"), timeout=60)
        assert done["status"]["phase"] == "Succeeded", output_of(node, done)

        # Readiness failure takes one pod out of the Service's endpoints (and back in when it passes again).
        down = pods[0]
        (shared / f"down-{down['metadata']['name']}").touch()
        await eventually(
            lambda: _equals(ready_endpoint_ips(client, namespace), ips - {down["status"]["podIP"]}), timeout=30
        )
        pod = await client.get(POD, down["metadata"]["name"], namespace)
        ready = get_condition(pod["status"]["conditions"], "Ready")
        assert ready is not None
        assert ready["status"] == "False"
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0  # unready, not restarted
        (shared / f"down-{down['metadata']['name']}").unlink()
        await eventually(lambda: _equals(ready_endpoint_ips(client, namespace), ips), timeout=30)

        # From the host, the ClusterIP answers as well.
        reader, writer = await asyncio.wait_for(asyncio.open_connection(cluster_ip, 80), 5)
        writer.write(b"GET /hosts HTTP/1.0\r\n\r\n")
        body = (await asyncio.wait_for(reader.read(), 10)).decode()
        writer.close()
        assert "200" in body.splitlines()[0]


async def _answers(address: str) -> bool:
    """A TCP connection to ``address``:80 is accepted."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(address, 80), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def test_statefulset_keeps_its_data_across_pod_deletion(client: Client, node: LocalNode, namespace: str) -> None:
    script = (
        "test -f /data/id || echo $(hostname)-$(date +%s%N) > /data/id; echo started >> /data/runs; exec sleep 3600"
    )
    statefulset = {
        "metadata": {"name": "db", "namespace": namespace},
        "spec": {
            "serviceName": "db",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": {"runAsUser": 65534, "fsGroup": 65534},
                    "containers": [
                        {
                            "name": "main",
                            "image": SHELL,
                            "args": [script],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
                }
            ],
        },
    }
    await client.create(STATEFUL_SET, statefulset)
    first = await eventually(lambda: _running(client, namespace, "db-0"), timeout=90)
    claim = await client.get(PVC, "data-db-0", namespace)
    volume = await client.get(PERSISTENT_VOLUME, claim["spec"]["volumeName"])
    directory = Path(volume["spec"]["local"]["path"])
    identity = await eventually(lambda: _read(directory / "id"), timeout=30)
    assert identity.startswith("db-0-")

    await client.delete(POD, "db-0", namespace)
    second = await eventually(
        lambda: _running(client, namespace, "db-0", other_than=first["metadata"]["uid"]), timeout=90
    )
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    runs = await eventually(lambda: _read(directory / "runs", lines=2), timeout=30)
    assert runs.splitlines() == ["started", "started"]
    assert (directory / "id").read_text().strip() == identity  # the same data, seen by the new pod


async def _at_least(pods: Any, count: int) -> list[Obj] | None:
    found: list[Obj] = await pods
    return found if len(found) >= count else None


async def _equals(value: Any, expected: set[str]) -> bool:
    return bool(await value == expected)


async def _running(client: Client, namespace: str, name: str, other_than: str | None = None) -> Obj | None:
    with contextlib.suppress(Exception):
        pod = await client.get(POD, name, namespace)
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if pod["metadata"]["uid"] != other_than and statuses and "running" in statuses[0]["state"]:
            return pod
    return None


async def _read(path: Path, lines: int = 1) -> str | None:
    with contextlib.suppress(FileNotFoundError):
        text = await asyncio.to_thread(path.read_text)
        if len(text.splitlines()) >= lines:
            return text.strip() if lines == 1 else text
    return None


def sleeper(namespace: str, name: str, node: str) -> Obj:
    """A pod bound to ``node`` (no scheduler involved) that sleeps until deleted."""
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "sleeper"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": SHELL, "args": ["exec sleep 3600"]}],
        },
    }


async def test_a_pod_the_network_cannot_take_says_why_and_starts_once_an_address_is_freed(
    control_plane: Endpoint, client: Client, namespace: str, tmp_path: Path
) -> None:
    """Issue 27 item 6: a pod that cannot start says why in an Event. A node whose pod slice is a /29 has five
    addresses for pods (the first is its own); a sixth pod finds none. It stays ContainerCreating with a Warning
    ``FailedCreatePodSandBox`` that says so, and starts once another pod's deletion frees an address (its set-up is
    retried). Before, the node's pod worker died on the error and the pod stayed ContainerCreating without a word."""
    options = with_test_network(
        NodeOptions(data_dir=tmp_path / "node", name=f"test-e2e-{secrets.token_hex(3)}", images=IMAGES)
    )
    options = dataclasses.replace(options, node_cidr_mask_size=29)
    async with running_node(control_plane.kubeconfig, options) as local:
        assert str(local.options.pod_slice).endswith("/29"), local.options
        names = [f"sleeper-{i}" for i in range(6)]
        for name in names:
            await client.create(POD, sleeper(namespace, name, local.options.name))

        async def phases() -> dict[str, str]:
            pods = (await client.list(POD, namespace, label_selector="app=sleeper"))[0]
            return {p["metadata"]["name"]: str((p.get("status") or {}).get("phase")) for p in pods}

        async def five_running() -> dict[str, str] | None:
            found = await phases()
            return found if sorted(found.values()).count("Running") == 5 else None

        found = await eventually(five_running, timeout=90, interval=0.5)
        waiting = [name for name, phase in found.items() if phase != "Running"]
        assert len(waiting) == 1, found

        async def told() -> list[str]:
            events = (await client.list(EVENT, namespace))[0]
            return [str(e.get("message")) for e in events if e.get("reason") == "FailedCreatePodSandBox"
                    and (e.get("involvedObject") or {}).get("name") == waiting[0]]  # fmt: skip

        messages = await eventually(told, timeout=30, interval=0.5)
        assert any("no free address" in m for m in messages), messages
        pod = await client.get(POD, waiting[0], namespace)
        states = [c.get("state") or {} for c in (pod.get("status") or {}).get("containerStatuses") or []]
        assert [s.get("waiting", {}).get("reason") for s in states] == ["ContainerCreating"], states

        await client.delete(POD, next(name for name in names if name not in waiting), namespace)

        async def started() -> dict[str, str] | None:
            found = await phases()
            return found if found.get(waiting[0]) == "Running" else None

        await eventually(started, timeout=60, interval=0.5)
        for name in names:
            await client.delete(POD, name, namespace, grace_period_seconds=0)
