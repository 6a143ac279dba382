"""The local node's kubelet-lite on the real control plane: containers as real processes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.leftovers import find_leftovers
from kanri.local.node import LocalNode, NodeOptions
from kanri.local.node.cgroups import leftover_cgroups
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import EVENT, POD, SECRET
from tests.local_node_support import allow_privileged_pods, init_pid, running_nodes, with_test_network
from tests.support import eventually

Obj = dict[str, Any]

SLEEPER = "kanri.dev/test/sleeper:1"
SHELL = "kanri.dev/test/sh:1"
IMAGES = [
    {"image": SLEEPER, "command": ["/usr/bin/sleep"], "args": ["3600"]},
    {"image": "kanri.dev/test/sh:*", "command": ["/bin/sh", "-c"]},
]


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(namespace: str, client: Client) -> str:
    """The test's namespace, opted into Pod Security ``privileged`` by the cluster admin: these tests share host
    directories with their pods (``hostPath``: the scripts' output, files bound over ``/etc``), which the local
    cluster's default level (``baseline``) refuses."""
    await allow_privileged_pods(client, namespace)
    return namespace


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[LocalNode]:
    """A local node of its own with the test images mapped and a fast crash-loop back-off; stopped and deleted
    after, and no container process may survive it."""
    image_map = tmp_path / "images.json"
    image_map.write_text("[]")
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path / "node",
            name=f"test-kubelet-{secrets.token_hex(3)}",
            image_map_file=image_map,
            images=IMAGES,
            restart_backoff_base=0.2,
            restart_backoff_max=1.0,
        )
    )
    pids: list[int] = []
    async with running_nodes(control_plane.kubeconfig, options, count=1) as host:
        local = host.nodes[0]
        try:
            yield local
        finally:
            pids = _container_pids(local)
    assert not [pid for pid in pids if _alive(pid)], "container processes outlived the node"
    assert not leftover_cgroups(local.options.data_dir), "cgroups outlived the node"
    assert not find_leftovers(options), "the node host left something behind"


def _container_pids(node: LocalNode) -> list[int]:
    return [p.pid for w in node.kubelet.workers.values() for p in w.processes.values()]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def pod(name: str, namespace: str, node: LocalNode, *, restart_policy: str = "Always", **container: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node.options.name,  # bound directly: the scheduler is tested elsewhere
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": SLEEPER, **container}],
        },
    }


def condition(obj: Obj, kind: str) -> Obj | None:
    return get_condition((obj.get("status") or {}).get("conditions"), kind)


def main_status(obj: Obj) -> Obj | None:
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else None


async def running(client: Client, name: str, namespace: str, restarts: int = 0) -> Obj | None:
    live = await client.get(POD, name, namespace)
    status = main_status(live)
    ready = condition(live, "Ready")
    if (
        live["status"].get("phase") == "Running"
        and status is not None
        and "running" in status["state"]
        and status["restartCount"] == restarts
        and ready is not None
        and ready["status"] == "True"
    ):
        return live
    return None


async def finished(client: Client, name: str, namespace: str) -> Obj | None:
    live = await client.get(POD, name, namespace)
    return live if live["status"].get("phase") in ("Succeeded", "Failed") else None


def container_pid(node: LocalNode, namespace: str, name: str) -> int | None:
    """The container's launcher (its shim, which the kubelet watches)."""
    for worker in node.kubelet.workers.values():
        if (worker.namespace, worker.name) == (namespace, name) and "main" in worker.processes:
            return worker.processes["main"].pid
    return None


def host_dir(path: Path) -> Obj:
    """A pod's volume and mount showing ``path`` of the host at the same place (a container's root is its own)."""
    return {
        "volumes": [{"name": "shared", "hostPath": {"path": str(path)}}],
        "volumeMounts": [{"name": "shared", "mountPath": str(path)}],
    }


def with_host_dir(spec: Obj, path: Path) -> Obj:
    mounts = host_dir(path)
    spec["spec"]["volumes"] = [*spec["spec"].get("volumes", []), *mounts["volumes"]]
    main = spec["spec"]["containers"][0]
    main["volumeMounts"] = [*main.get("volumeMounts", []), *mounts["volumeMounts"]]
    return spec


