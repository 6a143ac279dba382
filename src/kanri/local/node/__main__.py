"""``python -m kanri.local.node``: run the node host (``--nodes N`` local nodes) next to a control plane until
SIGTERM/SIGINT.

Started detached by ``kanri local up`` (see :mod:`kanri.local.nodeprocess`). Serves the chaos verbs on
``<data dir>/control.sock`` (:mod:`kanri.local.node.control`). Prints ``{"event": "ready"}`` on stdout once its
controllers have synced, ``{"event": "failed", "error": ...}`` if it cannot start, and
``{"event": "stopped"}`` after it has stopped every container and removed its namespaces, links and mountpoints.
Logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from kanri.local.node import NodeHost, NodeOptions
from kanri.local.node.control import serving, socket_path
from kanri.runtime import Client, configure_logging


def _event(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _extra_images(path: str | None) -> list[dict[str, Any]]:
    if not path:
        return []
    loaded = yaml.safe_load(Path(path).read_text())
    if isinstance(loaded, dict):
        loaded = loaded.get("images") or []
    if not isinstance(loaded, list):
        raise ValueError(f"{path}: expected a list of image entries or {{images: [...]}}")
    return loaded


async def _run(args: argparse.Namespace) -> int:
    options = NodeOptions(
        data_dir=Path(args.data_dir),
        name=args.name,
        image_map_file=Path(args.image_map) if args.image_map else None,
        images=_extra_images(args.extra_image_map),
        apiserver=("127.0.0.1", args.apiserver_port),
        kubeconfig=Path(args.kubeconfig),
        proxy_mode=args.proxy_mode,
        kubelet_pki_dir=Path(args.kubeconfig).parent / "pki",  # the control plane's data dir holds both
    )
    async with await Client.from_kubeconfig(args.kubeconfig) as client:
        host = NodeHost(client, options, args.nodes)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, host.stop)
        served = asyncio.Event()

        async def control() -> None:
            async with serving(host, socket_path(options.data_dir)):
                served.set()
                await asyncio.Event().wait()  # until the host cancels it

        task = asyncio.create_task(host.run(on_ready=control))
        while not task.done() and not served.is_set():  # noqa: ASYNC110 — polled with the task
            await asyncio.sleep(0.1)
        if task.done():
            exc = task.exception()
            _event("failed", error=str(exc) if exc else "the node host stopped before it was ready")
            return 1
        _event("ready", nodes=[n.name for n in host.nodes], pod_cidr=options.pod_cidr)
        await task
    _event("stopped")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kanri.local.node", description=__doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--apiserver-port", type=int, required=True)
    parser.add_argument("--name", default="kanri", help="prefix of the nodes' names (<name>-1, <name>-2, …)")
    parser.add_argument("--nodes", type=int, default=3, help="how many nodes (zones zone-a, zone-b, …)")
    parser.add_argument("--proxy-mode", choices=["nftables", "userspace"], default="nftables",
                        help="the real kube-proxy (nftables) or the node's userspace proxy for ClusterIPs")  # fmt: skip
    parser.add_argument("--image-map", help="the generated image map (YAML/JSON)")
    parser.add_argument("--extra-image-map", help="the user's image map; its entries win")
    args = parser.parse_args()
    configure_logging("info", json=True)
    try:
        sys.exit(asyncio.run(_run(args)))
    except Exception as exc:  # reported as the failed event; the log has the traceback
        _event("failed", error=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
