"""The agent's actions on real Valkey processes: start the server fenced, read histories, take the decided role, and
write Sentinel's file once. What to do is :mod:`kanri.cache.agent.fencing`'s call; this module only does it.

Addresses are ``host:port`` strings (pods use their stable DNS names, tests use 127.0.0.1 and their own ports), so the
same code runs in a pod and against local processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from kanri.cache.agent.fencing import (
    Demote,
    Fence,
    Follow,
    History,
    Lead,
    StartDecision,
    decide_catch_up,
    decide_running,
    decide_start,
)
from kanri.cache.agent.labels import role_label, sole_primary
from kanri.cache.agent.resp import UNAVAILABLE, Connection, Secret
from kanri.cache.agent.sources import LOCKED, REPLICATION_USER, SourceCheck, pick_source, source_password

__all__ = [
    "FENCED_PRIMARY",
    "Node",
    "ask_failover",
    "command",
    "history",
    "keep_role",
    "manage_role",
    "named_primary",
    "peers_of",
    "runtime_config",
    "sentinel_claims",
    "sentinel_file",
    "sentinel_view",
    "shorten_tilt",
    "split",
    "start_server",
    "stop",
    "take_role",
]

log = structlog.get_logger("kanri.cache.agent")

FENCED_PRIMARY = "127.0.0.1 1"
"""A primary that never answers: a server started as its replica refuses writes and refuses to be synced from."""
FAILOVER_RETRY = 10.0
"""Seconds between two failover requests while the pod stays fenced."""
REFUSED_RETRY = 1.0
"""Seconds before asking again after every Sentinel refused (``NOGOODSLAVE``: no replica it could promote yet)."""


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass(frozen=True)
class Node:
    """One pod's part in a cache: its own address, its peers', the Sentinels', and the password."""

    master: str
    """The Sentinels' name for the cache (the Cache's name)."""
    me: str
    peers: tuple[str, ...]
    sentinels: tuple[str, ...]
    password: Secret
    bootstrap: bool = False
    """The first pod of the cache: it leads when no pod has any data yet."""

    async def connect(self, address: str, timeout: float = 1.0) -> Connection:
        host, port = split(address)
        return await Connection.open(host, port, self.password, timeout)


def runtime_config(base: str, node: Node, *, data_dir: Path | None = None) -> str:
    """The server's file: the ConfigMap's lines, then this pod's port, password and fenced start (last wins)."""
    host, port = split(node.me)
    lines = [line for line in base.splitlines() if not (data_dir and line.startswith("dir "))]
    lines += [f"dir {data_dir}"] if data_dir else []  # Valkey changes into ``dir`` as it reads the line
    lines += [f"port {port}", f"requirepass {node.password.value}"]
    # replicas sync as a user that may only replicate, with a password this server alone accepts; this server's own
    # masterauth stays locked until its agent has checked a source (kanri.cache.agent.sources)
    replication = source_password(node.password, node.me).value
    lines += [f"user {REPLICATION_USER} on >{replication} -@all +ping +replconf +psync +sync"]
    lines += [f"masteruser {REPLICATION_USER}", f"masterauth {LOCKED}", f"replicaof {FENCED_PRIMARY}"]
    lines += [f"replica-announce-ip {host}", f"replica-announce-port {port}"]
    return "\n".join(lines) + "\n"


def sentinel_file(template: str, node: Node, primary: str, *, data_dir: Path | None = None) -> str:
    """Sentinel's first file: the ConfigMap's template with the primary, this Sentinel's address (``node.me``) and
    the passwords."""
    host, port = split(primary)
    me_host, me_port = split(node.me)
    text = template.replace("{primary}", f"{host} {port}").rstrip("\n")
    if data_dir is not None:
        text += f"\ndir {data_dir}"
    return (
        f"{text}\nport {me_port}\nsentinel announce-ip {me_host}\nrequirepass {node.password.value}\n"
        f"sentinel auth-pass {node.master} {node.password.value}\nsentinel sentinel-pass {node.password.value}\n"
    )


