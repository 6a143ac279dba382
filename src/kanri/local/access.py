"""How a person on the host gets at what runs on the local node: container logs and port forwarding.

``kanri local logs`` reads the node's log files directly (``<node dir>/pods/<ns>_<pod>_<uid>/<container>/<n>.log``,
where ``n`` is the container's restart count), so it works without a kubelet API. ``kanri local port-forward``
listens on ``127.0.0.1`` and connects each client to the Service's ClusterIP (the node's service proxy picks a
ready endpoint, so a forward to ``svc/<name>-rw`` follows a failover) or to a pod's own address. On real nodes
(docs/real-nodes.md) the host reaches no ClusterIP, and the forward is ``kubectl port-forward``: the API server
asks the pod's kubelet to connect into the pod's network namespace (:func:`kubectl_port_forward`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kanri.local.node import log_path
from kanri.local.node.services import splice
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import POD, SERVICE

Obj = dict[str, Any]


class AccessError(Exception):
    """What the user asked for does not exist or cannot be reached; the message says which."""


def container_log_file(node_dir: Path, pod: Obj, container: str | None, previous: bool = False) -> Path:
    """The log file of ``container`` (default: the pod's only/first container) of ``pod``."""
    meta = pod["metadata"]
    names = [c["name"] for c in pod["spec"]["containers"]]
    name = container or names[0]
    if name not in names:
        raise AccessError(f"container {name!r} is not in pod {meta['name']}; choose one of {names}")
    statuses = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    restarts = int(statuses.get(name, {}).get("restartCount", 0))
    if previous:
        if restarts == 0:
            raise AccessError(f"container {name!r} of pod {meta['name']} has not restarted: no previous log")
        restarts -= 1
    path = log_path(node_dir, meta["namespace"], meta["name"], meta["uid"], name, restarts)
    if not path.exists():
        raise AccessError(f"no log for container {name!r} of pod {meta['name']} yet ({path})")
    return path


async def read_pod(client: Client, name: str, namespace: str) -> Obj:
    try:
        return await client.get(POD, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            raise AccessError(f'pod "{name}" not found in namespace "{namespace}"') from exc
        raise


@dataclass(frozen=True)
class Target:
    """Where forwarded connections go."""

    host: str
    port: int
    description: str


async def resolve_target(client: Client, resource: str, namespace: str, remote_port: int | None) -> Target:
    """``svc/NAME`` (ClusterIP, its first port unless ``remote_port``) or ``pod/NAME`` (``remote_port`` or the
    first container port)."""
    kind, _, name = resource.partition("/")
    if not name:
        kind, name = "pod", kind
    if kind in ("svc", "service", "services"):
        try:
            service = await client.get(SERVICE, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                raise AccessError(f'service "{name}" not found in namespace "{namespace}"') from exc
            raise
        ip = service["spec"].get("clusterIP")
        if not ip or ip == "None":
            raise AccessError(f"service {name} is headless (no ClusterIP); forward to one of its pods instead")
        ports = [p["port"] for p in service["spec"].get("ports") or []]
        port = remote_port or (ports[0] if ports else None)
        if port is None:
            raise AccessError(f"service {name} has no ports; give one as LOCAL:REMOTE")
        return Target(ip, int(port), f"svc/{name} ({ip}:{port})")
    if kind in ("pod", "pods", "po"):
        pod = await read_pod(client, name, namespace)
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            raise AccessError(f"pod {name} has no address yet (phase {(pod.get('status') or {}).get('phase')})")
        container_ports = [p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        port = remote_port or (container_ports[0] if container_ports else None)
        if port is None:
            raise AccessError(f"pod {name} declares no container port; give one as LOCAL:REMOTE")
        return Target(ip, int(port), f"pod/{name} ({ip}:{port})")
    raise AccessError(f"cannot forward to {resource!r}: use svc/NAME or pod/NAME")


async def forward(target: Target, local_port: int, on_connection: Callable[[str], None] | None = None,
                  address: str = "127.0.0.1") -> asyncio.Server:  # fmt: skip
    """Listen on ``address:local_port``; each connection is spliced to ``target``. Returns the (serving) server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(target.host, target.port), 10
            )
        except (OSError, TimeoutError) as exc:
            if on_connection is not None:
                on_connection(f"cannot reach {target.description}: {exc}")
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        if on_connection is not None:
            on_connection(f"handling connection for {local_port}")
        await splice(reader, writer, upstream_reader, upstream_writer)

    return await asyncio.start_server(handle, address, local_port)


def kubectl_port_forward(kubeconfig: Path, resource: str, namespace: str, ports: str, address: str) -> list[str]:
    """The ``kubectl port-forward`` command line for ``resource`` (``svc/NAME``, ``pod/NAME`` or a bare pod name)
    and ``ports`` (``LOCAL:REMOTE``; for a Service REMOTE is the Service's port, which kubectl maps to the chosen
    pod's target port). kubectl prints ``Forwarding from ADDRESS:PORT -> REMOTE`` on stdout once it listens."""
    kind, _, name = resource.partition("/")
    target = resource if name else f"pod/{kind}"
    return ["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "port-forward", target, ports,
            f"--address={address}"]  # fmt: skip
