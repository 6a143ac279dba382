"""A local cluster stays on the kind of node it was made on (its volumes live there), and ``kanri local delete``
removes one: checked before anything starts, so no control plane or node is needed here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kanri.cli import local as local_cli
from kanri.cli.main import app
from kanri.local.node import network
from kanri.local.node.network import NodeLock
from kanri.local.realnode import NodeSpec, RealNode


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KANRI_HOME", str(tmp_path))
    return tmp_path


def test_real_nodes_refuse_a_cluster_the_home_made_node_made(home: Path) -> None:
    (home / "clusters" / "default" / "node" / "kanri-1" / "volumes").mkdir(parents=True)
    for command in (["local", "up", "--real-nodes"], ["up", "--real-nodes"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 1, result.output
        assert "was made on the home-made node (kanri-1)" in result.output, result.output
        assert "kanri local delete --name default" in result.output, result.output
    assert not (home / "clusters" / "default" / "controlplane.pid").exists()  # nothing was started


def test_the_home_made_node_refuses_a_cluster_real_nodes_made(home: Path) -> None:
    cluster_dir = home / "clusters" / "lab"
    (cluster_dir / "real-nodes" / "real-0").mkdir(parents=True)
    RealNode(NodeSpec("real-0", "kanri-a", 0), cluster_dir / "real-nodes" / "real-0", cluster_dir).save()
    result = CliRunner().invoke(app, ["local", "up", "--name", "lab"])
    assert result.exit_code == 1, result.output
    assert "was made on real nodes (real-0)" in result.output, result.output
    assert "`kanri up --real-nodes`" in result.output, result.output


def test_delete_removes_a_stopped_cluster_and_its_data(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # down's leftover scan looks at the whole machine (namespaces, nft tables), where tests running beside this one
    # keep theirs: here nothing of this cluster is left, which is what delete needs to know
    monkeypatch.setattr(local_cli, "find_leftovers", lambda options, machine_wide=True: [])
    volume = home / "clusters" / "old" / "node" / "kanri-1" / "volumes" / "pvc-1"
    volume.mkdir(parents=True)
    result = CliRunner().invoke(app, ["local", "delete", "--name", "old"])
    assert result.exit_code == 0, result.output
    assert "local cluster 'old' deleted" in result.output, result.output
    assert not (home / "clusters" / "old").exists()
    assert (home / "clusters").is_dir()  # other clusters' parent stays


def test_down_leaves_another_clusters_pod_network_alone_and_checks_only_its_own(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another node holds the machine's pod network (here a lock of the test's own), the namespaces named like
    a home-made node's are that node's: `down` of a cluster that has none reports nothing of them (it used to fail
    with them as its own leftovers, e.g. `kanri down` of a real-node cluster beside the e2e tier)."""
    netns = tmp_path / "netns"
    netns.mkdir()
    (netns / "kanri-5b0aed47").touch()  # a namespace of the other node's pod network
    monkeypatch.setattr(network, "NETNS_DIR", netns)
    other = NodeLock(tmp_path / "node.lock")
    monkeypatch.setattr(local_cli, "NodeLock", lambda: NodeLock(tmp_path / "node.lock"))
    assert NodeLock(tmp_path / "node.lock").holder() is None
    other.acquire()
    try:
        result = CliRunner().invoke(app, ["local", "down", "--name", "lab"])
    finally:
        other.release()
    assert result.exit_code == 0, result.output
    assert "kanri-5b0aed47" not in result.output, result.output
    assert "another local node" in result.output, result.output


def test_the_node_lock_says_who_holds_it_and_nobody_once_released(tmp_path: Path) -> None:
    lock = NodeLock(tmp_path / "node.lock")
    assert NodeLock(tmp_path / "node.lock").holder() is None  # no file yet
    lock.acquire()
    try:
        assert NodeLock(tmp_path / "node.lock").holder() == str(os.getpid())
    finally:
        lock.release()
    assert NodeLock(tmp_path / "node.lock").holder() is None
    lock.acquire()  # holder() took nothing away
    lock.release()
