"""What the local-cluster benchmarks (``local_node.py``, ``postgres_operator.py``) share: the real control plane and
local node started on a scratch dir with the benchmark's own network names, stopped at the end with
``find_leftovers`` checked, and the ``/proc`` readings they take of the processes involved.

Imported as ``_localcluster``: a benchmark runs as ``python bench/<name>.py``, which puts ``bench/`` first on
``sys.path`` (and mypy, given ``bench`` as files, finds it there too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from kanri.local import ControlPlane
from kanri.local.imagemap import write_default_image_map
from kanri.local.leftovers import find_leftovers
from kanri.local.node import NodeOptions
from kanri.local.node.network import NodeLock
from kanri.local.nodeprocess import NodeProcess

Network = dict[str, Any]
"""NodeOptions fields (bridge, service_link, netns_prefix, pod_cidr, internal_ip, cluster_dns_ip) that a benchmark's
node runs with instead of the defaults. A node starting with the default names deletes the bridge ``kanri0`` and every
network namespace named ``kanri-*`` it finds (as leftovers of an earlier run), and binds ``10.96.0.10:53``; so each
benchmark has names of its own, apart from a developer's ``kanri local up`` and from the other benchmarks."""

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# ``python -m kanri.local.node`` with the network (a JSON argument) as defaults of its NodeOptions.
NODE_MAIN = """
import functools, json, sys
import kanri.local.node.__main__ as node_main
node_main.NodeOptions = functools.partial(node_main.NodeOptions, **json.loads(sys.argv.pop(1)))
node_main.main()
"""


# --- /proc readings ------------------------------------------------------------------------------------------------


def proc_kib(pid: int, file: str, key: str) -> int:
    """A ``Key:  N kB`` value of ``/proc/<pid>/<file>`` (0 when the process is gone or has no such line)."""
    try:
        lines = Path(f"/proc/{pid}/{file}").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def rss_kib(pid: int) -> int:
    """``VmRSS`` of the process; 0 when it is gone (or is a zombie: a live process always has some)."""
    return proc_kib(pid, "status", "VmRSS")


@dataclass(frozen=True)
class Cpu:
    """CPU seconds of a process itself and of its reaped children."""

    own: float
    children: float

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.own - other.own, self.children - other.children)


def cpu(pid: int) -> Cpu:
    """The process's CPU so far; OSError when it is gone."""
    # Split after the last ")": the command name in between the parentheses may contain spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command: state(0) ... utime(11) stime(12) cutime(13) cstime(14).
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return Cpu((utime + stime) / CLOCK_TICKS, (cutime + cstime) / CLOCK_TICKS)


# --- the machine ---------------------------------------------------------------------------------------------------


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True, check=False).returncode == 0


def node_lock_holder(path: Path = NodeLock.PATH) -> int | None:
    """The pid holding the machine's local-node lock (a networked local node runs), or None.

    Read from ``/proc/locks`` rather than by trying the ``flock``: taking the lock, even for an instant, could make a
    node starting at that moment (``kanri local up``'s, a test session's) refuse to run."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    # /proc/locks names the file as "MAJOR:MINOR:INODE", the device numbers in hex:
    # "1: FLOCK  ADVISORY  WRITE <pid> fe:00:9977858 0 EOF".
    file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and file_id in fields:
            return int(fields[fields.index(file_id) - 1])
    return None


def wait_for_quiet_machine(timeout: float) -> None:
    """Wait until no other networked local node runs: it would share the two cores, and its ``default/kubernetes``
    listener (10.96.0.1:443, the first address of every local cluster's service range) and ours would compete. (The
    benchmark's node would be refused anyway while another holds the machine's :class:`NodeLock`.)"""
    deadline = time.monotonic() + timeout
    said = False
    while (holder := node_lock_holder()) is not None:
        busy = f"local node (pid {holder}) holds {NodeLock.PATH}"
        if time.monotonic() > deadline:
            sys.exit(f"{busy} for {timeout:.0f}s; giving up")
        if not said:
            print(f"waiting: {busy}", file=sys.stderr, flush=True)
            said = True
        time.sleep(2)


def check_machine(network: Network, wait: float) -> None:
    """Refuse to start over an earlier run's links, then wait (up to ``wait`` seconds) for a quiet machine."""
    for link in (network["bridge"], network["service_link"]):
        if link_exists(link):
            sys.exit(f"network link {link} exists: an earlier run of this benchmark left it; remove it first")
    wait_for_quiet_machine(wait)


# --- the cluster ---------------------------------------------------------------------------------------------------


class BenchNodeProcess(NodeProcess):
    """:class:`NodeProcess` — same arguments, image map, detached launch and stop — with the benchmark's network."""

    def __init__(self, cluster_dir: Path, network: Network) -> None:
        super().__init__(cluster_dir)
        self.network = network

    def launch(self, args: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
        argv = list(args)
        at = argv.index("-m")
        argv[at : at + 2] = ["-c", NODE_MAIN, json.dumps(self.network)]
        return super().launch(argv, timeout, env)

    def options(self) -> NodeOptions:
        """What the node runs with (as far as ``find_leftovers`` and the benchmarks' readings care)."""
        return dataclasses.replace(NodeOptions(data_dir=self.node_dir), **self.network)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit, so the ``finally`` that stops the node and control plane runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class LocalCluster:
    """The control plane and the benchmark's node, once both are ready."""

    control_plane: ControlPlane
    node: BenchNodeProcess
    kubeconfig: Path
    control_plane_pid: int
    startup: dict[str, float]
    """Seconds from start to ready: ``control_plane`` (a new data dir) and ``node``."""
    leftovers: list[str] = field(default_factory=list)
    """What ``find_leftovers`` found once both were stopped."""

    def require_clean(self) -> None:
        """After the cluster stopped: exit 1 if it left anything behind (already printed), else say so."""
        if self.leftovers:
            sys.exit(1)
        print("stopped; find_leftovers: nothing left", file=sys.stderr)


@contextlib.contextmanager
def local_cluster(
    cluster_dir: Path, binary: Path, network: Network, wait: float, nodes: int = 3
) -> Iterator[LocalCluster]:
    """Start the control plane on ``cluster_dir``, wait for a quiet machine again, start the node; both timed.

    At exit — even on error — the node is stopped, then the control plane, and ``find_leftovers`` must find nothing
    of the node (what it finds is printed and kept in ``leftovers``; :meth:`LocalCluster.require_clean` acts on it).
    """
    cp = ControlPlane(cluster_dir, binary)
    node = BenchNodeProcess(cluster_dir, network)
    node_started = False
    cluster: LocalCluster | None = None
    try:
        started = time.monotonic()
        endpoint = cp.start(exit_with_parent=True)
        startup = {"control_plane": time.monotonic() - started}
        image_map = write_default_image_map(cluster_dir / "images.generated.yaml")
        # Again: the control plane's start may have taken long enough for another node to come up.
        wait_for_quiet_machine(wait)
        started = time.monotonic()
        node_started = True
        node.start(endpoint.kubeconfig, cp.apiserver_port(), image_map, nodes=nodes)
        startup["node"] = time.monotonic() - started
        cluster = LocalCluster(cp, node, endpoint.kubeconfig, endpoint.pid, startup)
        yield cluster
    finally:
        try:
            node.stop()
        finally:
            cp.stop()
            # Only a started node can have left anything (and find_leftovers needs its options to look).
            leftovers = find_leftovers(node.options()) if node_started else []
            if cluster is not None:
                cluster.leftovers = leftovers
            if leftovers:
                print("left behind: " + ", ".join(leftovers), file=sys.stderr)
