"""A traceback in the logs never shows a frame's local variables: a local may hold a secret (issue 16's rule that
secrets stay out of logs; the cache operator's e2e secret scan once found a password in a reconcile failure)."""

from __future__ import annotations

import pytest
import structlog

from kanri.runtime import configure_logging

PASSWORD = "s3cret-in-a-local-variable"


def _fail_holding_a_secret() -> None:
    password = PASSWORD
    raise RuntimeError(f"could not connect ({len(password)} characters of password)")


@pytest.mark.parametrize("json", [True, False])
def test_an_exception_logged_does_not_render_locals(json: bool, capsys: pytest.CaptureFixture[str]) -> None:
    saved = structlog.get_config()
    configure_logging("info", json=json)
    try:
        try:
            _fail_holding_a_secret()
        except RuntimeError:
            structlog.get_logger("test").exception("reconcile failed")
        err = capsys.readouterr().err
        assert "reconcile failed" in err
        assert "RuntimeError" in err, err  # the traceback is there
        assert PASSWORD not in err, "a traceback in the logs showed a local variable holding a secret"
    finally:
        structlog.configure(**saved)  # the other tests' logging, not one bound to this test's captured stderr
