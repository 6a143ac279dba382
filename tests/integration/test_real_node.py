"""One real Kubernetes node — the upstream kubelet v1.37.2, containerd 2.4.2, runc 1.5.3 and the CNI plugins, built
from their Go modules — registered with the session's control plane (docs/real-nodes.md).

Each rule below is enforced by the real components, not by kanri: the kubelet reports the OOM kill the kernel did in
the cgroup runc set up, runc mounts the root filesystem read-only, the kubelet refuses to run a root image under
``runAsNonRoot``. ``kubectl logs`` and ``kubectl exec`` go API server -> kubelet -> containerd's streaming server.

Run alone and serialized with the other tests that use the machine's pod networks:
``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_node.py -q``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kanri.images.push import push_layout
from kanri.images.registry import Destination, Oras
from kanri.local.controlplane import Endpoint
from kanri.local.paths import build_dir
from kanri.local.realnode import NodeRegistry, NodeSpec, RealNode, cgroups
from kanri.local.realnode.images import IMAGE_REGISTRY, built_images
from kanri.local.registry import LocalRegistry, RegistryEndpoint
from tests.integration.realnode_support import http_get, kubectl, pod, root_variant
from tests.support import NotYet, eventually

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]

NODE = "real-node-a"
ZONE = "zone-a"
ROOT_IMAGE_REPOSITORY = f"{IMAGE_REGISTRY}/kanri-tools-root"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryEndpoint]:
    """A local registry (distribution, TLS with a CA of its own) on the machine's loopback, as `kanri local up`
    starts one."""
    local = LocalRegistry(tmp_path_factory.mktemp("registry"))
    endpoint = local.start()
    try:
        yield endpoint
    finally:
        local.stop()


@pytest.fixture(scope="module")
def real_node(
    control_plane: Endpoint, registry: RegistryEndpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    """A real node on the session's control plane, with the tools image and a root-user variant of it, pulling what
    it does not hold from the local registry."""
    work = tmp_path_factory.mktemp("real-node")
    root_variant(built_images(build_dir() / "images")["kanri-tools"].layout, work / "tools-root")
    node = RealNode(
        NodeSpec(NODE, ZONE, 0),
        work / "node",
        control_plane.kubeconfig.parent,
        images=("kanri-tools",),
        extra_layouts=((work / "tools-root", ROOT_IMAGE_REPOSITORY),),
        registry=NodeRegistry(int(registry.address.rsplit(":", 1)[1]), registry.ca_file),
    )
    seconds = node.start()
    print(f"real node {NODE}: start -> Ready in {seconds:.1f} s")
    try:
        yield node
    finally:
        node.stop()
        node.deregister()  # the session's later tests must not see a dead node the scheduler could pick
        assert node.leftovers() == []


@pytest.fixture
def kubeconfig(control_plane: Endpoint) -> Path:
    return control_plane.kubeconfig


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run: a zombie is dead (the machine's init reaps the node's orphans in its time)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def tools_image(node: RealNode) -> str:
    return node.image("kanri-tools").ref


async def create(kubeconfig: Path, namespace: str, manifest: dict[str, Any]) -> None:
    await kubectl(kubeconfig, "-n", namespace, "create", "-f", "-", "-o", "name", stdin=manifest)


async def pod_status(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(await kubectl(kubeconfig, "-n", namespace, "get", "pod", name, "-o", "json"))[
        "status"
    ]
    return status


def container_state(status: dict[str, Any]) -> dict[str, Any]:
    """The main container's state (``{}`` before the kubelet reported one)."""
    statuses = status.get("containerStatuses") or [{}]
    state: dict[str, Any] = statuses[0].get("state", {})
    return state