@contextlib.contextmanager
def shared_dir() -> Any:
    """A directory any uid can write to (pytest's tmp dirs are root-only), outside /tmp (a container's /tmp is
    its own); pods see it through :func:`with_host_dir`."""
    path = Path(tempfile.mkdtemp(prefix="kanri-kubelet-", dir="/var/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_pod_runs_with_env_args_working_dir_and_user(client: Client, node: LocalNode, namespace: str) -> None:
    secret = {
        "metadata": {"name": "creds", "namespace": namespace},
        "data": {"token": base64.b64encode(b"s3cr3t").decode()},
    }
    await client.create(SECRET, secret)
    with shared_dir() as work:
        script = 'echo "$POD_NAME $POD_NAMESPACE $MY_SECRET $GREETING $PWD $(id -u) $1" > out.txt; exec sleep 3600'
        spec = pod(
            "shell",
            namespace,
            node,
            image=SHELL,
            args=[script, "sh", "$(GREETING)-arg"],
            workingDir=str(work),
            securityContext={"runAsUser": 65534},
            env=[
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "MY_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "GREETING", "value": "hello"},
            ],
        )
        await client.create(POD, with_host_dir(spec, work))
        live = await eventually(lambda: running(client, "shell", namespace), timeout=30)
        assert live["status"]["startTime"]
        assert live["status"]["hostIP"] == node.options.internal_ip
        for kind in ("Initialized", "ContainersReady", "Ready", "PodScheduled"):
            found = condition(live, kind)
            assert found is not None, kind
            assert found["status"] == "True", kind
        status = main_status(live)
        assert status is not None
        assert (status["name"], status["image"], status["ready"], status["started"]) == ("main", SHELL, True, True)
        out = await eventually(lambda: _read(work / "out.txt"), timeout=10)
        assert out.split() == ["shell", namespace, "s3cr3t", "hello", str(work), "65534", "hello-arg"]
        pid = init_pid(node, namespace, "shell")
        assert pid is not None
        assert os.stat(f"/proc/{pid}").st_uid == 65534


async def _read(path: Path) -> str | None:
    text = await asyncio.to_thread(lambda: path.read_text() if path.exists() else "")
    return text if text.strip() else None


async def test_killed_container_is_restarted_with_last_state(client: Client, node: LocalNode, namespace: str) -> None:
    await client.create(POD, pod("sleeper", namespace, node))
    await eventually(lambda: running(client, "sleeper", namespace), timeout=30)
    pid = container_pid(node, namespace, "sleeper")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    live = await eventually(lambda: running(client, "sleeper", namespace, restarts=1), timeout=30)
    status = main_status(live)
    assert status is not None
    terminated = status["lastState"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "Error")
    assert container_pid(node, namespace, "sleeper") not in (None, pid)


async def test_exit_code_with_restart_policy_never_fails_the_pod(
    client: Client, node: LocalNode, namespace: str
) -> None:
    await client.create(POD, pod("exits", namespace, node, restart_policy="Never", image=SHELL, args=["exit 3"]))
    live = await eventually(lambda: finished(client, "exits", namespace), timeout=30)
    assert live["status"]["phase"] == "Failed"
    status = main_status(live)
    assert status is not None
    assert status["state"]["terminated"]["exitCode"] == 3
    assert status["restartCount"] == 0
    ready = condition(live, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "PodCompleted")


async def test_on_failure_with_exit_zero_succeeds(client: Client, node: LocalNode, namespace: str) -> None:
    await client.create(POD, pod("done", namespace, node, restart_policy="OnFailure", image=SHELL, args=["exit 0"]))
    live = await eventually(lambda: finished(client, "done", namespace), timeout=30)
    assert live["status"]["phase"] == "Succeeded"
    status = main_status(live)
    assert status is not None
    assert (status["state"]["terminated"]["exitCode"], status["state"]["terminated"]["reason"]) == (0, "Completed")


async def test_the_termination_message_is_the_file_or_with_fallback_the_log_tail(
    client: Client, node: LocalNode, namespace: str
) -> None:
    verdict = 'echo noise; echo \'{"result": "Succeeded"}\' > /dev/termination-log; exit 0'
    await client.create(POD, pod("says", namespace, node, restart_policy="Never", image=SHELL, args=[verdict]))
    custom = "echo custom > /tmp/said; exit 4"
    await client.create(POD, pod("custom", namespace, node, restart_policy="Never", image=SHELL, args=[custom],
                                 terminationMessagePath="/tmp/said"))  # fmt: skip
    failing = "for i in $(seq 1 100); do echo line $i; done; exit 2"
    await client.create(POD, pod("falls", namespace, node, restart_policy="Never", image=SHELL, args=[failing],
                                 terminationMessagePolicy="FallbackToLogsOnError"))  # fmt: skip
    await client.create(POD, pod("quiet", namespace, node, restart_policy="Never", image=SHELL, args=[failing]))
    states = {}
    for name in ("says", "custom", "falls", "quiet"):
        live = await eventually(lambda n=name: finished(client, n, namespace), timeout=30)  # type: ignore[misc]
        status = main_status(live)
        assert status is not None
        states[name] = status["state"]["terminated"]
    assert states["says"]["message"].strip() == '{"result": "Succeeded"}'
    assert states["custom"]["message"].strip() == "custom"
    fallback = states["falls"]["message"].splitlines()
    assert fallback[-1] == "line 100"
    assert len(fallback) == 80  # the kubelet's limit: the last 80 lines
    assert "message" not in states["quiet"]  # policy File and an empty file: no message


async def test_unmapped_image_waits_visibly(client: Client, node: LocalNode, namespace: str) -> None:
    await client.create(POD, pod("unmapped", namespace, node, image="example.invalid/nothing:1"))

    async def waiting() -> Obj | None:
        status = main_status(await client.get(POD, "unmapped", namespace))
        found = status["state"].get("waiting") if status else None
        # ContainerCreating comes first, while the pod's network namespace is made.
        return found if found and found.get("reason") != "ContainerCreating" else None

    state = await eventually(waiting, timeout=30)
    assert state["reason"] == "ImageNotMapped"
    assert "example.invalid/nothing:1" in state["message"]
    assert str(node.options.image_map_file) in state["message"]

    async def warning() -> list[Obj]:
        events, _ = await client.list(EVENT, namespace, field_selector="involvedObject.name=unmapped")
        return [e for e in events if e["type"] == "Warning" and "example.invalid/nothing:1" in e["message"]]

    await eventually(warning, timeout=30)
    assert (await client.get(POD, "unmapped", namespace))["status"]["phase"] == "Pending"


async def test_deleting_a_pod_sends_sigterm_then_removes_it(client: Client, node: LocalNode, namespace: str) -> None:
    with shared_dir() as work:
        script = f"trap 'echo term > {work}/marker; exit 0' TERM; sleep 3600 & wait"
        await client.create(POD, with_host_dir(pod("graceful", namespace, node, image=SHELL, args=[script]), work))
        await eventually(lambda: running(client, "graceful", namespace), timeout=30)
        pid = container_pid(node, namespace, "graceful")
        assert pid is not None
        children = _children(pid)
        await client.delete(POD, "graceful", namespace)

        async def gone() -> bool:
            try:
                await client.get(POD, "graceful", namespace)
            except ApiError as exc:
                return exc.not_found
            return False

        await eventually(gone, timeout=30)
        assert (work / "marker").read_text().strip() == "term"
        assert not _alive(pid)
        assert not [child for child in children if _alive(child)]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pid:  # process group
                    found.append(int(entry.name))
    return found


async def test_stopping_the_node_leaves_no_process(client: Client, node: LocalNode, namespace: str) -> None:
    await client.create(POD, pod("one", namespace, node))
    await client.create(POD, pod("two", namespace, node, image=SHELL, args=["sleep 3600 & sleep 3600 & wait"]))
    await eventually(lambda: running(client, "one", namespace), timeout=30)
    await eventually(lambda: running(client, "two", namespace), timeout=30)
    pids = _container_pids(node)
    tree = [child for pid in pids for child in _children(pid)]
    assert len(pids) == 2
    assert len(tree) >= 4  # the two leaders and the second pod's two sleeps
    node.host.stop()

    async def all_gone() -> bool:
        return not [pid for pid in tree if _alive(pid)]

    await eventually(all_gone, timeout=10)


# --- containers die whole, on a root of their own, within their limits (issue 11) ----------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except FileNotFoundError:
        return ""


def _in_cgroup(node: LocalNode, namespace: str, name: str, command: str) -> list[int]:
    """Host pids of the processes of the pod's ``main`` container whose command line is ``command``."""
    for worker in node.kubelet.workers.values():
        cgroup = worker.cgroups.get("main") if (worker.namespace, worker.name) == (namespace, name) else None
        if cgroup is not None:
            return [pid for pid in cgroup.pids() if _cmdline(pid) == command and _alive(pid)]
    return []


def _pid_inside(pid: int) -> int:
    """The pid of host process ``pid`` in its own (innermost) PID namespace."""
    return int(Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0].split()[-1])


@contextlib.contextmanager
def etc_files(*names: str) -> Any:
    """Files in the host's /etc ("host v1"), removed after."""
    paths = [Path("/etc") / name for name in names]
    for path in paths:
        path.write_text("host v1\n")
    try:
        yield paths
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def _pod_cgroups(node: LocalNode, uid: str) -> list[Path]:
    return [d / f"pod{uid}" for d in node.kubelet.cgroups.nodes.values() if (d / f"pod{uid}").exists()]


async def test_a_daemonised_grandchild_dies_with_its_pod(client: Client, node: LocalNode, namespace: str) -> None:
    # setsid: the grandchild leaves the container's session and process group; only its PID namespace and cgroup
    # still hold it.
    script = "setsid sh -c 'exec sleep 1001' & exec sleep 3600"
    created = await client.create(POD, pod("daemon", namespace, node, image=SHELL, args=[script]))
    await eventually(lambda: running(client, "daemon", namespace), timeout=30)
    grandchild = await eventually(lambda: asyncio.sleep(0, _in_cgroup(node, namespace, "daemon", "sleep 1001")))
    init = init_pid(node, namespace, "daemon")
    assert init is not None
    assert _pid_inside(init) == 1
    await client.delete(POD, "daemon", namespace)

    async def gone() -> bool:
        try:
            await client.get(POD, "daemon", namespace)
        except ApiError as exc:
            return exc.not_found
        return False

    await eventually(gone, timeout=30)
    assert not [pid for pid in grandchild if _alive(pid)]
    assert not _pod_cgroups(node, created["metadata"]["uid"])


async def test_a_hung_container_killed_by_liveness_leaves_nothing(client: Client, node: LocalNode, namespace: str) -> (
    None
):  # fmt: skip
    # The issue's reproduction: every process SIGSTOPped (a hung PostgreSQL), the liveness probe fails, the
    # container is restarted — and no process of the old one may survive to hold its files.
    with shared_dir() as work:
        script = "setsid sh -c 'exec sleep 1002' & exec sleep 3600"
        spec = pod("hung", namespace, node, image=SHELL, args=[script])
        spec["spec"]["terminationGracePeriodSeconds"] = 1
        spec["spec"]["containers"][0]["livenessProbe"] = {
            "exec": {"command": ["/bin/sh", "-c", f"test ! -e {work}/hang"]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        }
        await client.create(POD, with_host_dir(spec, work))
        await eventually(lambda: running(client, "hung", namespace), timeout=30)
        first = await eventually(lambda: asyncio.sleep(0, _in_cgroup(node, namespace, "hung", "sleep 1002")))
        init = init_pid(node, namespace, "hung")
        assert init is not None
        for pid in [init, *first]:
            os.kill(pid, signal.SIGSTOP)
        (work / "hang").touch()
        await eventually(lambda: _restarted(client, "hung", namespace), timeout=30)
        (work / "hang").unlink()
        await eventually(lambda: running(client, "hung", namespace, restarts=1), timeout=30)
        assert not [pid for pid in [init, *first] if _alive(pid)]
        second = await eventually(lambda: asyncio.sleep(0, _in_cgroup(node, namespace, "hung", "sleep 1002")))
        assert set(second).isdisjoint(first)


async def _restarted(client: Client, name: str, namespace: str) -> bool:
    status = main_status(await client.get(POD, name, namespace))
    return status is not None and status["restartCount"] >= 1


async def test_an_exiting_init_takes_its_daemon_along(client: Client, node: LocalNode, namespace: str) -> None:
    script = "setsid sh -c 'exec sleep 1003' & sleep 1; exit 1"
    await client.create(POD, pod("exits", namespace, node, image=SHELL, args=[script]))
    first = await eventually(lambda: asyncio.sleep(0, _in_cgroup(node, namespace, "exits", "sleep 1003")))
    await eventually(lambda: _restarted(client, "exits", namespace), timeout=30)
    await eventually(lambda: asyncio.sleep(0, not [pid for pid in first if _alive(pid)]), timeout=5)
    status = main_status(await client.get(POD, "exits", namespace))
    assert status is not None
    assert status["lastState"]["terminated"]["exitCode"] == 1


async def test_host_changes_to_etc_do_not_reach_a_running_container(
    client: Client, node: LocalNode, namespace: str
) -> None:
    """The issue's apt-get: the host renames a new /etc/passwd into place. A file bound over a host /etc file (as
    the pod's passwd was) lost its mount; a file the pod only reads from /etc changed under it."""
    tag = secrets.token_hex(3)
    with etc_files(f"kanri-test-own-{tag}", f"kanri-test-snapshot-{tag}") as (own, snapshot), shared_dir() as work:
        (work / "own").write_text("pod\n")
        (work / "own").chmod(0o644)
        script = (
            f"while :; do {{ echo $$$$; cat {own} {snapshot}; ls /work 2>&1; }} > {work}/seen.tmp; "
            f"mv {work}/seen.tmp {work}/seen; sleep 0.2; done"
        )
        spec = with_host_dir(pod("etc", namespace, node, image=SHELL, args=[script]), work)
        spec["spec"]["terminationGracePeriodSeconds"] = 1
        spec["spec"]["volumes"].append({"name": "own", "hostPath": {"path": str(work / "own")}})
        spec["spec"]["containers"][0]["volumeMounts"].append({"name": "own", "mountPath": str(own)})
        await client.create(POD, spec)

        async def seen() -> list[str] | None:
            path = work / "seen"
            return path.read_text().splitlines() if path.exists() else None

        first = await eventually(seen, timeout=30)
        assert first[:3] == ["1", "pod", "host v1"]  # the shell is PID 1
        assert "No such file or directory" in first[3]  # this checkout's /work is not the container's
        for path in (own, snapshot):
            replacement = path.with_name(path.name + ".new")
            replacement.write_text("host v2\n")
            os.replace(replacement, path)
        await asyncio.sleep(1.5)  # several rounds of the loop
        after = await seen()
        assert after is not None
        assert after[:3] == ["1", "pod", "host v1"]


async def test_memory_limit_is_enforced_and_an_oom_kill_reported(
    client: Client, node: LocalNode, namespace: str
) -> None:
    allocate = "exec /usr/bin/python3 -c 'x = b\"x\" * (256 << 20)'"  # touches every page: they are charged
    spec = pod("hungry", namespace, node, restart_policy="OnFailure", image=SHELL, args=[allocate])
    spec["spec"]["containers"][0]["resources"] = {"limits": {"memory": "64Mi"}}
    await client.create(POD, spec)
    live = await eventually(lambda: _restarted(client, "hungry", namespace), timeout=30)
    assert live
    status = main_status(await client.get(POD, "hungry", namespace))
    assert status is not None
    terminated = status["lastState"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


async def test_cpu_limit_is_a_cfs_quota(client: Client, node: LocalNode, namespace: str) -> None:
    spec = pod("busy", namespace, node, image=SHELL, args=["while :; do :; done"])
    spec["spec"]["terminationGracePeriodSeconds"] = 1
    spec["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "200m"}}
    await client.create(POD, spec)
    await eventually(lambda: running(client, "busy", namespace), timeout=30)
    worker = next(w for w in node.kubelet.workers.values() if (w.namespace, w.name) == (namespace, "busy"))
    cgroup = worker.cgroups["main"]
    assert cgroup is not None
    cpu = cgroup.dirs["cpu"]
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "20000"
    assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    await asyncio.sleep(0.5)
    used, since = cgroup.cpu_usage_ns(), asyncio.get_running_loop().time()
    await asyncio.sleep(3)
    share = (cgroup.cpu_usage_ns() - used) / 1e9 / (asyncio.get_running_loop().time() - since)
    assert 0.1 < share < 0.3, share  # a busy loop alone would use a whole CPU
    throttled = dict(line.split() for line in (cpu / "cpu.stat").read_text().splitlines())
    assert int(throttled["nr_throttled"]) > 0
