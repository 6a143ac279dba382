"""Network partitions of local nodes: nftables tables of ours that cut a node's pods off from everything else.

A partitioned node's pods live in its slice ``S`` of the pod CIDR (``10.244.<i>.0/24``); its own address ``N``
(``10.244.<i>.1``, on the bridge) is the node's. The rules, rebuilt whole (one ``nft -f`` transaction) whenever the
set of partitioned nodes changes::

    table bridge kanri-chaos  forward: ip saddr S ip daddr != S drop;  ip daddr S ip saddr != S drop
    table inet kanri-chaos    forward: the same (traffic routed or DNATed, e.g. through a Service address)
                              input:   ip saddr S ip daddr != N drop   (the API server, DNS, the service proxy)
                              output:  ip daddr S ip saddr != N drop   (the host: only the node's own probes pass)

Pods on the bridge talk at layer 2, hence the ``bridge`` table (it sees bridged frames without ``br_netfilter``);
the ``inet`` one sees what is routed through the host. Pods of the same node still reach each other, and the node's
kubelet still probes them (its probes connect from ``N``); nothing else gets in or out, established connections
included, as on a real partition. What nftables cannot cut is the node process itself, which runs in the host's
network: its API traffic is paused in code (:class:`~kanri.local.node.state.NodeState`).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

log = structlog.get_logger("kanri.local.chaos")

FAMILIES = ("inet", "bridge")
_PRIORITY = -10  # before anything of kube-proxy's (filter priority 0) gets to accept the packet


class ChaosError(Exception):
    """``nft`` is missing or refused the rules; the message carries its stderr."""


@dataclass(frozen=True)
class Partition:
    """One partitioned node: its pods' slice and its own address."""

    pod_slice: str
    node_ip: str


def _forward_rules(partitions: Iterable[Partition]) -> list[str]:
    rules = []
    for p in partitions:
        rules += [f"ip saddr {p.pod_slice} ip daddr != {p.pod_slice} drop",
                  f"ip daddr {p.pod_slice} ip saddr != {p.pod_slice} drop"]  # fmt: skip
    return rules


def _chain(name: str, hook: str, rules: list[str]) -> str:
    body = "".join(f"\t\t{rule}\n" for rule in rules)
    return f"\tchain {name} {{\n\t\ttype filter hook {hook} priority {_PRIORITY}; policy accept;\n{body}\t}}\n"


def ruleset(table: str, partitions: list[Partition]) -> str:
    """The ``nft -f`` script that replaces both tables with the rules for ``partitions`` (none: removes them)."""
    # "table X; delete table X" removes a table whether or not it exists; the whole script is one transaction.
    script = "".join(f"table {family} {table}\ndelete table {family} {table}\n" for family in FAMILIES)
    if not partitions:
        return script
    forward = _forward_rules(partitions)
    inputs = [f"ip saddr {p.pod_slice} ip daddr != {p.node_ip} drop" for p in partitions]
    outputs = [f"ip daddr {p.pod_slice} ip saddr != {p.node_ip} drop" for p in partitions]
    script += (
        f"table inet {table} {{\n"
        + _chain("forward", "forward", forward)
        + _chain("input", "input", inputs)
        + _chain("output", "output", outputs)
        + "}\n"
    )
    script += f"table bridge {table} {{\n" + _chain("forward", "forward", forward) + "}\n"
    return script


def _nft() -> str:
    # /usr/sbin may be missing from a user's PATH; nft lives there on Debian.
    found = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
    if found is None:
        raise ChaosError("nft is not installed (apt-get install nftables; `make setup` does it)")
    return found


async def apply(table: str, partitions: list[Partition]) -> None:
    """Make the tables say exactly ``partitions`` (idempotent)."""
    process = await asyncio.create_subprocess_exec(
        _nft(), "-f", "-", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await process.communicate(ruleset(table, partitions).encode())
    if process.returncode != 0:
        raise ChaosError(f"nft refused the partition rules: {err.decode().strip()}")
    log.info("partitions applied", table=table, slices=[p.pod_slice for p in partitions])


def remove_tables(table: str) -> None:
    """Remove both tables (what ``kanri local down`` does after a crashed host); silent when nft is missing."""
    try:
        nft = _nft()
    except ChaosError:
        return
    subprocess.run([nft, "-f", "-"], input=ruleset(table, []).encode(), capture_output=True, check=False)


def leftover_tables(table: str) -> list[str]:
    """``<family> <table>`` for each of our tables that exists."""
    try:
        nft = _nft()
    except ChaosError:
        return []
    found = []
    for family in FAMILIES:
        listed = subprocess.run([nft, "list", "table", family, table], capture_output=True, check=False)
        if listed.returncode == 0:
            found.append(f"{family} {table}")
    return found
