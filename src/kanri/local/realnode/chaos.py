"""The chaos verbs on a real node found by name, for ``kanri local node VERB NODE``: a cluster's real nodes live in
``<cluster dir>/real-nodes/<node name>/`` (each with its ``node.json``, written at its start), and every verb acts
on the node's cgroup, namespace and table by name, so any process may run it. Every verb is idempotent: it says
whether it changed anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kanri.local.realnode.addons import NetworkPolicyAgent
from kanri.local.realnode.node import RealNode

REAL_NODES = "real-nodes"
VERBS = ("stop", "start", "freeze", "thaw", "partition", "heal")


def real_nodes_dir(cluster_dir: Path) -> Path:
    """Where the real nodes of the cluster whose data dir is ``cluster_dir`` keep their directories."""
    return cluster_dir / REAL_NODES


def find(cluster_dir: Path, name: str) -> RealNode | None:
    """The cluster's real node ``name``, if it was ever started there."""
    node_dir = real_nodes_dir(cluster_dir) / name
    return RealNode.load(node_dir) if (node_dir / "node.json").is_file() else None


def state(node: RealNode) -> str:
    """``Stopped``, or ``Running`` with what is done to it: ``Running, Frozen, Partitioned``."""
    if not node.pids():
        return "Stopped"
    faults = [label for label, on in (("Frozen", node.is_frozen()), ("Partitioned", node.is_partitioned())) if on]
    return ", ".join(["Running", *faults])


def apply(node: RealNode, verb: str) -> bool:
    """Do ``verb`` (one of :data:`VERBS`) to the node; False when there was nothing to do."""
    running = bool(node.pids())
    needed: dict[str, tuple[bool, Callable[[], object]]] = {
        "stop": (running, node.stop),
        "start": (not running, node.start),
        "freeze": (running and not node.is_frozen(), node.freeze),
        "thaw": (node.is_frozen(), node.thaw),
        "partition": (running and not node.is_partitioned(), node.partition),
        "heal": (node.is_partitioned(), node.heal),
    }
    if verb not in needed:
        raise ValueError(f"unknown verb {verb!r}; one of {', '.join(VERBS)}")
    wanted, action = needed[verb]
    if wanted:
        action()
        if verb == "start" and node.cluster_dns is not None and addons_built(node.bin_dir):
            NetworkPolicyAgent(node).start()  # `up --real-nodes` gave it one; it died with the node's stop
    return wanted


def addons_built(bin_dir: Path) -> bool:
    """Whether ``make node-components`` built the add-ons ``kanri local up --real-nodes`` runs (CoreDNS, the
    NetworkPolicy agent)."""
    return all((bin_dir / name).is_file() for name in ("coredns", "kube-network-policies"))
