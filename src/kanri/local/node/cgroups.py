"""Containers' cgroups (cgroup v1, as these machines mount it): limits, the whole container's end, OOM kills.

Layout, in every hierarchy of :data:`CONTROLLERS`: ``<mount>/<the node process's own cgroup>/kanri/<node
name>/pod<uid>/<container>`` — nested under the node's own cgroup, so whatever accounts for the node accounts
for its pods. A container's cgroup is made fresh for each run (its OOM count starts at 0), the limits written
before its init joins, and removed when it has stopped; a pod's when its last container has; the node's when the
node stops. Every node-level directory is listed in ``<data_dir>/cgroups`` so ``kanri local down`` can prove none is
left, whichever cgroup it runs in.

Ending a container (:meth:`ContainerCgroup.kill`) is the kubelet's: freeze it (nothing forks any more), SIGKILL
every process in it, thaw (the kills land). Its PID namespace would end it too once its init dies; the cgroup
also catches what escaped the signal's process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import structlog

from kanri.local.node.resources import parse_resources

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.cgroups")

CONTROLLERS = ("freezer", "memory", "cpu", "cpuacct", "pids")
CGROUP_REGISTRY = "cgroups"
"""File in the node's data dir: the node-level cgroup directories, one a line."""
CFS_PERIOD_US = 100_000
_MIN_QUOTA_US = 1000
_MIN_SHARES = 2


@dataclass(frozen=True)
class Limits:
    """What a container's cgroup enforces (None: unlimited)."""

    memory_bytes: int | None = None
    cpu_quota_us: int | None = None
    cpu_period_us: int = CFS_PERIOD_US
    cpu_shares: int = _MIN_SHARES


def _millis(value: Decimal) -> int:
    return int((value * 1000).to_integral_value(ROUND_CEILING))


