"""`kanri local up | status | kubeconfig | down` as a user runs them: a second control plane of its own, stopped with
SIGTERM and restarted on the same data dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

KANRI = [sys.executable, "-m", "kanri.cli.main"]


def run(args: list[str], env: dict[str, str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, check=check, timeout=240)


@pytest.fixture
def kanri_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "KANRI_HOME": str(tmp_path / "kanri-home")}
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
        if f"--data-dir={data_dir}".encode() in cmdline:
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
