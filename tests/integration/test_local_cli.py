"""`kanri local up | status | kubeconfig | logs | port-forward | down` as a user runs them: a second control plane
and local node of their own, stopped with SIGTERM and restarted on the same data dir."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kanri.local.leftovers import find_leftovers
from kanri.local.node import NodeOptions
from kanri.local.ports import free_port

KANRI = [sys.executable, "-m", "kanri.cli.main"]


def run(args: list[str], env: dict[str, str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False, timeout=240)
    if check and done.returncode != 0:  # the command's own words, not just its exit code
        raise AssertionError(f"{' '.join(args[2:])} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="module")
def kanri_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One KANRI_HOME for the module: the second test's ``up`` finds the first one's restarted cluster running (a
    start of the control plane and its nodes saved); each test still works alone, starting what it needs."""
    env = {**os.environ, "KANRI_HOME": str(tmp_path_factory.mktemp("kanri-cli") / "kanri-home")}
    try:
        yield env
    finally:
        run([*KANRI, "local", "down"], env, check=False)


def kubectl(env: dict[str, str], *args: str) -> str:
    kubeconfig = run([*KANRI, "local", "kubeconfig"], env).stdout.strip()
    # The kubectl that `make setup` installs next to this Python matches the server's minor version.
    venv_kubectl = Path(sys.executable).parent / "kubectl"
    binary = str(venv_kubectl) if venv_kubectl.exists() else shutil.which("kubectl")
    assert binary, "kubectl must be installed by `make setup`"
    return run([binary, "--kubeconfig", kubeconfig, *args], env).stdout


def processes_on(data_dir: Path) -> list[int]:
    """Pids of any control-plane process still using ``data_dir``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"--data-dir={data_dir}".encode() in cmdline.split(b"\0"):
            pids.append(int(proc.name))
    return pids


def test_up_down_and_restart_keep_every_object(kanri_env: dict[str, str]) -> None:
    data_dir = Path(kanri_env["KANRI_HOME"]) / "clusters" / "default"
    assert run([*KANRI, "local", "status"], kanri_env, check=False).returncode == 1

    first_up = run([*KANRI, "local", "up"], kanri_env)
    assert "control plane ready" in first_up.stderr
    assert run([*KANRI, "local", "status"], kanri_env).returncode == 0
    assert "kube-system" in kubectl(kanri_env, "get", "namespaces", "-o", "name")
    kubectl(kanri_env, "create", "configmap", "survivor", "--from-literal=answer=42")

    again = run([*KANRI, "local", "up"], kanri_env)
    assert "already running" in again.stderr
    (pid,) = processes_on(data_dir)

    down = run([*KANRI, "local", "down"], kanri_env)
    assert "control plane stopped" in down.stderr
    assert processes_on(data_dir) == [], "SIGTERM must leave no process behind"
    events = [json.loads(line) for line in (data_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["ready", "stopped"], "clean stop: controllers, API server, then etcd"
    assert run([*KANRI, "local", "status"], kanri_env, check=False).returncode == 1

    run([*KANRI, "local", "up"], kanri_env)
    assert processes_on(data_dir) != [pid]
    answer = kubectl(kanri_env, "get", "configmap", "survivor", "-o", "jsonpath={.data.answer}")
    assert answer == "42"


POD = """
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  nodeName: kanri-2
  terminationGracePeriodSeconds: 5
  securityContext: {runAsUser: 26}
  containers:
  - name: web
    image: kanri.dev/postgres:15
    command: ["/usr/bin/python3", "-m", "http.server", "8080", "--directory", "/etc"]
    ports: [{containerPort: 8080}]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
"""


def test_a_pod_runs_is_reached_and_logged_and_down_leaves_nothing(kanri_env: dict[str, str], tmp_path: Path) -> None:
    node_dir = Path(kanri_env["KANRI_HOME"]) / "clusters" / "default" / "node"
    run([*KANRI, "local", "up"], kanri_env)
    manifest = tmp_path / "web.yaml"
    manifest.write_text(POD)
    kubectl(kanri_env, "apply", "-f", str(manifest))
    kubectl(kanri_env, "wait", "--for=condition=Ready", "pod/web", "--timeout=120s")
    pod_ip = kubectl(kanri_env, "get", "pod", "web", "-o", "jsonpath={.status.podIP}")
    assert pod_ip.startswith("10.244.2."), pod_ip  # kanri-2's slice of the pod network

    port = free_port()
    forwarder = subprocess.Popen(
        [*KANRI, "local", "port-forward", "svc/web", str(port)], env=kanri_env, stderr=subprocess.PIPE, text=True
    )
    try:
        body = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "10.244." not in body:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                    conn.sendall(b"GET /hosts HTTP/1.0\r\n\r\n")
                    body = conn.makefile("rb").read().decode()
            except OSError:
                time.sleep(0.3)
        assert f"{pod_ip}\tweb" in body, body  # the pod's own /etc/hosts, served from inside the pod
    finally:
        forwarder.terminate()
        forwarder.wait(10)

    log = run([*KANRI, "local", "logs", "web"], kanri_env).stdout
    assert "GET /hosts" in log

    assert "kanri-2 (zone-b): Running, 1 pod(s)" in run([*KANRI, "local", "status"], kanri_env).stderr
    listed = run([*KANRI, "local", "node", "list"], kanri_env).stdout
    for row in ("kanri-1", "zone-a", "kanri-3", "zone-c", "10.244.2.1"):
        assert row in listed, listed
    # Chaos left in place on purpose: `down` must undo it (thaw the freezer, drop the partition tables).
    frozen = run([*KANRI, "local", "node", "freeze", "kanri-2"], kanri_env)
    assert "now Frozen" in frozen.stderr, frozen.stderr
    assert "nothing to do" in run([*KANRI, "local", "node", "freeze", "kanri-2"], kanri_env).stderr
    run([*KANRI, "local", "node", "partition", "kanri-3"], kanri_env)
    assert "Partitioned" in run([*KANRI, "local", "node", "list"], kanri_env).stdout
    unknown = run([*KANRI, "local", "node", "stop", "kanri-9"], kanri_env, check=False)
    assert unknown.returncode == 1
    assert "no node 'kanri-9'" in unknown.stderr

    assert [line for line in run(["ip", "netns", "list"], kanri_env).stdout.splitlines() if "kanri-" in line]
    down = run([*KANRI, "local", "down"], kanri_env)
    assert "local node stopped" in down.stderr
    assert find_leftovers(NodeOptions(data_dir=node_dir)) == []
    assert not [line for line in run(["ip", "netns", "list"], kanri_env).stdout.splitlines() if "kanri-" in line]
    links = run(["ip", "-br", "link"], kanri_env).stdout
    assert "kanri0" not in links
    assert "kanri-svc" not in links
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(node_dir) not in mounts
