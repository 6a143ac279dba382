"""The instance manager's checks that need no server: PostgreSQL's log parsed, problems, data directory identity."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kanri.instance.conf_check import library_missing, parse_log
from kanri.instance.config import ClusterConfig
from kanri.instance.identity import data_version, start_problems, system_identifier
from kanri.instance.problems import Problem, ProblemBoard

# what `postgres -C` printed on PostgreSQL 15 for a candidate file with bad values (measured)
LOG = """\
2026-12-01 19:45:55.705 GMT [17167] LOG:  invalid value for parameter "work_mem": "lots"
2026-12-01 19:45:55 GMT [1] LOG:  2 8kB is outside the valid range for parameter "shared_buffers" (16 .. 1073741823)
2026-12-01 19:45:55.705 GMT [17167] LOG:  invalid value for parameter "log_min_messages": "secretvalue"
2026-12-01 19:45:55.705 GMT [17167] HINT:  Available values: debug5, debug4, debug3, debug2, debug1, info, notice.
2026-12-01 19:45:55.726 GMT [17171] LOG:  invalid value for parameter "TimeZone": "Mars/Base"
2026-12-01 19:45:55.726 GMT [17171] LOG:  invalid value for parameter "search_path": "secretvalue2"
2026-12-01 19:45:55.726 GMT [17171] DETAIL:  "secretvalue2" is not a list.
2026-12-01 19:45:55.705 GMT [17167] FATAL:  configuration file "/run/kanri-candidate.conf" contains errors
"""


def test_postgres_log_becomes_one_message_per_parameter_without_the_values() -> None:
    values = {
        "work_mem": "lots",
        "shared_buffers": "12kB",
        "log_min_messages": "secretvalue",
        "timezone": "Mars/Base",
        "search_path": "secretvalue2",
    }
    by_parameter, other = parse_log(LOG, values)
    assert other == []
    assert by_parameter == {
        "work_mem": 'invalid value for parameter "work_mem"',
        "shared_buffers": 'value is outside the valid range for parameter "shared_buffers" (16 .. 1073741823)',
        "log_min_messages": 'invalid value for parameter "log_min_messages" (Available values: debug5, debug4, '
        "debug3, debug2, debug1, info, notice)",
        "timezone": 'invalid value for parameter "timezone"',
        "search_path": 'invalid value for parameter "search_path"',  # its DETAIL echoes the value: left out
    }


def test_an_unknown_parameter_is_named_without_the_file() -> None:
    line = 'LOG:  unrecognized configuration parameter "no_such" in file "/run/kanri-candidate.conf" line 3\n'
    assert parse_log(line, {}) == ({"no_such": 'unrecognized configuration parameter "no_such"'}, [])


def test_a_library_is_looked_up_with_and_without_its_suffix(tmp_path: Path) -> None:
    (tmp_path / "pg_stat_statements.so").write_bytes(b"")
    assert not library_missing(tmp_path, ' "pg_stat_statements"')
    assert not library_missing(tmp_path, "$libdir/pg_stat_statements")
    assert library_missing(tmp_path, "no_such_lib")


def test_a_problem_is_one_short_line() -> None:
    problem = Problem("InvalidParameter", "a\nb " + "x" * 400, parameter="work_mem")
    assert "\n" not in problem.message
    assert len(problem.message) == 300
    assert problem.as_json()["parameter"] == "work_mem"
    assert "secret" not in problem.as_json()


def test_the_board_reports_a_change_once() -> None:
    board = ProblemBoard()
    problem = Problem("InvalidSecret", "app Secret: password is empty", secret="app", key="password")
    assert board.set("secret:app", [problem]) is True
    assert board.set("secret:app", [problem]) is False  # the next pass: nothing new, nothing logged
    assert board.all() == [problem]
    assert board.clear("secret:app") is True
    assert board.all() == []


def control_file(pgdata: Path, identifier: int, version: str = "15") -> None:
    (pgdata / "global").mkdir(parents=True)
    (pgdata / "global" / "pg_control").write_bytes(identifier.to_bytes(8, sys.byteorder) + b"\0" * 100)
    (pgdata / "PG_VERSION").write_text(version + "\n")


def test_the_data_directory_names_its_system_and_major(tmp_path: Path) -> None:
    control_file(tmp_path, 7300000000000000001)
    assert system_identifier(tmp_path) == "7300000000000000001"
    assert data_version(tmp_path) == 15
    assert data_version(tmp_path / "none") is None


@pytest.mark.parametrize(
    ("identifier", "version", "reasons"),
    [
        ("42", "15", []),
        ("43", "15", ["SystemIdentifierMismatch"]),
        (None, "14", ["DataVersionMismatch"]),
        ("43", "16", ["DataVersionMismatch", "SystemIdentifierMismatch"]),
    ],
)
def test_a_foreign_or_other_major_data_directory_is_not_started(
    tmp_path: Path, identifier: str | None, version: str, reasons: list[str]
) -> None:
    control_file(tmp_path, 42, version)
    config = ClusterConfig.model_validate({"systemIdentifier": identifier})
    assert [p.reason for p in start_problems(tmp_path, config, 15)] == reasons


def test_the_config_takes_a_decimal_system_identifier_only() -> None:
    assert ClusterConfig.parse(b'{"systemIdentifier": "7300"}').system_identifier == "7300"
    with pytest.raises(ValueError, match="invalid"):
        ClusterConfig.parse(b'{"systemIdentifier": "73x"}')
    with pytest.raises(ValueError, match="not UTF-8"):
        ClusterConfig.parse(b'{"parameters": {"a": "\xff"}}')
