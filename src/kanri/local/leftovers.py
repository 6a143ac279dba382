"""What a stopped node host must not leave behind, checked by ``kanri local down`` (and the tests).

A network namespace with the host's prefix, the bridge or the service link, a mount in the host's namespace under
the host's data dir or ``/run/netns``, a mountpoint a node created for a container, a container's cgroup (each node
records the cgroup directories it makes), a frozen cgroup, one of the partition tables (nftables), or a process of
a container (found by the session ids the nodes recorded: each container's launcher leads a session of its own, and
whatever it started inherits that session). Each node keeps its registries in its own directory under the host's.

:func:`undo_chaos` is what ``kanri local down`` runs first, for a host that crashed: thaw what is frozen, drop the
partition tables — so that the kills land and the leftover check sees the truth.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from kanri.local.node import kubeproxy
from kanri.local.node.cgroups import frozen_cgroups, leftover_cgroups, thaw_recorded
from kanri.local.node.chaos import leftover_tables, remove_tables
from kanri.local.node.network import leftover_namespaces
from kanri.local.node.options import NodeOptions
from kanri.local.node.sessions import container_processes


def _registry_dirs(data_dir: Path) -> list[Path]:
    """The host's data dir and each node's directory in it (a one-node layout keeps its registries at the top)."""
    try:
        children = sorted(p for p in data_dir.iterdir() if p.is_dir())
    except FileNotFoundError:
        children = []
    return [data_dir, *children]


def undo_chaos(options: NodeOptions, machine_wide: bool = True) -> None:
    """Thaw every frozen cgroup of the host's nodes and remove the partition tables — those only when
    ``machine_wide``: while another cluster's node runs the machine's pod network, they are its own."""
    for directory in _registry_dirs(options.data_dir):
        thaw_recorded(directory)
    if machine_wide:
        remove_tables(options.chaos_table)


def find_leftovers(options: NodeOptions, machine_wide: bool = True) -> list[str]:
    """Everything of the node host still there, described for a person; empty when it cleaned up completely.

    Without ``machine_wide`` only what lies under the host's own data dir counts (its mounts, cgroups, container
    processes): the pod network's namespaces, links, partition tables and kube-proxy tables are named the same for
    every local node, and while another cluster's node runs (it holds :class:`NodeLock`) they are that node's."""
    netns = options.netns_prefix if machine_wide else None
    found = [f"mount {point}" for point in _mounts_under(options.data_dir, netns)]
    if machine_wide:
        found[:0] = [f"network namespace {name}" for name in leftover_namespaces(options)]
        found += [f"network link {link}" for link in (options.bridge, options.service_link) if _link_exists(link)]
        found += [f"nftables table {table}" for table in leftover_tables(options.chaos_table)]
    for directory in _registry_dirs(options.data_dir):
        registry = directory / "mountpoints"
        if registry.exists():
            found += [f"mountpoint {p}" for p in registry.read_text().split() if Path(p).exists()]
        found += [f"frozen cgroup {path}" for path in frozen_cgroups(directory)]
        found += [f"cgroup {path}" for path in leftover_cgroups(directory)]
        found += [f"process {pid}" for pid in container_processes(directory)]
    if machine_wide:
        found += kubeproxy.leftovers(options)
    return found


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True, check=False).returncode == 0


def _mounts_under(data_dir: Path, netns_prefix: str | None) -> list[str]:
    """Mount points under ``data_dir``, and, when ``netns_prefix`` is given, the namespaces' under ``/run/netns``
    named exactly as a home-made node names them (``<prefix><8 hex digits>``: a real node's ``kanri-rn-…`` is not)."""
    points = []
    root = str(data_dir.resolve())
    netns = re.compile("/run/netns/" + re.escape(netns_prefix) + "[0-9a-f]{8}") if netns_prefix is not None else None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(root + "/") or (netns is not None and netns.fullmatch(point)):
            points.append(point)
    return points
