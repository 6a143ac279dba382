"""Node registration and heartbeats: what makes the control plane believe a kubelet is alive.

The node-lifecycle controller in kube-controller-manager watches two signals per node: the Ready condition's
``lastHeartbeatTime`` and the ``renewTime`` of the Lease named after the node in ``kube-node-lease``. When neither
moved for ``--node-monitor-grace-period`` (50 s by default in v1.37, 20 s in kanri's control plane), it sets
every condition to ``Unknown`` (``NodeStatusUnknown``), taints the node ``node.kubernetes.io/unreachable`` and,
later, evicts its pods.
:class:`NodeAgent` registers the Node and renews both every ``heartbeat_interval`` (10 s, like the kubelet).
"""

from __future__ import annotations

import asyncio
import copy
import os
import platform
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from kanri.local.node.kinds import NODE, NODE_LEASE_NAMESPACE
from kanri.local.node.options import NodeOptions
from kanri.local.node.resources import memory_total_kib
from kanri.local.node.state import NodeState
from kanri.runtime import ApiError, Client, get_condition, owner_reference, set_condition
from kanri.runtime.kinds import LEASE

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.node")

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}
# The local node measures no pressure; it reports "none seen" the way a kubelet with ample room would.
_PRESSURE = {
    "MemoryPressure": ("KanriHasSufficientMemory", "kanri local node does not measure memory pressure"),
    "DiskPressure": ("KanriHasNoDiskPressure", "kanri local node does not measure disk pressure"),
    "PIDPressure": ("KanriHasSufficientPID", "kanri local node does not measure PID pressure"),
}
_RETRY_AFTER_ERROR = 2.0
ZONE_LABEL = "topology.kubernetes.io/zone"


def _read(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def micro_time(moment: datetime) -> str:
    """metav1.MicroTime, as Lease ``renewTime`` wants it: ``2026-05-01T12:00:00.123456Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def time_seconds(moment: datetime) -> str:
    """metav1.Time: RFC 3339 with whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def capacity(max_pods: int, *, share: int = 1, cpus: int | None = None, meminfo: str | None = None) -> dict[str, str]:
    """The machine as a ResourceList, split ``share`` ways: every CPU (in millicores) and all memory (MemTotal)
    divided by ``share``, ``max_pods`` pods."""
    cpu_count = cpus if cpus is not None else (os.cpu_count() or 1)
    memory = memory_total_kib(meminfo if meminfo is not None else _read("/proc/meminfo"))
    return {"cpu": f"{cpu_count * 1000 // share}m", "memory": f"{memory // share}Ki", "pods": str(max_pods)}


def node_labels(options: NodeOptions) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": options.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": _ARCH.get(platform.machine(), platform.machine()),
        **({ZONE_LABEL: options.zone} if options.zone else {}),
        **options.labels,
    }


def node_info() -> dict[str, str]:
    """``status.nodeInfo``: what ``kubectl get nodes -o wide`` shows about the machine."""
    os_release = dict(
        line.split("=", 1) for line in _read("/etc/os-release").splitlines() if "=" in line and not line.startswith("#")
    )
    return {
        "machineID": _read("/etc/machine-id"),
        "systemUUID": _read("/etc/machine-id"),
        "bootID": _read("/proc/sys/kernel/random/boot_id"),
        "kernelVersion": platform.release(),
        "osImage": os_release.get("PRETTY_NAME", "Linux").strip('"'),
        "containerRuntimeVersion": "kanri://0.1.0",
        # Not a kubelet: an honest placeholder that still parses as a semantic version.
        "kubeletVersion": "v0.0.0-kanri",
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": _ARCH.get(platform.machine(), platform.machine()),
    }


def ready_conditions(existing: list[Obj], now: datetime) -> list[Obj]:
    """The node's conditions with Ready=True and no pressure, every heartbeat fresh.

    ``lastTransitionTime`` moves only when a status flips (say, back from the ``Unknown`` the node-lifecycle
    controller set while we were stopped).
    """
    conditions = copy.deepcopy(existing)
    wanted: dict[str, tuple[bool, str, str]] = {
        "Ready": (True, "KanriNodeReady", "kanri local node is posting ready status"),
        **{kind: (False, reason, message) for kind, (reason, message) in _PRESSURE.items()},
    }
    for kind, (status, reason, message) in wanted.items():
        set_condition(conditions, type=kind, status=status, reason=reason, message=message,
                      observed_generation=None, now=now)  # fmt: skip
        condition = get_condition(conditions, kind)
        assert condition is not None
        condition["lastHeartbeatTime"] = time_seconds(now)
    return conditions


