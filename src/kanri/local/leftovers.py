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


def undo_chaos(options: NodeOptions) -> None:
    """Thaw every frozen cgroup of the host's nodes and remove the partition tables."""
    for directory in _registry_dirs(options.data_dir):
        thaw_recorded(directory)
    remove_tables(options.chaos_table)


def find_leftovers(options: NodeOptions) -> list[str]:
    """Everything of the node host still there, described for a person; empty when it cleaned up completely."""
    found = [f"network namespace {name}" for name in leftover_namespaces(options)]
    for link in (options.bridge, options.service_link):
        if _link_exists(link):
            found.append(f"network link {link}")
    found += [f"mount {point}" for point in _mounts_under(options.data_dir, options.netns_prefix)]
    found += [f"nftables table {table}" for table in leftover_tables(options.chaos_table)]
    for directory in _registry_dirs(options.data_dir):
        registry = directory / "mountpoints"
        if registry.exists():
            found += [f"mountpoint {p}" for p in registry.read_text().split() if Path(p).exists()]
        found += [f"frozen cgroup {path}" for path in frozen_cgroups(directory)]
        found += [f"cgroup {path}" for path in leftover_cgroups(directory)]
        found += [f"process {pid}" for pid in container_processes(directory)]
    found += kubeproxy.leftovers(options)
    return found


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True, check=False).returncode == 0


def _mounts_under(data_dir: Path, netns_prefix: str) -> list[str]:
    points = []
    root = str(data_dir.resolve())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(root + "/") or point.startswith(f"/run/netns/{netns_prefix}"):
            points.append(point)
    return points