async def command(node: Node, address: str, *args: str | int | Secret) -> Any:
    """One command on a fresh connection to ``address`` (raises one of :data:`UNAVAILABLE`)."""
    connection = await node.connect(address)
    try:
        return await connection.command(*args)
    finally:
        await connection.close()


async def history(node: Node, address: str) -> History | None:
    """``address``'s history, or None when it does not answer (or is still loading its data)."""
    try:
        connection = await node.connect(address)
    except UNAVAILABLE:
        return None
    try:
        info = await connection.info("replication")
        # INFO, not DBSIZE: a replica without its primary refuses data commands (replica-serve-stale-data no)
        keyspace = await connection.info("keyspace")
    except UNAVAILABLE:
        return None
    finally:
        await connection.close()
    keys = sum(int(db.get("keys", 0)) for db in keyspace.values() if isinstance(db, dict))
    return History.from_info(address, info, keys)


async def named_primary(node: Node) -> str | None:
    """The primary most Sentinels that answered name (None when none answered)."""

    async def ask(address: str) -> str | None:
        try:
            answer = await command(node, address, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", node.master)
        except UNAVAILABLE:
            return None
        return f"{answer[0]}:{answer[1]}" if answer else None

    answers = [a for a in await asyncio.gather(*(ask(s) for s in node.sentinels)) if a is not None]
    return Counter(answers).most_common(1)[0][0] if answers else None


async def sentinel_claims(node: Node) -> list[tuple[str, int]]:
    """Each answering Sentinel's primary and its configuration epoch (``SENTINEL MASTER``)."""
    claims, _ = await sentinel_view(node)
    return claims


async def sentinel_view(node: Node) -> tuple[list[tuple[str, int]], bool]:
    """Each answering Sentinel's primary and configuration epoch (``SENTINEL MASTER``), and whether any of them
    reports a failover in progress (its flags)."""

    async def ask(address: str) -> tuple[tuple[str, int], bool] | None:
        try:
            answer = await command(node, address, "SENTINEL", "MASTER", node.master)
        except UNAVAILABLE:
            return None
        fields = dict(zip(answer[::2], answer[1::2], strict=True))
        flags = str(fields.get("flags", "")).split(",")
        return (f"{fields['ip']}:{fields['port']}", int(fields.get("config-epoch", 0))), "failover_in_progress" in flags

    answers = [a for a in await asyncio.gather(*(ask(s) for s in node.sentinels)) if a is not None]
    return [claim for claim, _ in answers], any(underway for _, underway in answers)


TILT_PERIOD_MS = 5000
"""How long a Sentinel stays in TILT mode after its clock jumped. A Sentinel paused for 2 s or more (a frozen VM or
node, SIGSTOP) enters TILT when it resumes and, for Sentinel's built-in 30 s, answers every is-master-down request
with "no": with one pod already gone, the two Sentinels left then never reach quorum 2, and a primary lost within
30 s of a thaw was failed over only after 29-30 s (half of the freezes and partitions in bench/cache_faults.py and
every partition in the chaos e2e, which follows its freeze). Five seconds are five rounds of its 1 s PINGs: enough
for a resumed Sentinel to see every instance afresh before it acts again."""

TILT_EVERY = 10
"""Rounds of :func:`keep_role` between two settings of :data:`TILT_PERIOD_MS` (a restarted Sentinel forgets it)."""


async def shorten_tilt(node: Node) -> None:
    """Set every answering Sentinel's TILT period to :data:`TILT_PERIOD_MS` (``SENTINEL DEBUG TILT-PERIOD``: not
    kept in sentinel.conf, so it is set again every :data:`TILT_EVERY` rounds)."""

    async def tell(address: str) -> None:
        try:
            await command(node, address, "SENTINEL", "DEBUG", "TILT-PERIOD", TILT_PERIOD_MS)
        except UNAVAILABLE as exc:
            log.debug("could not shorten a Sentinel's TILT period", sentinel=address, error=str(exc))

    await asyncio.gather(*(tell(address) for address in node.sentinels))


async def ask_failover(node: Node) -> bool:
    """Ask one Sentinel to promote the best replica now (without waiting for down-after)."""
    for address in node.sentinels:
        try:
            await command(node, address, "SENTINEL", "FAILOVER", node.master)
            log.warning("asked Sentinel for a failover", sentinel=address)
            return True
        except UNAVAILABLE as exc:
            log.debug("Sentinel refused a failover", sentinel=address, error=str(exc))
    return False


async def act(node: Node, decision: StartDecision, guard: SourceGuard) -> bool:
    """Carry out ``decision`` on this pod's server; True when the pod has its role. A primary it follows gets its
    password first, if it passes the check (:func:`guard_source`); so does one a fenced pod was pointed at."""
    match decision:
        case Follow(primary=primary):
            await guard_source(node, guard, await history(node, node.me), target=primary)
            host, port = split(primary)
            await command(node, node.me, "REPLICAOF", host, port)
            return True
        case Lead():
            await command(node, node.me, "REPLICAOF", "NO", "ONE")
            return True
        case Fence():
            # Sentinel may have pointed the server at a primary meanwhile (a pod replaced for a scale-down knows
            # only the staying pods, while the primary may still be on a leaving one): that source is checked too
            await guard_source(node, guard, await history(node, node.me))
            return False


async def decide(node: Node) -> StartDecision | None:
    """What this pod should do now (None while its own server does not answer)."""
    me = await history(node, node.me)
    if me is None:
        return None
    peers = [h for h in await asyncio.gather(*(history(node, p) for p in node.peers)) if h is not None]
    return decide_start(me, peers, await named_primary(node), bootstrap=node.bootstrap)


class RolePublisher(Protocol):
    """Called with ``primary`` or ``replica`` every round, returning at once (the agent's pod label,
    :meth:`~kanri.cache.agent.labels.PodLabel.offer`, writes in the background and only what changed); ``sole``: this
    pod is the primary a majority of the Sentinels name (:func:`~kanri.cache.agent.labels.sole_primary`)."""

    def __call__(self, value: str, /, *, sole: bool = False) -> None: ...


ReadGuardian = Callable[[History | None], None]
"""Called with the server's own history every round, returning at once: the agent's ``-ro`` guard
(:meth:`ReadGuard.offer <kanri.cache.agent.readable.ReadGuard.offer>`: a replica past the read bound leaves)."""


async def source_and_peers(node: Node, address: str | None) -> tuple[History | None, list[History]]:
    """``address``'s history (None: it does not answer, or no address) and the answering peers', asked at once.

    A pod whose node lost power answers nothing — its packets are dropped, not refused — so every question to it
    waits for the whole timeout; asked one after the other, the source (often that pod) and the peers cost a round
    two timeouts, and on real nodes a replica Sentinel had just pointed at the new primary got its password (and
    ``WAIT`` its first confirmation) seconds later than it could have."""
    asked = await asyncio.gather(*(history(node, a) for a in ([address] if address else []) + list(node.peers)))
    source = asked[0] if address else None
    return source, [h for h in asked[1 if address else 0 :] if h is not None]


@dataclass
class SourceGuard:
    """Which source this pod's server may sync from (:mod:`kanri.cache.agent.sources`): the address whose password
    it holds (None: locked, as every server starts), the replication ids it generated as a primary, and when it may
    ask for a failover again."""

    approved: str | None = None
    own: set[str] = field(default_factory=set)
    next_ask: float = 0.0
    reason: str = ""


async def guard_source(node: Node, guard: SourceGuard, me: History | None, *, target: str | None = None
                       ) -> SourceCheck | None:  # fmt: skip
    """One round for this pod's replication password: a primary remembers its replication id as its own; a replica
    holds the password of the source :func:`~kanri.cache.agent.sources.pick_source` picks (``target``: the one it
    is about to follow, else its current one) and asks Sentinel for a failover while it holds writes the named
    primary lacks."""
    if me is None:
        return None
    if me.role == "primary":
        guard.own.add(me.replid)
        if target is None:
            return None
    address = target or (None if me.primary_host == FENCED_PRIMARY.replace(" ", ":") else me.primary_host)
    source, peers = await source_and_peers(node, address)
    chosen, check = pick_source(me, source, peers, own=guard.own)
    if not check.allowed and source is not None and source.role == "primary":  # ask the Sentinels only then
        chosen, check = pick_source(me, source, peers, own=guard.own, named=await named_primary(node))
    if chosen != guard.approved:
        user, secret = await replication_login(node, chosen) if chosen else (REPLICATION_USER, Secret(LOCKED))
        await command(node, node.me, "CONFIG", "SET", "masteruser", user, "masterauth", secret)
        log.info("replication source", approved=chosen, source=address, reason=check.reason, user=user)
        guard.approved = chosen
    elif check.reason != guard.reason and not check.allowed:
        log.warning("refusing to sync", source=address, reason=check.reason)
    guard.reason = check.reason
    loop = asyncio.get_running_loop()
    if check.ask_failover and loop.time() >= guard.next_ask:
        guard.next_ask = loop.time() + (FAILOVER_RETRY if await ask_failover(node) else REFUSED_RETRY)
    return check


async def replication_login(node: Node, source: str) -> tuple[str, Secret]:
    """The user and password to sync from ``source``: its replication user's own password; a server started
    before servers had that user (a rolling replace from an older agent) only has the default user, and then the
    cache's password, which any server accepts, is the price of the upgrade until that source is replaced."""
    try:
        older = await command(node, source, "ACL", "GETUSER", REPLICATION_USER) is None
    except UNAVAILABLE:
        older = False
    return ("default", node.password) if older else (REPLICATION_USER, source_password(node.password, source))


async def take_role(node: Node, *, interval: float = 0.5, publish: RolePublisher | None = None,
                    guard: SourceGuard | None = None) -> StartDecision:  # fmt: skip
    """Decide and act until the pod follows a primary or leads; asks for a failover (at most every
    :data:`FAILOVER_RETRY` s) while the decision says so. Returns the decision carried out. Until then the server is
    fenced (a replica of nothing), and ``publish`` hears ``replica`` (a restarted container's pod may still carry
    the ``primary`` label of its last run)."""
    loop = asyncio.get_running_loop()
    guard = guard or SourceGuard()
    next_ask = 0.0
    last_reason = ""
    while True:
        decision = await decide(node)
        if decision is not None:
            if publish is not None:
                publish("replica")
            if decision.reason != last_reason:
                log.info("role decision", decision=type(decision).__name__, reason=decision.reason)
                last_reason = decision.reason
            try:
                if await act(node, decision, guard):
                    return decision
            except UNAVAILABLE as exc:
                log.info("could not take the role yet", error=str(exc))
            if isinstance(decision, Fence) and decision.failover and loop.time() >= next_ask:
                # a refusal (no replica known yet) is asked again soon; an accepted request gets time to finish
                next_ask = loop.time() + (FAILOVER_RETRY if await ask_failover(node) else REFUSED_RETRY)
        await asyncio.sleep(interval)


async def check_primary(node: Node, me: History, claims: list[tuple[str, int]], guard: SourceGuard
                        ) -> Demote | None:  # fmt: skip
    """Step down when the Sentinels' newest configuration (``claims``: :func:`sentinel_claims`) names another primary
    (:func:`decide_running`)."""
    newest = max(claims, key=lambda claim: claim[1], default=None)
    if newest is None or newest[0] == me.host:
        return None
    named = await history(node, newest[0])
    decision = decide_running(me, claims, named)
    if decision is not None:
        # The claims were read before the named pod answered (its node may have been frozen until just now): ask the
        # Sentinels again, after, and never step down while one of them is still failing over (the leader names the
        # old primary until its failover ends).
        fresh, underway = await sentinel_view(node)
        decision = decide_running(me, fresh, named, underway=underway)
    if decision is not None:
        log.warning("second primary: stepping down", reason=decision.reason, lost_bytes=decision.lost_bytes)
        await guard_source(node, guard, me, target=decision.primary)
        host, port = split(decision.primary)
        await command(node, node.me, "REPLICAOF", host, port)
    return decision


async def check_replica(node: Node, me: History, guard: SourceGuard) -> Follow | None:
    """Catch up from the peer that holds the most when the primary is gone (:func:`decide_catch_up`)."""
    fenced = me.primary_host == FENCED_PRIMARY.replace(" ", ":")
    if me.primary_host is None or fenced:
        return None
    primary, peers = await source_and_peers(node, me.primary_host)
    if primary is not None:
        return None
    decision = decide_catch_up(me, None, peers)
    if decision is not None:
        fresh = await history(node, node.me)  # Sentinel may have promoted this pod meanwhile: never undo that
        if fresh is None or fresh.role != "replica":
            return None
        log.warning("primary gone: catching up from a peer", reason=decision.reason)
        await guard_source(node, guard, fresh, target=decision.primary)
        host, port = split(decision.primary)
        await command(node, node.me, "REPLICAOF", host, port)
    return decision


async def keep_role(node: Node, *, interval: float = 0.5, publish: RolePublisher | None = None,
                    guard: SourceGuard | None = None) -> None:  # fmt: skip
    """After the start-up role: every ``interval`` s, a primary checks it is the one the Sentinels name (and steps
    down otherwise), a replica whose primary is gone catches up from the peer that holds the most, and then
    ``publish`` hears the role the server reports (:func:`~kanri.cache.agent.labels.role_label`: checked first, so
    a primary stepping down is published as a replica, never as a primary). Runs until cancelled."""
    guard = guard or SourceGuard()
    rounds = 0
    while True:
        if rounds % TILT_EVERY == 0:
            await shorten_tilt(node)
        rounds += 1
        me = await history(node, node.me)
        try:
            decision: Demote | Follow | None = None
            sole = False
            if me is not None and me.role == "primary":
                claims = await sentinel_claims(node)
                decision = await check_primary(node, me, claims, guard)
                sole = decision is None and sole_primary(me.host, claims, len(node.sentinels))
            elif me is not None:
                decision = await check_replica(node, me, guard)
            if decision is not None:
                me = await history(node, node.me)
            label = role_label(me, stepping_down=isinstance(decision, Demote))
            if label is not None and publish is not None:
                publish(label, sole=sole and label == "primary")
            await guard_source(node, guard, me)
        except UNAVAILABLE as exc:
            log.info("could not check the role", error=str(exc))
        except Exception:  # one bad round is never a reason to stop fencing
            log.exception("could not check the role")
        await asyncio.sleep(interval)


async def manage_role(node: Node, *, interval: float = 0.5, publish: RolePublisher | None = None,
                      guard: ReadGuardian | None = None) -> None:  # fmt: skip
    """The agent's whole job for its server: take the start-up role, then keep it (:func:`keep_role`); ``publish``
    (the pod's role label, :class:`~kanri.cache.agent.labels.PodLabel`) hears the role and ``guard`` (its ``-ro``
    membership, :class:`~kanri.cache.agent.readable.ReadGuard`) the server's history every ``interval`` s."""
    async with asyncio.TaskGroup() as group:
        if guard is not None:
            group.create_task(guard_reads(node, guard, interval=interval))
        sources = SourceGuard()
        await take_role(node, interval=interval, publish=publish, guard=sources)
        await keep_role(node, interval=interval, publish=publish, guard=sources)


async def guard_reads(node: Node, guard: ReadGuardian, *, interval: float = 0.5) -> None:
    """Every ``interval`` s, ``guard`` hears the server's own history: a loop of its own, since a role round may wait
    seconds for a peer that does not answer (a frozen primary), and the pod must leave ``-ro`` within a round of its
    bound. One local INFO, no API request (the guard writes only when its pod must leave). Runs until cancelled."""
    while True:
        try:
            guard(await history(node, node.me))
        except Exception:  # never a reason to stop fencing (this runs in manage_role's task group)
            log.exception("could not guard the pod's reads")
        await asyncio.sleep(interval)


async def start_server(binary: Path, config: Path) -> asyncio.subprocess.Process:
    """Start ``valkey-server config`` (the password is in the file, never in the arguments)."""
    return await asyncio.create_subprocess_exec(str(binary), str(config))


async def stop(process: asyncio.subprocess.Process, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def peers_of(addresses: Sequence[str], me: str) -> tuple[str, ...]:
    return tuple(a for a in addresses if a != me)
