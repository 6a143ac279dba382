"""``python -m kanri.cache.agent server|sentinel``: the entrypoint of a Cache pod's two containers.

``server`` writes the runtime valkey.conf (the ConfigMap's lines, the password from the mounted Secret, a fenced
start), runs valkey-server, takes the role :func:`~kanri.cache.agent.fencing.decide_start` gives it and then keeps it
(:func:`~kanri.cache.agent.node.keep_role`: a primary the Sentinels no longer name steps down), labelling its own pod
with that role (:mod:`kanri.cache.agent.labels`: ``-rw`` follows a failover while the operator is down) and taking it
out of ``-ro`` once its server is a replica past the read bound (:mod:`kanri.cache.agent.readable`); it exits with
the server. ``sentinel`` writes Sentinel's file once (monitoring the primary the other Sentinels name, or the
one a peer reports, or the first pod of a new cache) and becomes Sentinel. The contract with the operator's
StatefulSet (kanri.cache.children) is the environment and the mounts below.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from kanri.cache.agent.labels import pod_label_from_environment
from kanri.cache.agent.node import (
    Node,
    history,
    manage_role,
    named_primary,
    runtime_config,
    sentinel_file,
    start_server,
    stop,
)
from kanri.cache.agent.readable import ReadGuard
from kanri.cache.agent.resp import Secret

CONFIG_DIR = Path(os.environ.get("CACHE_CONFIG_DIR", "/etc/cache/config"))
SECRET_FILE = Path(os.environ.get("CACHE_PASSWORD_FILE", "/etc/cache/secret/password"))
RUN_DIR = Path(os.environ.get("CACHE_RUN_DIR", "/run/cache"))
SENTINEL_DIR = Path(os.environ.get("CACHE_SENTINEL_DIR", "/sentinel"))
BINARY = Path(os.environ.get("VALKEY_SERVER", "valkey-server"))
VALKEY_PORT, SENTINEL_PORT = 6379, 26379


def address(index: int, port: int) -> str:
    cache, namespace = os.environ["CACHE_NAME"], os.environ["POD_NAMESPACE"]
    service = os.environ.get("CACHE_SERVICE", f"{cache}-hl")
    domain = os.environ.get("CLUSTER_DOMAIN", "cluster.local")
    return f"{cache}-{index}.{service}.{namespace}.svc.{domain}:{port}"


def node_from_environment(port: int) -> Node:
    """This pod's part, from the environment the StatefulSet sets (CACHE_NAME, CACHE_REPLICAS, POD_NAME, ...)."""
    index = int(os.environ["POD_NAME"].rsplit("-", 1)[1])
    count = int(os.environ["CACHE_REPLICAS"])
    servers = [address(i, VALKEY_PORT) for i in range(count)]
    me = address(index, port)
    return Node(
        master=os.environ["CACHE_NAME"],
        me=me,
        peers=tuple(s for i, s in enumerate(servers) if i != index),
        sentinels=tuple(address(i, SENTINEL_PORT) for i in range(count)),
        password=Secret(SECRET_FILE.read_text().strip()),
        bootstrap=index == 0,
    )


def server_file(node: Node) -> Path:
    """The runtime valkey.conf, readable by this user only (the password is in it)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    config = RUN_DIR / "valkey.conf"
    config.write_text(runtime_config((CONFIG_DIR / "valkey.conf").read_text(), node))
    config.chmod(0o600)
    return config


async def serve() -> int:
    node = node_from_environment(VALKEY_PORT)
    config = server_file(node)
    process = await start_server(BINARY, config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, process.terminate)
    label = pod_label_from_environment()
    publish, guard = (label.offer, ReadGuard(label).offer) if label is not None else (None, None)
    role = asyncio.create_task(manage_role(node, publish=publish, guard=guard))
    code = await process.wait()
    role.cancel()
    return code


async def first_primary(node: Node) -> str:
    """The primary a new Sentinel monitors: the one the other Sentinels name, else a peer that reports itself
    primary, else the first pod."""
    named = await named_primary(node)
    if named is not None:
        return named
    for peer in (*node.peers, node.me.replace(f":{SENTINEL_PORT}", f":{VALKEY_PORT}")):
        seen = await history(node, peer)
        if seen is not None and seen.role == "primary":
            return peer
    return address(0, VALKEY_PORT)


def write_sentinel_file(node: Node, config: Path, primary: str) -> None:
    config.write_text(sentinel_file((CONFIG_DIR / "sentinel.conf").read_text(), node, primary))
    config.chmod(0o600)


async def sentinel() -> int:
    node = node_from_environment(SENTINEL_PORT)
    config = SENTINEL_DIR / "sentinel.conf"
    if not config.is_file():  # Sentinel rewrites its own file as it learns: written once per pod
        write_sentinel_file(node, config, await first_primary(node))
    process = await asyncio.create_subprocess_exec(str(BINARY), str(config), "--sentinel")
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, process.terminate)
    try:
        return await process.wait()
    finally:
        await stop(process)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("server", "sentinel"):
        sys.exit("usage: python -m kanri.cache.agent server|sentinel")
    sys.exit(asyncio.run(serve() if mode == "server" else sentinel()))


if __name__ == "__main__":
    main()