def container_limits(container: Obj) -> Limits:
    """The kubelet's mapping: ``limits.memory`` → the memory limit; ``limits.cpu`` → CFS quota per 100 ms period
    (at least 1 ms); ``requests.cpu`` → ``cpu.shares`` (milli-CPU * 1024 / 1000, at least 2)."""
    resources = container.get("resources") or {}
    limits = parse_resources(resources.get("limits"))
    requests = parse_resources(resources.get("requests"))
    memory = limits.get("memory")
    cpu = limits.get("cpu")
    request = requests.get("cpu", cpu)
    quota = None
    if cpu is not None and cpu > 0:
        quota = max(_millis(cpu) * CFS_PERIOD_US // 1000, _MIN_QUOTA_US)
    shares = max(_millis(request) * 1024 // 1000, _MIN_SHARES) if request is not None else _MIN_SHARES
    return Limits(
        memory_bytes=None if memory is None or memory <= 0 else int(memory.to_integral_value(ROUND_CEILING)),
        cpu_quota_us=quota,
        cpu_shares=shares,
    )


def discover(proc_self: Path = Path("/proc/self")) -> dict[str, Path]:
    """Each v1 controller of :data:`CONTROLLERS` that is mounted: the directory of this process's cgroup in it."""
    own: dict[str, str] = {}
    for line in (proc_self / "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(","):
            own[name] = path
    found: dict[str, Path] = {}
    for line in (proc_self / "mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] != "cgroup":
            continue
        options = set(fields[separator + 3].split(","))
        mount_root, mount_point = fields[3], fields[4]
        for name in CONTROLLERS:
            if name in options and name in own and name not in found:
                relative = os.path.relpath(own[name], mount_root)
                found[name] = Path(mount_point) / ("" if relative == "." else relative)
    return found


def _write(path: Path, value: str) -> None:
    with path.open("w") as f:
        f.write(value)


def _pids(directory: Path) -> list[int]:
    try:
        return [int(line) for line in (directory / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _kill_tree(dirs: dict[str, Path]) -> None:
    """SIGKILL every process in ``dirs`` (one directory per controller) and below, frozen while it happens."""
    freezer = dirs.get("freezer")
    frozen = False
    if freezer is not None and freezer.is_dir():
        with contextlib.suppress(OSError):
            _write(freezer / "freezer.state", "FROZEN")
            frozen = True
            for _ in range(200):  # FREEZING → FROZEN takes microseconds unless a task is stuck in the kernel
                if (freezer / "freezer.state").read_text().strip() == "FROZEN":
                    break
                time.sleep(0.001)
    try:
        # Every process joins all hierarchies at once: one of them lists them all.
        directory = freezer if freezer is not None else next(iter(dirs.values()), None)
        for sub, _, _ in os.walk(directory) if directory is not None else ():
            for pid in _pids(Path(sub)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        if frozen:
            assert freezer is not None
            with contextlib.suppress(OSError):
                _write(freezer / "freezer.state", "THAWED")


def _remove_tree(directory: Path, timeout: float = 2.0) -> bool:
    """rmdir ``directory`` and its children, deepest first (a cgroup with tasks is busy: retried while they die)."""
    deadline = time.monotonic() + timeout
    for sub, _, _ in sorted(os.walk(directory), key=lambda entry: entry[0].count("/"), reverse=True):
        while True:
            try:
                os.rmdir(sub)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
    return True


@dataclass
class ContainerCgroup:
    """One run of a container: its directory in each hierarchy."""

    dirs: dict[str, Path] = field(default_factory=dict)

    def paths(self) -> list[str]:
        return [str(d) for d in self.dirs.values()]

    def pids(self) -> list[int]:
        directory = self.dirs.get("freezer") or next(iter(self.dirs.values()), None)
        return [] if directory is None else _pids(directory)

    def kill(self) -> None:
        _kill_tree(self.dirs)

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in it (``oom_kill`` of ``memory.oom_control``)."""
        memory = self.dirs.get("memory")
        if memory is None:
            return 0
        with contextlib.suppress(OSError):
            for line in (memory / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def cpu_usage_ns(self) -> int:
        cpuacct = self.dirs.get("cpuacct")
        return 0 if cpuacct is None else int((cpuacct / "cpuacct.usage").read_text())

    def remove(self) -> bool:
        """Kill what is left and remove the directories; False when one could not be removed."""
        self.kill()
        return all([_remove_tree(d) for d in self.dirs.values()])


def _pod_shares(pod: Path) -> None:
    """The pod's ``cpu.shares``: the sum of its containers' (as the kubelet's pod cgroup has). The pods of a node are
    siblings, so only the pod level weighs one pod against another: left at the default 1024, a BestEffort pod would
    weigh as much as one that requests a whole CPU."""
    total = sum(int((c / "cpu.shares").read_text()) for c in pod.iterdir() if (c / "cpu.shares").is_file())
    _write(pod / "cpu.shares", str(max(total, _MIN_SHARES)))


class Cgroups:
    """The node's cgroup tree. Unavailable (no v1 controllers mounted, or not writable): every method is a no-op
    and containers run without limits (logged once)."""

    def __init__(self, data_dir: Path, node_name: str, bases: dict[str, Path] | None = None) -> None:
        self.registry = data_dir / CGROUP_REGISTRY
        self.node_name = node_name
        try:
            found = discover() if bases is None else bases
        except OSError:
            found = {}
        self.nodes = {name: base / "kanri" / node_name for name, base in found.items()}
        self._started = False

    @property
    def available(self) -> bool:
        return bool(self.nodes)

    def start(self) -> None:
        """Make the node's directories (killing and removing what a crashed run left in them)."""
        if self._started or not self.nodes:
            return
        self._started = True
        try:
            if any(d.exists() for d in self.nodes.values()):
                _kill_tree(self.nodes)
                for directory in self.nodes.values():
                    for child in [c for c in directory.iterdir() if c.is_dir()] if directory.exists() else []:
                        _remove_tree(child)
            self.registry.parent.mkdir(parents=True, exist_ok=True)
            with self.registry.open("a") as f:
                f.writelines(f"{d}\n" for d in self.nodes.values())
            for directory in self.nodes.values():
                directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cgroups unavailable: container limits are not enforced", error=str(exc))
            self.nodes = {}

    def container(self, pod_uid: str, name: str, limits: Limits) -> ContainerCgroup | None:
        """A fresh cgroup for one run of a container, limits written; None when cgroups are unavailable."""
        self.start()
        if not self.nodes:
            return None
        group = ContainerCgroup({c: d / f"pod{pod_uid}" / name for c, d in self.nodes.items()})
        group.remove()  # a previous run's, if its removal failed
        for directory in group.dirs.values():
            directory.mkdir(parents=True)
        if "memory" in group.dirs and limits.memory_bytes is not None:
            _write(group.dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
        if "cpu" in group.dirs:
            _write(group.dirs["cpu"] / "cpu.shares", str(limits.cpu_shares))
            _pod_shares(group.dirs["cpu"].parent)
            if limits.cpu_quota_us is not None:
                _write(group.dirs["cpu"] / "cpu.cfs_period_us", str(limits.cpu_period_us))
                _write(group.dirs["cpu"] / "cpu.cfs_quota_us", str(limits.cpu_quota_us))
        return group

    def remove_pod(self, pod_uid: str) -> None:
        dirs = {c: d / f"pod{pod_uid}" for c, d in self.nodes.items()}
        _kill_tree(dirs)
        for directory in dirs.values():
            _remove_tree(directory)

    def kill_all(self) -> None:
        if self.nodes:
            _kill_tree(self.nodes)

    def freeze(self) -> bool:
        """Freeze every process of every pod of the node at once (the freezer is hierarchical); False without a
        freezer. Returns once the kernel reports the whole tree FROZEN (or after a second, logged)."""
        freezer = self.nodes.get("freezer")
        if freezer is None:
            return False
        _write(freezer / "freezer.state", "FROZEN")
        deadline = time.monotonic() + 1.0
        while (freezer / "freezer.state").read_text().strip() != "FROZEN":
            if time.monotonic() > deadline:
                log.warning("node cgroup still FREEZING after 1 s", cgroup=str(freezer))
                break
            time.sleep(0.001)
        return True

    def thaw(self) -> None:
        freezer = self.nodes.get("freezer")
        if freezer is not None and freezer.is_dir():
            _write(freezer / "freezer.state", "THAWED")

    def close(self) -> list[str]:
        """Kill everything, remove the node's directories (and the ``kanri`` parent when no other node uses it);
        what could not be removed."""
        if not self.nodes:
            return []
        self.kill_all()
        left = [str(d) for d in self.nodes.values() if not _remove_tree(d)]
        for directory in self.nodes.values():
            with contextlib.suppress(OSError):
                directory.parent.rmdir()
        if not left:
            self.registry.unlink(missing_ok=True)
        self._started = False
        return left


def frozen_cgroups(data_dir: Path) -> list[Path]:
    """The freezer directories a node with this data dir made that are still frozen (a crashed host's)."""
    try:
        recorded = sorted(set((data_dir / CGROUP_REGISTRY).read_text().split()))
    except FileNotFoundError:
        return []
    frozen = []
    for raw in recorded:
        state = Path(raw) / "freezer.state"
        with contextlib.suppress(OSError):
            if state.read_text().strip() != "THAWED":
                frozen.append(Path(raw))
    return frozen


def thaw_recorded(data_dir: Path) -> None:
    """Thaw what :func:`frozen_cgroups` finds (``kanri local down`` after a crash: the kills must land)."""
    for directory in frozen_cgroups(data_dir):
        with contextlib.suppress(OSError):
            _write(directory / "freezer.state", "THAWED")


def leftover_cgroups(data_dir: Path) -> list[str]:
    """Cgroup directories a node with this data dir made that still exist (with any pod's below them)."""
    try:
        recorded = sorted(set((data_dir / CGROUP_REGISTRY).read_text().split()))
    except FileNotFoundError:
        return []
    found = []
    for raw in recorded:
        for sub, _, _ in os.walk(raw):
            found.append(sub)
    return found
