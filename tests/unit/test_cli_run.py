"""``kanri run`` refused by a newer operator's CRDs ends with the refusal in one line, not a traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kanri.cli import run as run_module
from kanri.cli.main import app
from kanri.runtime import CrdDowngradeRefused


def test_a_refused_crd_downgrade_exits_1_with_the_message_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    message = "CRD postgresclusters.kanri.dev was written by kanri operator 0.2.0; this operator is 0.1.0"

    async def refused(kubeconfig: str | None, options: object) -> None:
        raise CrdDowngradeRefused(message)

    monkeypatch.setattr(run_module, "_run", refused)
    # the process-wide logging set-up would outlive this test and change what later tests' log captures see
    monkeypatch.setattr(run_module, "configure_logging", lambda level: None)
    result = CliRunner().invoke(app, ["run", "--no-leader-election"])
    assert result.exit_code == 1, result.output
    assert message in result.output, result.output
    assert "Traceback" not in result.output, result.output
