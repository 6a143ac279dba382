"""``kanri run``: wired into the command, options parsed, bad input refused before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kanri.cli import run as run_module
from kanri.cli.main import app


def test_run_is_a_kanri_command_with_its_options() -> None:
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0
    for option in ("--kubeconfig", "--namespace", "--health-port", "--leader-election", "--log-level"):
        assert option in result.output


def test_an_unknown_log_level_is_refused() -> None:
    result = CliRunner().invoke(app, ["run", "--log-level", "chatty"])
    assert result.exit_code != 0


def test_the_lease_goes_to_the_operators_own_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "kanri-system")
    assert run_module.own_namespace() == "kanri-system"
    monkeypatch.delenv("POD_NAMESPACE")
    monkeypatch.setattr(run_module, "_SERVICE_ACCOUNT_NAMESPACE", Path("/nonexistent/namespace"))
    assert run_module.own_namespace() == "default"
