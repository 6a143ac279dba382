"""The pure parts around kube-proxy: the guard table's rules, the host-served EndpointSlices, the sysctl record."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kanri.local.node import NodeOptions
from kanri.local.node.kubeproxy import PROXY_KUBECONFIG, Sysctls, guard_ruleset, guard_table, kubeconfig_for_proxy
from kanri.local.node.services import MANAGED_BY, SERVICE_NAME_LABEL, endpoints, host_endpoint_slice
from kanri.runtime import Request

OPTIONS = NodeOptions(data_dir=Path("/nonexistent"), bridge="kanri-t0", pod_cidr="10.246.0.0/16")


def test_guard_drops_what_pods_send_outside_the_pod_network_and_what_is_routed_into_it() -> None:
    rules = guard_ruleset(OPTIONS)
    assert guard_table(OPTIONS) == "kanri-kanri-t0"
    assert 'iifname "kanri-t0" ip daddr != 10.246.0.0/16 counter drop' in rules
    assert 'oifname "kanri-t0" iifname != "kanri-t0" counter drop' in rules
    assert "type filter hook forward" in rules
    assert "policy accept" in rules  # the host's own forwarding between other interfaces is not ours to stop


@pytest.mark.skipif(shutil.which("nft") is None or os.geteuid() != 0, reason="needs nft and root")
def test_guard_ruleset_is_valid_nft_input() -> None:
    # -c: parse and check against the kernel without changing anything.
    result = subprocess.run(["nft", "-c", "-f", "-"], input=guard_ruleset(OPTIONS), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_host_endpoint_slice_names_the_address_and_the_service_ports() -> None:
    slice_ = host_endpoint_slice(
        Request("kube-system", "kube-dns"), "10.246.0.1", [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")]
    )
    assert slice_["metadata"]["labels"] == {
        SERVICE_NAME_LABEL: "kube-dns",
        "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
    }
    assert slice_["metadata"]["namespace"] == "kube-system"
    (endpoint,) = endpoints([slice_], "dns-tcp")
    assert (endpoint.address, endpoint.port, endpoint.ready) == ("10.246.0.1", 53, True)
    (udp,) = endpoints([slice_], "dns", protocol="UDP")
    assert udp.port == 53


def test_sysctls_put_back_the_first_value_seen_even_across_a_crash(tmp_path: Path) -> None:
    knob = tmp_path / "ip_forward"
    knob.write_text("0\n")
    record = tmp_path / "record.json"
    Sysctls(record).set(knob, "1")
    assert knob.read_text() == "1"
    # A crashed node's successor sets it again: the original stays "0", not its own "1".
    Sysctls(record).set(knob, "1")
    Sysctls(record).restore()
    assert knob.read_text() == "0"
    assert not record.exists()


def test_sysctls_leave_a_value_that_was_already_right(tmp_path: Path) -> None:
    knob = tmp_path / "bridge-nf-call-iptables"
    knob.write_text("1\n")
    record = tmp_path / "record.json"
    Sysctls(record).set(knob, "1")
    assert not record.exists()
    Sysctls(record).restore()
    assert knob.read_text() == "1\n"


def test_kube_proxy_runs_as_system_kube_proxy_when_the_control_plane_wrote_its_kubeconfig(tmp_path: Path) -> None:
    admin = tmp_path / "admin.kubeconfig"
    admin.write_text("{}")
    assert kubeconfig_for_proxy(admin) == admin
    (tmp_path / PROXY_KUBECONFIG).write_text("{}")
    assert kubeconfig_for_proxy(admin) == tmp_path / PROXY_KUBECONFIG
