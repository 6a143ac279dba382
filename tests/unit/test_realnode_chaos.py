"""``kanri local node VERB`` on a real node (kanri.local.realnode.chaos): which verb acts in which state (every verb
is idempotent and says so) and the state line it prints. The node here is a :class:`RealNode` whose machine-facing
parts (its cgroup's members, freezer, partition table) are a state in memory; the real ones are exercised by
tests/integration/test_real_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kanri.local.realnode import RealNode, chaos
from kanri.local.realnode.spec import NodeSpec


class NodeState(RealNode):
    """A real node whose power, freezer and partition are three booleans."""

    def __init__(self, tmp: Path, *, running: bool = True, frozen: bool = False, partitioned: bool = False) -> None:
        super().__init__(NodeSpec("real-0", "kanri-a", 0), tmp / "real-0", tmp)
        self.running, self.frozen, self.partitioned = running, frozen, partitioned
        self.actions: list[str] = []

    def pids(self) -> set[int]:
        return {4242} if self.running else set()

    def is_frozen(self) -> bool:
        return self.frozen

    def is_partitioned(self) -> bool:
        return self.partitioned

    def start(self, timeout: float = 120.0) -> float:
        self.actions.append("start")
        self.running = True
        return 0.0

    def stop(self) -> None:
        self.actions.append("stop")
        self.running = self.frozen = self.partitioned = False

    def freeze(self) -> None:
        self.actions.append("freeze")
        self.frozen = True

    def thaw(self) -> None:
        self.actions.append("thaw")
        self.frozen = False

    def partition(self) -> None:
        self.actions.append("partition")
        self.partitioned = True

    def heal(self) -> None:
        self.actions.append("heal")
        self.partitioned = False


@pytest.mark.parametrize(
    ("running", "frozen", "partitioned", "expected"),
    [
        (False, False, False, "Stopped"),
        (True, False, False, "Running"),
        (True, True, False, "Running, Frozen"),
        (True, False, True, "Running, Partitioned"),
        (True, True, True, "Running, Frozen, Partitioned"),
    ],
)
def test_state(tmp_path: Path, running: bool, frozen: bool, partitioned: bool, expected: str) -> None:
    assert chaos.state(NodeState(tmp_path, running=running, frozen=frozen, partitioned=partitioned)) == expected


@pytest.mark.parametrize(
    ("verb", "state", "acts"),
    [
        ("stop", {"running": True}, True),
        ("stop", {"running": False}, False),
        ("start", {"running": False}, True),
        ("start", {"running": True}, False),
        ("freeze", {"running": True}, True),
        ("freeze", {"running": True, "frozen": True}, False),
        ("freeze", {"running": False}, False),  # a stopped node has nothing to freeze
        ("thaw", {"running": True, "frozen": True}, True),
        ("thaw", {"running": True}, False),
        ("partition", {"running": True}, True),
        ("partition", {"running": True, "partitioned": True}, False),
        ("partition", {"running": False}, False),
        ("heal", {"running": True, "partitioned": True}, True),
        ("heal", {"running": True}, False),
    ],
)
def test_apply_acts_only_when_needed(tmp_path: Path, verb: str, state: dict[str, bool], acts: bool) -> None:
    node = NodeState(tmp_path, **state)
    assert chaos.apply(node, verb) is acts
    assert node.actions == ([verb] if acts else [])


def test_apply_twice_is_nothing_to_do_the_second_time(tmp_path: Path) -> None:
    node = NodeState(tmp_path)
    assert [chaos.apply(node, "partition"), chaos.apply(node, "partition")] == [True, False]
    assert chaos.state(node) == "Running, Partitioned"


def test_unknown_verb_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown verb 'reboot'"):
        chaos.apply(NodeState(tmp_path), "reboot")


def test_find_needs_a_saved_node(tmp_path: Path) -> None:
    assert chaos.find(tmp_path, "real-0") is None
    node = RealNode(NodeSpec("real-0", "kanri-a", 0), chaos.real_nodes_dir(tmp_path) / "real-0", tmp_path)
    node.layout.root.mkdir(parents=True)
    node.save()
    found = chaos.find(tmp_path, "real-0")
    assert found is not None
    assert (found.spec, found.layout.root) == (node.spec, node.layout.root)