async def terminated(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """The main container's terminated state, once the kubelet reported it."""

    async def check() -> dict[str, Any] | None:
        state = container_state(await pod_status(kubeconfig, namespace, name))
        return state.get("terminated")

    result: dict[str, Any] = await eventually(check, timeout=60)
    return result


async def running(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        status = await pod_status(kubeconfig, namespace, name)
        return status if status.get("phase") == "Running" else None

    result: dict[str, Any] = await eventually(check, timeout=60)
    return result


async def test_node_registers_ready_with_containerd_as_its_runtime(real_node: RealNode, kubeconfig: Path) -> None:
    wide = await kubectl(kubeconfig, "get", "nodes", NODE, "-o", "wide", "--no-headers")
    assert " Ready " in wide, wide
    assert "containerd://2.4.2" in wide, wide
    assert "v1.37.2" in wide, wide
    node = json.loads(await kubectl(kubeconfig, "get", "node", NODE, "-o", "json"))
    assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == ZONE
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == real_node.spec.ip


async def test_logs_and_exec_go_through_the_real_kubelet(real_node: RealNode, kubeconfig: Path, namespace: str) -> None:
    command = ["bash", "-c", "echo hello from a real node; exec sleep 3600"]
    started = time.monotonic()
    await create(kubeconfig, namespace, pod("talker", NODE, tools_image(real_node), command, restart="Always"))
    await running(kubeconfig, namespace, "talker")
    print(f"pod create -> Running in {time.monotonic() - started:.1f} s")

    async def logged() -> str | None:
        out = await kubectl(kubeconfig, "-n", namespace, "logs", "talker", check=False)
        return out if "hello from a real node" in out else None

    await eventually(logged, timeout=30)
    out = await kubectl(kubeconfig, "-n", namespace, "exec", "talker", "--", "bash", "-c", "echo $((6 * 7)); id -u")
    assert out.split() == ["42", "65532"]  # the image's own user, as runc set it


async def test_port_forward_reaches_a_pod_port_through_the_real_kubelet(
    real_node: RealNode, kubeconfig: Path, namespace: str
) -> None:
    serve = ["python3", "-m", "http.server", "8080", "--directory", "/etc"]
    await create(kubeconfig, namespace, pod("web", NODE, tools_image(real_node), serve, restart="Always"))
    await running(kubeconfig, namespace, "web")
    forward = await asyncio.create_subprocess_exec(
        "kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "port-forward", "pod/web", "0:8080",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        async with asyncio.timeout(30):
            line = (await forward.stdout.readline()).decode()  # Forwarding from 127.0.0.1:PORT -> 8080
        port = int(line.split("127.0.0.1:")[1].split()[0])

        response = await http_get(port, "/hostname")
        assert response.rstrip().endswith(b"web"), response  # the pod's /etc/hostname: the kubelet named it
    finally:
        forward.terminate()
        await forward.wait()


async def test_memory_limit_is_enforced_and_reported_as_oomkilled(
    real_node: RealNode, kubeconfig: Path, namespace: str
) -> None:
    # bash keeps the 64 MiB a command substitution reads in memory: over the 32 MiB limit the kernel kills it.
    command = ["bash", "-c", "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived ${#x}"]
    limits = {"resources": {"limits": {"memory": "32Mi"}, "requests": {"memory": "32Mi"}}}
    await create(kubeconfig, namespace, pod("hog", NODE, tools_image(real_node), command, container=limits))
    state = await terminated(kubeconfig, namespace, "hog")
    assert state["reason"] == "OOMKilled", state
    assert state["exitCode"] == 137, state


async def test_read_only_root_filesystem_cannot_be_written(
    real_node: RealNode, kubeconfig: Path, namespace: str
) -> None:
    # /tmp is writable by the image's user: only the read-only mount runc made can refuse the write.
    security = {"securityContext": {"readOnlyRootFilesystem": True}}
    await create(
        kubeconfig, namespace, pod("ro", NODE, tools_image(real_node), ["touch", "/tmp/probe"], container=security)
    )
    await create(kubeconfig, namespace, pod("rw", NODE, tools_image(real_node), ["touch", "/tmp/probe"]))
    assert (await terminated(kubeconfig, namespace, "rw"))["exitCode"] == 0
    state = await terminated(kubeconfig, namespace, "ro")
    assert state["exitCode"] == 1, state
    logs = await kubectl(kubeconfig, "-n", namespace, "logs", "ro")
    assert "Read-only file system" in logs, logs


async def test_run_as_non_root_refuses_a_root_image(real_node: RealNode, kubeconfig: Path, namespace: str) -> None:
    image = f"{ROOT_IMAGE_REPOSITORY}:{real_node.image('kanri-tools').tag}"
    security = {"securityContext": {"runAsNonRoot": True}}
    await create(kubeconfig, namespace, pod("rooted", NODE, image, ["id", "-u"], container=security))

    async def refused() -> dict[str, Any] | None:
        waiting: dict[str, Any] | None = container_state(await pod_status(kubeconfig, namespace, "rooted")).get(
            "waiting"
        )
        return waiting if waiting and waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = await eventually(refused, timeout=60)
    assert "non-root" in waiting.get("message", ""), waiting
    # the same image without the rule runs, as root: the refusal came from the rule, not from a broken image
    await create(kubeconfig, namespace, pod("rooted-allowed", NODE, image, ["id", "-u"]))
    assert (await terminated(kubeconfig, namespace, "rooted-allowed"))["exitCode"] == 0
    assert (await kubectl(kubeconfig, "-n", namespace, "logs", "rooted-allowed")).strip() == "0"


# Creating a user namespace needs no capability, and the image's user may do it, unless a seccomp filter says no:
# the runtime's default profile (RuntimeDefault) refuses unshare(CLONE_NEWUSER) to a container without CAP_SYS_ADMIN.
UNSHARE_USERNS = [
    "python3",
    "-c",
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
    "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())",
]


async def test_seccomp_runtime_default_refuses_a_filtered_syscall(
    real_node: RealNode, kubeconfig: Path, namespace: str
) -> None:
    confined = {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}
    image = tools_image(real_node)
    await create(kubeconfig, namespace, pod("confined", NODE, image, UNSHARE_USERNS, container=confined))
    await create(kubeconfig, namespace, pod("unconfined", NODE, image, UNSHARE_USERNS))  # the kubelet's default
    await terminated(kubeconfig, namespace, "confined")
    await terminated(kubeconfig, namespace, "unconfined")
    assert (await kubectl(kubeconfig, "-n", namespace, "logs", "unconfined")).split() == ["unshare", "0", "0"]
    assert (await kubectl(kubeconfig, "-n", namespace, "logs", "confined")).split() == ["unshare", "-1", "1"]  # EPERM


async def test_dropped_capabilities_bind_even_root(real_node: RealNode, kubeconfig: Path, namespace: str) -> None:
    # root may give a file away only with CAP_CHOWN, which the runtime's default set grants and ALL drops
    image = f"{ROOT_IMAGE_REPOSITORY}:{real_node.image('kanri-tools').tag}"
    give_away = ["bash", "-c", "touch /tmp/f && chown 1234 /tmp/f && echo given"]
    dropped = {"securityContext": {"capabilities": {"drop": ["ALL"]}}}
    await create(kubeconfig, namespace, pod("dropped", NODE, image, give_away, container=dropped))
    await create(kubeconfig, namespace, pod("default-caps", NODE, image, give_away))
    assert (await terminated(kubeconfig, namespace, "default-caps"))["exitCode"] == 0
    assert (await terminated(kubeconfig, namespace, "dropped"))["exitCode"] == 1
    logs = await kubectl(kubeconfig, "-n", namespace, "logs", "dropped")
    assert "Operation not permitted" in logs, logs


async def test_a_second_node_shares_the_machine_in_namespaces_of_its_own(
    real_node: RealNode, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    second = RealNode(NodeSpec("real-node-b", "zone-b", 1), tmp_path / "node-b", real_node.control_plane_dir)
    await asyncio.to_thread(second.start)
    try:
        node = json.loads(await kubectl(kubeconfig, "get", "node", "real-node-b", "-o", "json"))
        assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-b"
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == second.spec.ip != real_node.spec.ip
        pause = real_node.image("kanri-pause").ref  # the only image the second node imported
        await create(kubeconfig, namespace, pod("on-b", "real-node-b", pause, ["/usr/bin/catatonit", "-P"]))
        status = await running(kubeconfig, namespace, "on-b")
        assert ipaddress.ip_address(status["podIP"]) in ipaddress.ip_network(second.spec.pod_cidr), status
        assert real_node.pids().isdisjoint(second.pids())
    finally:
        await asyncio.to_thread(second.stop)
        await asyncio.to_thread(second.deregister)
    assert second.leftovers() == []
    assert real_node.leftovers() != []  # the first node runs on, its namespace, link and cgroups in place
    assert real_node.is_ready()


async def test_a_pod_that_cannot_start_says_why_in_its_status_and_an_event(
    real_node: RealNode, kubeconfig: Path, namespace: str
) -> None:
    await create(kubeconfig, namespace, pod("imageless", NODE, f"{IMAGE_REGISTRY}/absent:1", ["true"]))

    async def refused() -> dict[str, Any] | None:
        waiting: dict[str, Any] | None = container_state(await pod_status(kubeconfig, namespace, "imageless")).get(
            "waiting"
        )
        return waiting if waiting and waiting.get("reason") == "ErrImageNeverPull" else None

    await eventually(refused, timeout=60)

    async def event_reasons() -> set[str] | None:
        selector = "involvedObject.name=imageless"
        events = json.loads(
            await kubectl(kubeconfig, "-n", namespace, "get", "events", "--field-selector", selector, "-o", "json")
        )
        reasons = {e["reason"] for e in events["items"]}
        return reasons if "ErrImageNeverPull" in reasons else None

    await eventually(event_reasons, timeout=30)


async def test_an_image_only_in_the_local_registry_is_pulled_under_the_name_imported_images_have(
    real_node: RealNode, registry: RegistryEndpoint, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    """Registry pulls (issue 27): the node's containerd pulls ``kanri.local/<repository>:<tag>`` from the local
    registry (where ``kanri images push --local`` puts it) over TLS verified against the registry's CA, through the
    gateway's DNAT to the machine's loopback. The image was never imported into the node.

    It is an image of its own (the pause image's, as root: a new image ID). Pulled under a new name, an image the node
    also holds imported would become unusable to ``imagePullPolicy: Never`` pods under its imported name — the real
    kubelet's pull records (KEP-2535) then ask for a pull to verify access, which Never forbids: the later tests of
    this module failed that way when this test pulled the tools image under another name."""
    paused = tmp_path / "pause-root"
    root_variant(real_node.image("kanri-pause").layout, paused)
    tag = real_node.image("kanri-pause").tag
    destination = Destination(registry.address, "kanri", ca_file=registry.ca_file)
    pushed = await asyncio.to_thread(push_layout, Oras(), paused, "kanri-pause-pulled", destination)
    digest = next(p.digest for p in pushed if p.tag == tag)
    always = {"imagePullPolicy": "Always"}
    image = f"{IMAGE_REGISTRY}/kanri-pause-pulled:{tag}"
    manifest = pod("pulled", NODE, image, [], restart="Always", container=always)
    del manifest["spec"]["containers"][0]["command"]  # the image's own entrypoint: catatonit, pausing
    await create(kubeconfig, namespace, manifest)
    status = await running(kubeconfig, namespace, "pulled")
    assert status["containerStatuses"][0]["imageID"].endswith(digest), status  # what the registry served
    assert "Pulled" in await reasons_of(kubeconfig, namespace, "pulled", "Pulled")

    # a tag the registry does not hold: the kubelet says so (the registry's answer, through containerd)
    missing = f"{IMAGE_REGISTRY}/kanri-pause-pulled:never-pushed"
    await create(kubeconfig, namespace, pod("unpushed", NODE, missing, ["true"], container=always))

    async def refused() -> dict[str, Any] | None:
        waiting = container_state(await pod_status(kubeconfig, namespace, "unpushed")).get("waiting") or {}
        return waiting if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    waiting = await eventually(refused, timeout=60)
    assert "not found" in str(waiting.get("message")), waiting


async def reasons_of(kubeconfig: Path, namespace: str, name: str, wanted: str) -> set[str]:
    """The reasons of the Events about pod ``name``, once ``wanted`` is among them."""

    async def check() -> set[str] | None:
        selector = f"involvedObject.name={name}"
        events = json.loads(
            await kubectl(kubeconfig, "-n", namespace, "get", "events", "--field-selector", selector, "-o", "json")
        )
        reasons = {e["reason"] for e in events["items"]}
        return reasons if wanted in reasons else None

    found: set[str] = await eventually(check, timeout=30)
    return found


def ticker_clock(node: RealNode) -> Path | None:
    """The file the ticker pod rewrites, seen from the host through its process's root."""
    for pid in node.pids():
        try:
            if b"/tmp/tick" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return Path(f"/proc/{pid}/root/tmp/tick")
        except FileNotFoundError:
            continue
    return None


def read_clock(clock: Path) -> str:
    try:
        return clock.read_text()
    except FileNotFoundError:
        return ""


async def test_freeze_stops_every_process_of_the_node_at_once_and_thaw_resumes_them(
    real_node: RealNode, kubeconfig: Path, namespace: str
) -> None:
    tick = ["bash", "-c", "while :; do date +%s%N > /tmp/tick; sleep 0.05; done"]
    await create(kubeconfig, namespace, pod("ticker", NODE, tools_image(real_node), tick, restart="Always"))
    await running(kubeconfig, namespace, "ticker")

    async def clock_found() -> Path | None:
        return ticker_clock(real_node)

    clock = await eventually(clock_found, timeout=30)

    async def ticking() -> str | None:
        return read_clock(clock) or None

    await eventually(ticking, timeout=30)
    real_node.freeze()
    try:
        frozen_at = read_clock(clock)
        await asyncio.sleep(1.0)  # twenty ticks' time: an absence of change can only be watched for a while
        assert read_clock(clock) == frozen_at
    finally:
        real_node.thaw()

    async def resumed() -> bool:
        return read_clock(clock) not in ("", frozen_at)

    await eventually(resumed, timeout=30)
    assert real_node.is_ready()


async def test_stop_kills_the_whole_node_at_once_and_start_brings_it_back(
    real_node: RealNode, kubeconfig: Path, namespace: str
) -> None:
    await create(
        kubeconfig, namespace, pod("survivor", NODE, tools_image(real_node), ["sleep", "3600"], restart="Always")
    )
    await running(kubeconfig, namespace, "survivor")
    pids = real_node.pids()
    assert len(pids) >= 5, pids  # kubelet, containerd, a shim, the pause process, sleep at least
    await asyncio.to_thread(real_node.stop)
    assert alive(pids) == set()
    assert real_node.leftovers() == []

    seconds = await asyncio.to_thread(real_node.start)
    print(f"real node {NODE}: restart -> Ready in {seconds:.1f} s")

    # the kubelet finds the pod's containers dead with the node (containerd kept their records, not their
    # processes) and starts the pod again in a new sandbox
    seen: list[dict[str, Any]] = []

    async def restarted() -> dict[str, Any] | None:
        status = await pod_status(kubeconfig, namespace, "survivor")
        seen[:] = [status]
        restarts = (status.get("containerStatuses") or [{}])[0].get("restartCount", 0)
        return status if status.get("phase") == "Running" and restarts >= 1 else None

    try:
        again = await eventually(restarted, timeout=90)
    except NotYet as error:
        raise AssertionError(f"{error}; the pod's last status: {seen}\n{real_node.log_tail()}") from None
    assert again["containerStatuses"][0]["ready"], again


async def test_a_node_killed_without_clean_up_starts_again_from_a_new_process(
    real_node: RealNode, kubeconfig: Path
) -> None:
    # a crash of everything: the node's processes die, its namespace, links and cgroups stay behind
    await asyncio.to_thread(cgroups.kill_all, real_node.spec.cgroup)
    assert real_node.leftovers() != []
    # a new RealNode (as a new `kanri` process would make) cleans up by name and starts the node again
    again = RealNode(real_node.spec, real_node.layout.root, real_node.control_plane_dir, images=("kanri-tools",))
    seconds = await asyncio.to_thread(again.start)
    print(f"real node {NODE}: start after a crash -> Ready in {seconds:.1f} s")
    wide = await kubectl(kubeconfig, "get", "nodes", NODE, "-o", "wide", "--no-headers")
    assert " Ready " in wide, wide
    await asyncio.to_thread(again.stop)
    assert again.leftovers() == []
