"""What a stopped local node must not leave behind, checked by ``kanri local down`` (and the tests).

A network namespace with the node's prefix, the bridge or the service link, a mount in the host's namespace under
the node's data dir or ``/run/netns``, a mountpoint the node created for a container, a container's cgroup (the node
records the cgroup directories it makes), or a process of a container (found by the session ids the node recorded:
each container's launcher leads a session of its own, and whatever it started inherits that session).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kanri.local.node import kubeproxy
from kanri.local.node.cgroups import leftover_cgroups
from kanri.local.node.network import leftover_namespaces
from kanri.local.node.options import NodeOptions
from kanri.local.node.sessions import container_processes


def find_leftovers(options: NodeOptions) -> list[str]:
    """Everything of the node still there, described for a person; empty when it cleaned up completely."""
    found = [f"network namespace {name}" for name in leftover_namespaces(options)]
    for link in (options.bridge, options.service_link):
        if _link_exists(link):
            found.append(f"network link {link}")
    found += [f"mount {point}" for point in _mounts_under(options.data_dir, options.netns_prefix)]
    registry = options.data_dir / "mountpoints"
    if registry.exists():
        found += [f"mountpoint {p}" for p in registry.read_text().split() if Path(p).exists()]
    found += [f"cgroup {path}" for path in leftover_cgroups(options.data_dir)]
    found += [f"process {pid}" for pid in container_processes(options.data_dir)]
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
