"""An instance manager that cannot connect to its own running PostgreSQL says so: ``PostgresUnreachable`` with the
first line of libpq's error (never SQL, never a password), after a grace, cleared by the first connection that works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from kanri.contract.problems import REASONS
from kanri.instance.config import Settings
from kanri.instance.manager import InstanceManager
from kanri.instance.problems import UNREACHABLE, Reachability, cannot_connect_now, connection_error
from kanri.local.ports import free_port

PASSWORD = "pw-s3cret-never-shown"
PEER = (
    'connection failed: connection to server on socket "/var/run/postgresql/.s.PGSQL.5432" failed: FATAL:  Peer '
    'authentication failed for user "postgres"'
)


def closed_port() -> int:
    return free_port()  # nothing listens there (from this process's own range under make test)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the message ------------------------------------------------------------------------------------------------------


def test_the_message_is_libpqs_first_line_without_psycopgs_prefix() -> None:
    assert connection_error(PEER) == (
        'connection to server on socket "/var/run/postgresql/.s.PGSQL.5432" failed: FATAL: Peer authentication '
        'failed for user "postgres"'
    )
    hints = 'connection is bad: connection to server on socket "/run/x/.s.PGSQL.5432" failed: Permission denied\n' \
        "\tIs the server running locally and accepting connections on that socket?"  # fmt: skip
    assert connection_error(hints) == 'connection to server on socket "/run/x/.s.PGSQL.5432" failed: Permission denied'


def test_nothing_after_the_first_line_reaches_the_message() -> None:
    # Should an error ever carry SQL with a secret in a later line (a statement's "LINE 1: ..."), it is cut off.
    text = "connection failed: FATAL:  something\nLINE 1: ALTER ROLE app PASSWORD 'hunter2'\n        ^"
    assert connection_error(text) == "FATAL: something"
    assert connection_error(OSError()) == "OSError"
    assert len(connection_error("x" * 1000)) <= 300


def test_a_password_in_the_text_is_masked_all_the_same() -> None:
    masked = connection_error(f"invalid connection option: host=h password={PASSWORD} user=u")
    assert PASSWORD not in masked
    assert "password=***" in masked
    assert PASSWORD not in connection_error(f"password = '{PASSWORD} with spaces' x")


def test_a_real_failed_connect_with_a_password_in_the_conninfo_never_shows_it(tmp_path: Path) -> None:
    conninfos = [
        f"host=127.0.0.1,localhost port={closed_port()} user=postgres password={PASSWORD} connect_timeout=2",
        f"host={tmp_path} port=5999 user=postgres password={PASSWORD} dbname=postgres",
    ]
    for conninfo in conninfos:
        with pytest.raises(psycopg.OperationalError) as failed:
            psycopg.connect(conninfo)
        message = connection_error(failed.value)
        assert PASSWORD not in message
        assert "\n" not in message
        assert message.startswith("connection to server "), message
    assert f"{tmp_path}/.s.PGSQL.5999" in message
    assert message.endswith("failed: No such file or directory")


def test_a_server_that_is_starting_or_stopping_is_not_unreachable() -> None:
    for state in ("starting up", "shutting down", "in recovery mode", "not yet accepting connections"):
        assert cannot_connect_now(f'connection to server on socket "/s" failed: FATAL:  the database system is {state}')
    assert not cannot_connect_now(connection_error(PEER))
    assert not cannot_connect_now("FATAL:  sorry, too many clients already")


# --- when it is reported ----------------------------------------------------------------------------------------------


def test_a_failure_is_reported_only_once_it_lasted_and_clears_on_the_first_connection() -> None:
    clock = Clock()
    reach = Reachability(after=10, clock=clock)
    postmaster = object()
    assert reach.failed(postmaster, PEER) == []  # a postmaster may have no socket for a moment after it starts
    clock.now += 9
    assert reach.failed(postmaster, PEER) == []
    clock.now += 1
    (problem,) = reach.failed(postmaster, PEER)
    assert problem.reason == UNREACHABLE == "PostgresUnreachable"
    assert problem.reason in REASONS
    assert problem.message == connection_error(PEER)
    assert reach.reached() == []
    assert reach.failed(postmaster, PEER) == []  # the grace starts again


def test_a_new_postmaster_or_a_server_on_its_way_starts_the_grace_again() -> None:
    clock = Clock()
    reach = Reachability(after=10, clock=clock)
    first, second = object(), object()
    reach.failed(first, PEER)
    clock.now += 20
    assert reach.failed(first, PEER) != []
    assert reach.failed(second, PEER) == []  # restarted: its own grace
    clock.now += 20
    assert reach.failed(second, "connection failed: FATAL:  the database system is starting up") == []
    assert reach.failed(second, PEER) == []


# --- in the manager: /status carries it -------------------------------------------------------------------------------


class RunningPostmaster:
    """What ``PostgresProcess.running`` looks at: a process that has not exited."""

    returncode: int | None = None


def manager(tmp_path: Path) -> InstanceManager:
    env = {"KANRI_CLUSTER": "db", "POD_NAME": "db-1", "PGDATA": str(tmp_path / "pgdata"),
           "KANRI_SOCKET_DIR": str(tmp_path / "no-socket-here"), "KANRI_PG_PORT": "5999",
           "KANRI_CONFIG_FILE": str(tmp_path / "instance.json")}  # fmt: skip
    return InstanceManager(Settings.from_env(env))


async def test_status_reports_a_running_postgres_it_cannot_reach_and_clears_it_once_stopped(tmp_path: Path) -> None:
    mgr = manager(tmp_path)
    mgr.core.reach = Reachability(after=0)  # no grace: the first failure is the lasting one
    fake: Any = RunningPostmaster()
    mgr.core.pg.process = fake
    mgr.core.data_ready = True
    status = await mgr.status()
    assert status["ready"] is False
    (problem,) = status["problems"]
    assert problem == {
        "reason": "PostgresUnreachable",
        "message": f'connection to server on socket "{tmp_path}/no-socket-here/.s.PGSQL.5999" failed: No such file '
        "or directory",
    }
    assert status["lastError"] == problem["message"]
    assert (await mgr.not_ready_reason()) == f"postgres unreachable: {problem['message']}"
    fake.returncode = 0  # the postmaster exited: nothing to reach, nothing to report
    status = await mgr.status()
    assert (status["problems"], status["lastError"]) == ([], None)
