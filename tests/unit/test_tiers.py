"""The split ``make test`` runs in two processes at once is safe: every integration module that uses something the
machine has once (the tests' node network, real nodes, a local cluster, host brokers) runs with the e2e tier, never
beside it (tests/tiers.py)."""

from __future__ import annotations

from pathlib import Path

from tests.tiers import (
    HOST_WIDE_MODULES,
    REAL_NODE_MODULES,
    REAL_NODE_SERVICE_CIDR,
    meets_home_made_node,
    uses_host_wide,
)

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_every_integration_module_using_a_host_wide_thing_runs_with_the_e2e_tier() -> None:
    found = {path.stem for path in INTEGRATION.glob("test_*.py") if uses_host_wide(path)}
    assert found, "the pattern matches no module at all: it no longer says what it should"
    apart = HOST_WIDE_MODULES | REAL_NODE_MODULES
    assert found <= apart, f"run beside the e2e tier but use what exists once: {sorted(found - apart)}"


def test_the_real_node_modules_run_beside_the_e2e_tier_only_when_they_meet_nothing_of_the_home_made_node() -> None:
    assert not HOST_WIDE_MODULES & REAL_NODE_MODULES, "a module is in both lists"
    meeting = sorted(m for m in REAL_NODE_MODULES if meets_home_made_node(INTEGRATION / f"{m}.py"))
    assert not meeting, f"would meet the e2e tier's home-made node (route, up/down): {meeting}"
    assert meets_home_made_node(INTEGRATION / "test_local_cli.py"), "the pattern no longer sees a home-made node"


def test_the_real_node_process_has_a_service_range_of_its_own() -> None:
    """Its modules route their Service range from the host; the home-made node's kube-proxy serves 10.96.0.0/16."""
    script = (INTEGRATION.parents[1] / "hack" / "test.sh").read_text()
    real = [line for line in script.splitlines() if "-m real_nodes" in line]
    assert len(real) == 1, real
    assert f"KANRI_SERVICE_CIDR={REAL_NODE_SERVICE_CIDR}" in real[0], real[0]
    assert REAL_NODE_SERVICE_CIDR != "10.96.0.0/16"


def test_the_list_names_only_modules_that_exist() -> None:
    existing = {path.stem for path in INTEGRATION.glob("test_*.py")}
    listed = HOST_WIDE_MODULES | REAL_NODE_MODULES
    assert existing >= listed, sorted(listed - existing)


def test_a_module_starting_a_node_is_recognised(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("from tests.local_node_support import running_node\n")
    assert uses_host_wide(module)
    module.write_text("from kanri.local.node.options import NodeOptions  # only the provisioner, no node\n")
    assert not uses_host_wide(module)