def node_status(options: NodeOptions, resources: dict[str, str], conditions: list[Obj], kubelet_port: int = 0) -> Obj:
    return {
        "capacity": resources,
        # Nothing is reserved for system daemons: the machine is a developer's, and the pods are its workload.
        "allocatable": resources,
        "addresses": [
            {"type": "InternalIP", "address": options.internal_ip},
            {"type": "Hostname", "address": options.name},
        ],
        "conditions": conditions,
        "nodeInfo": node_info(),
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},  # where the API server reaches it
        # The API server then passes `kubectl exec`'s WebSocket on instead of translating it to SPDY.
        "declaredFeatures": ["ExtendWebSocketsToKubelet"] if kubelet_port else [],
    }


class NodeAgent:
    """Registers the Node and keeps it alive with heartbeats until cancelled."""

    def __init__(
        self,
        client: Client,
        options: NodeOptions,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        state: NodeState | None = None,
    ) -> None:
        self._client = client
        self.options = options
        self._now = now
        self._state = state or NodeState()
        self._resources = capacity(options.max_pods, share=options.machine_share)
        self.kubelet_port = 0
        """The kubelet API's port, advertised in the Node's status (0: none)."""
        self.heartbeats = 0
        """Heartbeats that reached the API server (status and Lease both written)."""

    async def run(self) -> None:
        """Heartbeat every ``heartbeat_interval`` until cancelled; a failed beat is retried sooner, never fatal."""
        while True:
            await self._state.active()  # a stopped, frozen or partitioned node posts nothing
            try:
                await self.heartbeat()
                delay = self.options.heartbeat_interval
            except ApiError as exc:
                log.warning("node heartbeat failed", node=self.options.name, error=str(exc))
                delay = min(self.options.heartbeat_interval, _RETRY_AFTER_ERROR)
            await asyncio.sleep(delay)

    async def heartbeat(self) -> Obj:
        """Register the Node if it is missing, post Ready with a fresh heartbeat, renew the Lease. Returns the Node."""
        try:
            node = await self._client.get(NODE, self.options.name)
        except ApiError as exc:
            if not exc.not_found:
                raise
            node = await self._register()
        now = self._now()
        conditions = ready_conditions((node.get("status") or {}).get("conditions") or [], now)
        patch = {"status": node_status(self.options, self._resources, conditions, self.kubelet_port)}
        node = await self._client.patch_status(NODE, self.options.name, patch)
        await self._renew_lease(node, now)
        self.heartbeats += 1
        return node

    async def _register(self) -> Obj:
        now = self._now()
        body: Obj = {
            "metadata": {"name": self.options.name, "labels": node_labels(self.options)},
            "spec": {},
            # Nodes keep the status they are created with, so the node is Ready from its first moment.
            "status": node_status(self.options, self._resources, ready_conditions([], now), self.kubelet_port),
        }
        try:
            node = await self._client.create(NODE, body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            node = await self._client.get(NODE, self.options.name)
        log.info("node registered", node=self.options.name, capacity=self._resources)
        return node

    async def _renew_lease(self, node: Obj, now: datetime) -> None:
        name = self.options.name
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": self.options.lease_duration_seconds,
            "renewTime": micro_time(now),
        }
        try:
            lease = await self._client.get(LEASE, name, NODE_LEASE_NAMESPACE)
        except ApiError as exc:
            if not exc.not_found:
                raise
            # Owned by the Node, like the kubelet's: deleting the Node lets the garbage collector take the Lease.
            owner = owner_reference(node, controller=False, block_owner_deletion=False)
            metadata = {"name": name, "namespace": NODE_LEASE_NAMESPACE, "ownerReferences": [owner]}
            await self._client.create(LEASE, {"metadata": metadata, "spec": spec})
            return
        lease["spec"] = {**(lease.get("spec") or {}), **spec}
        await self._client.replace(LEASE, lease)
