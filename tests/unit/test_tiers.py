"""The split ``make test`` runs in two processes at once is safe: every integration module that uses something the
machine has once (the tests' node network, real nodes, a local cluster, host brokers) runs with the e2e tier, never
beside it (tests/tiers.py)."""

from __future__ import annotations

from pathlib import Path

from tests.tiers import HOST_WIDE_MODULES, uses_host_wide

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_every_integration_module_using_a_host_wide_thing_runs_with_the_e2e_tier() -> None:
    found = {path.stem for path in INTEGRATION.glob("test_*.py") if uses_host_wide(path)}
    assert found, "the pattern matches no module at all: it no longer says what it should"
    assert found <= HOST_WIDE_MODULES, (
        f"run beside the e2e tier but use what exists once: {sorted(found - HOST_WIDE_MODULES)}"
    )


def test_the_list_names_only_modules_that_exist() -> None:
    existing = {path.stem for path in INTEGRATION.glob("test_*.py")}
    assert existing >= HOST_WIDE_MODULES, sorted(HOST_WIDE_MODULES - existing)


def test_a_module_starting_a_node_is_recognised(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("from tests.local_node_support import running_node\n")
    assert uses_host_wide(module)
    module.write_text("from kanri.local.node.options import NodeOptions  # only the provisioner, no node\n")
    assert not uses_host_wide(module)
