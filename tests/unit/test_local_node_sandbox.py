"""Pure parts of a pod's sandbox: addresses, /etc files, passwd entries, atomic volume writes, mountpoints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kanri.local.node import NodeOptions, network
from kanri.local.node.mounts import write_atomically
from kanri.local.node.network import AddressPool, NetworkError, NodeLock, host_link_name, leftover_namespaces
from kanri.local.node.sandbox import Mountpoints, hosts_file, passwd_and_group, resolv_conf

Obj = dict[str, Any]


def pod(**spec: Any) -> Obj:
    return {"metadata": {"name": "db-0", "namespace": "shop", "uid": "u"}, "spec": {"containers": [], **spec}}


def test_addresses_skip_the_gateway_and_are_reused_as_late_as_possible() -> None:
    pool = AddressPool("10.9.0.0/29", "10.9.0.1")  # hosts .1-.6, .1 is the gateway
    first = [pool.allocate() for _ in range(3)]
    assert first == ["10.9.0.2", "10.9.0.3", "10.9.0.4"]
    pool.release("10.9.0.2")
    assert pool.allocate() == "10.9.0.5"  # not the one just freed
    assert pool.allocate() == "10.9.0.6"
    assert pool.allocate() == "10.9.0.2"  # wrapped around to the free one
    with pytest.raises(NetworkError, match="no free address"):
        pool.allocate()


def test_a_gateway_outside_the_cidr_is_refused() -> None:
    with pytest.raises(ValueError, match="not inside the pod CIDR"):
        AddressPool("10.9.0.0/24", "10.8.0.1")


def test_host_link_names_fit_the_kernel_limit() -> None:
    name = host_link_name("5b0aed47-1234-5678-9abc-def012345678")
    assert name == "kv5b0aed47"
    assert len(name) <= 15


def test_hosts_file_names_the_pod_and_its_subdomain_fqdn_first() -> None:
    text = hosts_file(pod(hostname="db-0", subdomain="db"), "10.244.0.7", "cluster.local")
    assert "127.0.0.1\tlocalhost" in text
    assert "10.244.0.7\tdb-0.db.shop.svc.cluster.local db-0\n" in text


def test_resolv_conf_follows_dns_policy() -> None:
    cluster_first = resolv_conf(pod(), "10.96.0.10", "cluster.local")
    assert cluster_first == (
        "nameserver 10.96.0.10\nsearch shop.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
    )
    assert resolv_conf(pod(dnsPolicy="Default"), "10.96.0.10", "cluster.local") is None
    assert resolv_conf(pod(hostNetwork=True), "10.96.0.10", "cluster.local") is None
    custom = resolv_conf(
        pod(dnsPolicy="None", dnsConfig={"nameservers": ["1.2.3.4"], "options": [{"name": "ndots", "value": "2"}]}),
        "10.96.0.10",
        "cluster.local",
    )
    assert custom == "nameserver 1.2.3.4\noptions ndots:2\n"


def test_image_users_replace_host_entries_of_the_same_name() -> None:
    accounts = passwd_and_group([{"name": "postgres", "uid": 26, "gid": 26, "home": "/var/lib/postgresql"}], 26, 26)
    assert accounts is not None
    passwd, group = accounts
    postgres = [line for line in passwd.splitlines() if line.startswith("postgres:")]
    assert postgres == ["postgres:x:26:26:postgres:/var/lib/postgresql:/bin/sh"]
    assert "root:x:0:0:" in passwd  # the rest of the host's entries stay
    assert [line for line in group.splitlines() if line.startswith("postgres:")] == ["postgres:x:26:"]


def test_an_unknown_run_as_user_gets_an_entry_and_a_known_one_changes_nothing() -> None:
    accounts = passwd_and_group([], 4242, 4242)
    assert accounts is not None
    assert "uid4242:x:4242:4242:" in accounts[0]
    assert "gid4242:x:4242:" in accounts[1]
    assert passwd_and_group([], 0, 0) is None


def test_volume_files_are_swapped_atomically_and_only_on_change(tmp_path: Path) -> None:
    directory = tmp_path / "config"
    assert write_atomically(directory, {"a.json": (b"1", None), "sub/b": (b"2", 0o600)}, 0o644, None)
    first = os.readlink(directory / "..data")
    assert (directory / "a.json").read_bytes() == b"1"
    assert (directory / "a.json").is_symlink()
    assert (directory / "sub" / "b").read_bytes() == b"2"
    assert oct((directory / "sub" / "b").stat().st_mode & 0o777) == oct(0o600)
    assert not write_atomically(directory, {"a.json": (b"1", None), "sub/b": (b"2", 0o600)}, 0o644, None)
    assert write_atomically(directory, {"a.json": (b"3", None)}, 0o644, None)
    assert os.readlink(directory / "..data") != first
    assert not (directory / first).exists()  # the old generation is gone
    assert (directory / "a.json").read_bytes() == b"3"
    assert not (directory / "sub").exists()  # a key that went away goes away


def test_mountpoints_made_on_the_host_are_removed_while_empty(tmp_path: Path) -> None:
    points = Mountpoints(tmp_path / "node")
    points.ensure(tmp_path / "etc" / "kanri" / "app", is_file=False)
    points.ensure(tmp_path / "etc" / "kanri" / "token", is_file=True)
    points.ensure(tmp_path / "kept", is_file=False)
    (tmp_path / "kept" / "data").write_text("someone's")
    left = points.remove_all()
    assert not (tmp_path / "etc").exists()
    assert left == [str(tmp_path / "kept")]
    assert (tmp_path / "kept" / "data").exists()  # never removes what is not empty


def test_one_networked_node_per_machine(tmp_path: Path) -> None:
    first, second = NodeLock(tmp_path / "node.lock"), NodeLock(tmp_path / "node.lock")
    first.acquire()
    try:
        with pytest.raises(NetworkError, match=rf"another kanri local node \(pid {os.getpid()}\)"):
            second.acquire()
    finally:
        first.release()
    second.acquire()  # free again once released
    second.release()


def test_leftover_namespaces_match_the_prefix_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("kanri-5b0aed47", "kanri-t-5b0aed47", "kanri-svc", "other"):
        (tmp_path / name).touch()
    monkeypatch.setattr(network, "NETNS_DIR", tmp_path)
    assert leftover_namespaces(NodeOptions(data_dir=tmp_path)) == ["kanri-5b0aed47"]
    assert leftover_namespaces(NodeOptions(data_dir=tmp_path, netns_prefix="kanri-t-")) == ["kanri-t-5b0aed47"]
