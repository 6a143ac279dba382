"""The node's kubelet API on the real control plane: ``kubectl logs`` through the API server, and the port's auth.

kubectl runs as a child process awaited with asyncio: the node serving its request runs in this test's event loop.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import secrets
import shutil
import ssl
import struct
import sys
import tempfile
import termios
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.node import LocalNode, NodeOptions
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import CLUSTER_ROLE, CLUSTER_ROLE_BINDING, NODE, POD, SERVICE_ACCOUNT
from tests.local_node_support import allow_privileged_pods, running_node, with_test_network
from tests.support import eventually

Obj = dict[str, Any]

SHELL = "kanri.dev/test/sh:1"
IMAGES = [{"image": "kanri.dev/test/sh:*", "command": ["/bin/sh", "-c"]}]
KUBECTL = str(Path(sys.executable).parent / "kubectl")


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(namespace: str, client: Client) -> str:
    """The test's namespace, opted into Pod Security ``privileged`` by the cluster admin: the log tests share a
    host directory with their pods (``hostPath``) to tell a script when to go on, which the local cluster's default
    level (``baseline``) refuses."""
    await allow_privileged_pods(client, namespace)
    return namespace


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def node(control_plane: Endpoint, tmp_path_factory: Any) -> AsyncIterator[LocalNode]:
    """One node for the module, serving its kubelet API with the control plane's pki; a fast crash-loop back-off."""
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path_factory.mktemp("kubelet-api") / "node",
            name=f"test-kapi-{secrets.token_hex(3)}",
            images=IMAGES,
            restart_backoff_base=0.2,
            restart_backoff_max=1.0,
            kubelet_pki_dir=control_plane.kubeconfig.parent / "pki",
        )
    )
    async with running_node(control_plane.kubeconfig, options) as local:
        assert local.kubelet_api is not None, "the node must serve its kubelet API"
        yield local


def shell_pod(name: str, namespace: str, node: LocalNode, *scripts: str, restart_policy: str = "Always") -> Obj:
    """A pod bound to ``node`` (the scheduler is tested elsewhere) with one shell container per script: ``main``,
    then ``second``, ``third``."""
    names = ["main", "second", "third"]
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node.options.name,
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": names[i], "image": SHELL, "args": [script]} for i, script in enumerate(scripts)],
        },
    }


@contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory any uid can use, outside /tmp (a container's /tmp is its own)."""
    path = Path(tempfile.mkdtemp(prefix="kanri-kapi-", dir="/var/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def with_host_dir(spec: Obj, path: Path) -> Obj:
    spec["spec"]["volumes"] = [{"name": "shared", "hostPath": {"path": str(path)}}]
    for container in spec["spec"]["containers"]:
        container["volumeMounts"] = [{"name": "shared", "mountPath": str(path)}]
    return spec


async def kubectl(endpoint: Endpoint, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(endpoint.kubeconfig), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def logs(endpoint: Endpoint, namespace: str, *args: str) -> str | None:
    """``kubectl logs`` output, or None while it fails (the container has not written yet, say)."""
    code, out, _ = await kubectl(endpoint, "logs", "-n", namespace, *args)
    return out if code == 0 else None


async def logs_equal(endpoint: Endpoint, namespace: str, expected: str, *args: str) -> str | None:
    out = await logs(endpoint, namespace, *args)
    return out if out == expected else None


async def restarted_and_running(client: Client, name: str, namespace: str, restarts: int) -> Obj | None:
    live = await client.get(POD, name, namespace)
    statuses = (live.get("status") or {}).get("containerStatuses") or []
    if statuses and statuses[0]["restartCount"] == restarts and "running" in statuses[0]["state"]:
        return live
    return None


async def test_kubectl_logs_of_a_running_container_and_its_tail(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(
        POD, shell_pod("talker", namespace, node, "echo one; echo two >&2; echo three; exec sleep 3600")
    )
    await eventually(lambda: logs_equal(control_plane, namespace, "one\ntwo\nthree\n", "talker"), timeout=60)
    assert await logs(control_plane, namespace, "talker", "--tail=1") == "three\n"
    assert await logs(control_plane, namespace, "talker", "--tail=2") == "two\nthree\n"
    assert await logs(control_plane, namespace, "talker", "--limit-bytes=6") == "one\ntw"
    # The Node says where its kubelet listens; the API server found it there.
    live = await client.get(NODE, node.options.name)
    assert node.kubelet_api is not None
    assert live["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == node.kubelet_api.port > 0
    # ... and that it takes exec's WebSocket itself (see kubeletexec.py).
    assert live["status"]["declaredFeatures"] == ["ExtendWebSocketsToKubelet"]


async def test_kubectl_logs_chooses_the_container(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    spec = shell_pod("pair", namespace, node, "echo from-main; exec sleep 3600", "echo from-second; exec sleep 3600")
    await client.create(POD, spec)
    await eventually(lambda: logs_equal(control_plane, namespace, "from-second\n", "pair", "-c", "second"), timeout=60)
    assert await logs(control_plane, namespace, "pair", "-c", "main") == "from-main\n"


async def test_kubectl_logs_previous_of_a_restarted_container(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    with shared_dir() as shared:
        marker = shared / "ran-once"
        script = (
            f"if [ -e {marker} ]; then echo second run; exec sleep 3600; fi; touch {marker}; echo first run; exit 3"
        )
        await client.create(POD, with_host_dir(shell_pod("phoenix", namespace, node, script), shared))
        await eventually(lambda: restarted_and_running(client, "phoenix", namespace, 1), timeout=60)
        assert await eventually(lambda: logs(control_plane, namespace, "phoenix"), timeout=30) == "second run\n"
        assert await logs(control_plane, namespace, "phoenix", "--previous") == "first run\n"


async def test_kubectl_logs_previous_without_a_restart_is_refused_with_the_kubelets_message(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(POD, shell_pod("steady", namespace, node, "echo steady; exec sleep 3600"))
    await eventually(lambda: logs(control_plane, namespace, "steady"), timeout=60)
    code, _, err = await kubectl(control_plane, "logs", "-n", namespace, "steady", "--previous")
    assert code != 0
    assert 'previous terminated container "main" in pod "steady" not found' in err


async def test_kubectl_logs_follow_streams_new_lines_until_the_container_ends(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    with shared_dir() as shared:
        go, done = shared / "go", shared / "done"
        script = (
            f"echo before; while [ ! -e {go} ]; do sleep 0.1; done; echo after; "
            f"while [ ! -e {done} ]; do sleep 0.1; done; echo last"
        )
        spec = with_host_dir(shell_pod("streamer", namespace, node, script, restart_policy="Never"), shared)
        await client.create(POD, spec)
        await eventually(lambda: logs(control_plane, namespace, "streamer"), timeout=60)
        follower = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(control_plane.kubeconfig), "logs", "-f", "-n", namespace, "streamer",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert follower.stdout is not None
        try:
            assert await asyncio.wait_for(follower.stdout.readline(), 30) == b"before\n"
            go.touch()  # only now, while kubectl is following, does the container write again
            assert await asyncio.wait_for(follower.stdout.readline(), 30) == b"after\n"
            assert follower.returncode is None, "kubectl stopped following a running container"
            done.touch()
            # The container ends: its last line arrives and the stream closes, so kubectl exits by itself.
            assert await asyncio.wait_for(follower.stdout.read(), 60) == b"last\n"
            assert await asyncio.wait_for(follower.wait(), 30) == 0
        finally:
            if follower.returncode is None:
                follower.kill()
                await follower.wait()


# --- kubectl exec --------------------------------------------------------------------------------------------------


async def test_kubectl_exec_runs_in_the_container_with_its_streams_and_exit_code(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    spec = shell_pod("target", namespace, node, "echo ready; exec sleep 3600")
    spec["spec"]["containers"][0]["env"] = [{"name": "GREETING", "value": "hello-from-env"}]
    spec["spec"]["containers"][0]["securityContext"] = {"runAsUser": 65534}
    await client.create(POD, spec)
    await eventually(lambda: logs(control_plane, namespace, "target"), timeout=60)
    # Inside the container: its hostname, its PID namespace (its init is PID 1), its user, its environment.
    script = 'echo "$(hostname) $(cat /proc/1/comm) $(id -u) $GREETING"; echo to-stderr >&2; exit 3'
    code, out, err = await kubectl(control_plane, "exec", "-n", namespace, "target", "--", "sh", "-c", script)
    assert code == 3, err
    assert out == "target sleep 65534 hello-from-env\n"
    assert "to-stderr" in err
    code, out, err = await kubectl(control_plane, "exec", "-n", namespace, "target", "--", "true")
    assert (code, out) == (0, ""), err


async def test_kubectl_exec_passes_stdin_until_it_closes(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(POD, shell_pod("reader", namespace, node, "echo ready; exec sleep 3600"))
    await eventually(lambda: logs(control_plane, namespace, "reader"), timeout=60)
    process = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(control_plane.kubeconfig), "exec", "-i", "-n", namespace, "reader", "--",
        "sh", "-c", "tr a-z A-Z; echo done",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(b"hello\nworld\n"), 60)
    assert process.returncode == 0, err
    assert out == b"HELLO\nWORLD\ndone\n"


async def test_kubectl_exec_with_a_terminal_gets_one_of_the_callers_size(
    control_plane: Endpoint, client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(POD, shell_pod("console", namespace, node, "echo ready; exec sleep 3600"))
    await eventually(lambda: logs(control_plane, namespace, "console"), timeout=60)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 41, 123, 0, 0))  # rows, columns
    try:
        process = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(control_plane.kubeconfig), "exec", "-it", "-n", namespace, "console", "--",
            "sh", "-c", "test -t 0 && echo on-a-terminal; stty size",
            stdin=slave, stdout=slave, stderr=slave,
        )  # fmt: skip
        os.close(slave)
        slave = -1
        output = await asyncio.wait_for(asyncio.to_thread(_read_until_closed, master), 60)
        assert await asyncio.wait_for(process.wait(), 30) == 0, output
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert "on-a-terminal" in output
    assert "41 123" in output


def _read_until_closed(fd: int) -> str:
    """Everything a pseudo-terminal's master reads until its last slave holder is gone (EIO)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


# --- the kubelet port itself --------------------------------------------------------------------------------------


def kubelet_url(node: LocalNode, path: str) -> str:
    assert node.kubelet_api is not None
    return f"https://{node.options.internal_ip}:{node.kubelet_api.port}{path}"


def trusting_kubelet_ca(node: LocalNode) -> ssl.SSLContext:
    """Verifies the node's serving certificate (chain to the kubelet CA, the node's address as a SAN) as the API
    server does."""
    assert node.options.kubelet_pki_dir is not None
    return ssl.create_default_context(cafile=str(node.options.kubelet_pki_dir / "kubelet-ca.crt"))


async def get(node: LocalNode, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(ssl=trusting_kubelet_ca(node))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(kubelet_url(node, path), headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as response,
    ):
        return response.status, await response.text()


async def service_account_token(client: Client, namespace: str, name: str) -> str:
    await client.create(SERVICE_ACCOUNT, {"metadata": {"name": name, "namespace": namespace}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    issued = await client.create_subresource(SERVICE_ACCOUNT, name, "token", request, namespace)
    return str(issued["status"]["token"])


async def test_the_kubelet_port_refuses_anonymous_and_unauthorized_callers_and_serves_nodes_proxy(
    client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(POD, shell_pod("served", namespace, node, "echo served; exec sleep 3600"))
    path = f"/containerLogs/{namespace}/served/main"
    status, body = await get(node, path)
    assert (status, body) == (401, "Unauthorized")
    status, body = await get(node, path, token="not-a-token")
    assert (status, body) == (401, "Unauthorized")

    nobody = await service_account_token(client, namespace, "nobody")
    status, body = await get(node, path, token=nobody)
    assert status == 403
    assert body == (
        f"Forbidden (user=system:serviceaccount:{namespace}:nobody, verb=get, resource=nodes, subresource(s)=[proxy])\n"
    )

    reader = await service_account_token(client, namespace, "reader")
    role_name = f"kanri-test-node-proxy-{namespace}"
    role = {
        "metadata": {"name": role_name},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}],
    }
    binding = {
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    await client.create(CLUSTER_ROLE, role)
    try:
        await client.create(CLUSTER_ROLE_BINDING, binding)

        async def served() -> tuple[int, str] | None:
            answer = await get(node, path, token=reader)
            return answer if answer == (200, "served\n") else None

        await eventually(served, timeout=60)  # the RBAC cache and the container's first line
        assert await get(node, "/healthz", token=reader) == (200, "ok")
        status, body = await get(node, f"/containerLogs/{namespace}/ghost/main", token=reader)
        assert (status, body) == (404, 'pod "ghost" does not exist')
        status, body = await get(node, f"/containerLogs/{namespace}/served/nope", token=reader)
        assert (status, body) == (404, 'container "nope" not found in pod "served"')
        status, body = await get(node, f"{path}?timestamps=true", token=reader)
        assert status == 400
        assert "timestamps" in body
    finally:
        for kind in (CLUSTER_ROLE_BINDING, CLUSTER_ROLE):
            try:
                await client.delete(kind, role_name)
            except ApiError as exc:
                if not exc.not_found:
                    raise
