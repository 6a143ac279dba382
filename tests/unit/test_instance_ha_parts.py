"""The pure parts of the instance manager's high-availability side: the isolation decisions and their settings,
pg_controldata parsing, the pause marker, the paused replica's conf, the interrupted-rejoin cleanup."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from kanri.instance.conf import render_postgresql_conf
from kanri.instance.config import ClusterConfig, Credentials, Settings
from kanri.instance.demote import parse_controldata
from kanri.instance.isolation import (
    ISOLATION_WINDOW,
    MAX_STARVED_CREDIT,
    IsolationSettings,
    IsolationWatch,
    run_queue_wait,
)
from kanri.instance.rejoin import aside_path, restore_interrupted
from kanri.instance.replication_pause import clear_pause, marker_path, read_pause, write_pause

WALL = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)
ENV = {"KANRI_CLUSTER": "orders", "POD_NAME": "orders-2"}


def conf_lines(text: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line and not line.startswith("#"))


def test_isolation_is_on_inside_a_cluster_off_outside_and_the_switch_wins() -> None:
    inside = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert IsolationSettings.from_env(inside) == IsolationSettings(True, "10.96.0.1", 443, ISOLATION_WINDOW)
    assert IsolationSettings.from_env({}).enabled is False
    assert IsolationSettings.from_env({**inside, "KANRI_ISOLATION_CHECK": "off"}).enabled is False
    on = IsolationSettings.from_env({**inside, "KANRI_ISOLATION_CHECK": "on", "KANRI_ISOLATION_WINDOW": "2.5"})
    assert (on.enabled, on.window) == (True, 2.5)
    for bad in (
        {"KANRI_ISOLATION_CHECK": "on"},  # on, but no API server to check
        {**inside, "KANRI_ISOLATION_CHECK": "yes"},
        {**inside, "KANRI_ISOLATION_WINDOW": "0.5"},
        {**inside, "KANRI_ISOLATION_WINDOW": "soon"},
        {**inside, "KUBERNETES_SERVICE_PORT": "http"},
    ):
        with pytest.raises(ValueError, match=r"KANRI_ISOLATION|KUBERNETES_SERVICE"):
            IsolationSettings.from_env(bad)


def test_a_primary_fences_only_once_nothing_answered_for_the_whole_window() -> None:
    watch = IsolationWatch(4.0)
    assert watch.frozen(100.0) is None
    assert watch.observe(100.1, "apiserver", WALL) is None
    for now in (101.0, 102.0, 103.0):
        assert watch.frozen(now) is None
        assert watch.observe(now + 0.1, None, WALL) is None
    assert watch.frozen(104.0) is None
    assert watch.observe(104.1, None, WALL) == pytest.approx(4.0)
    # a standby's reply is contact too, and restarts the window
    assert watch.observe(104.2, "standby", WALL) is None
    assert watch.as_json() == {"lastContact": "2026-12-02T04:00:00.000+00:00", "via": "standby"}
    assert watch.observe(108.1, None, WALL) is None
    assert watch.observe(108.2, None, WALL) == pytest.approx(4.0)


def test_a_gap_between_two_passes_longer_than_the_window_is_a_freeze_whatever_the_checks_say() -> None:
    watch = IsolationWatch(4.0)
    assert watch.frozen(10.0) is None
    assert watch.observe(10.1, "apiserver", WALL) is None
    assert watch.frozen(11.0) is None
    assert watch.frozen(16.5) == pytest.approx(5.5)
    # a gap within the window is a slow pass, not a freeze
    assert watch.frozen(20.0) is None


def test_a_starved_manager_is_not_frozen_its_run_queue_wait_does_not_count_as_a_gap() -> None:
    watch = IsolationWatch(4.0)
    assert watch.frozen(10.0, waited=1.0) is None
    assert watch.observe(10.1, "apiserver", WALL, waited=1.0) is None
    # 9 s between passes, 8 of them runnable but waiting for a CPU: starved, not stopped
    assert watch.frozen(19.0, waited=9.0) is None
    # 9 s between passes and no run-queue wait: it did not run at all (SIGSTOP, the freezer)
    assert watch.frozen(28.0, waited=9.0) == pytest.approx(9.0)


def test_failed_checks_while_starved_are_credited_at_most_the_cap_then_it_fences() -> None:
    watch = IsolationWatch(4.0)
    assert watch.frozen(0.0) is None
    assert watch.observe(0.0, "apiserver", WALL, waited=0.0) is None
    # no check answered for 4.5 s, 3 s of which it waited for a CPU: only the cap is credited
    assert watch.observe(4.5, None, WALL, waited=3.0) is None
    assert watch.observe(4.0 + MAX_STARVED_CREDIT, None, WALL, waited=3.0) == pytest.approx(4.0)
    # a primary cut off but not starved fences at the plain window, as before
    plain = IsolationWatch(4.0)
    assert plain.observe(0.0, "standby", WALL, waited=7.0) is None
    assert plain.observe(3.9, None, WALL, waited=7.05) is None
    assert plain.observe(4.05, None, WALL, waited=7.05) == pytest.approx(4.0)


def test_the_run_queue_wait_is_read_from_schedstat_and_is_zero_where_there_is_none(tmp_path: Path) -> None:
    stat = tmp_path / "schedstat"
    stat.write_text("894638 2500000000 2\n")
    assert run_queue_wait(stat) == pytest.approx(2.5)
    assert run_queue_wait(tmp_path / "missing") == 0.0
    assert run_queue_wait() >= 0.0  # this kernel's own


def test_an_instance_that_was_not_a_running_primary_starts_a_fresh_window() -> None:
    watch = IsolationWatch(4.0)
    for now in (0.0, 1.0, 50.0, 51.0):  # a replica (or a stopped primary) for a long time
        watch.idle(now)
    assert watch.frozen(52.0) is None
    assert watch.observe(52.1, None, WALL) is None
    assert watch.observe(54.9, None, WALL) is None  # counted from the last moment it was not a running primary
    assert watch.observe(55.0, None, WALL) == pytest.approx(4.0)
    assert watch.as_json() == {"lastContact": None, "via": None}


CONTROLDATA = """pg_control version number:            1300
Database system identifier:           7440123456789012345
Database cluster state:               shut down
Latest checkpoint location:           0/3000028
Latest checkpoint's REDO location:    0/3000028
Latest checkpoint's TimeLineID:       2
"""


def test_controldata_gives_the_shutdown_checkpoint_and_its_timeline() -> None:
    control = parse_controldata(CONTROLDATA)
    assert (control.state, control.checkpoint_lsn, control.timeline) == ("shut down", "0/3000028", 2)
    assert control.system_identifier == "7440123456789012345"
    with pytest.raises(ValueError, match="Latest checkpoint location"):
        parse_controldata(CONTROLDATA.replace("Latest checkpoint location", "Something"))


def test_the_pause_marker_is_beside_pgdata_durable_and_an_unreadable_one_still_pauses(tmp_path: Path) -> None:
    path = marker_path(tmp_path / "pgdata")
    assert path.parent == tmp_path
    assert read_pause(path) is None
    record = write_pause(path, WALL, 3)
    assert read_pause(path) == record
    assert (record.since, record.timeline) == ("2026-12-02T04:00:00+00:00", 3)
    path.write_text("{not json")
    assert read_pause(path) is not None
    assert clear_pause(path) is True
    assert clear_pause(path) is False
    assert read_pause(path) is None


def test_a_paused_replica_has_no_primary_conninfo_but_keeps_its_slot() -> None:
    settings = Settings.from_env(ENV)
    replication = Credentials("streaming_replica", "pw")
    streaming = conf_lines(render_postgresql_conf(settings, ClusterConfig(), {}, replica=True, replication=replication))
    paused = conf_lines(
        render_postgresql_conf(settings, ClusterConfig(), {}, replica=True, replication=replication, paused=True)
    )
    assert "primary_conninfo" in streaming
    assert "primary_conninfo" not in paused
    assert paused["primary_slot_name"] == streaming["primary_slot_name"] == "'orders_2'"
    assert paused["wal_receiver_status_interval"] == "'1s'"  # standbys reply every second (isolation check)


def test_an_interrupted_clone_puts_the_old_data_back_and_a_finished_one_drops_it(tmp_path: Path) -> None:
    settings = Settings.from_env({**ENV, "PGDATA": str(tmp_path / "pgdata")})
    aside = aside_path(settings)
    assert restore_interrupted(settings) is None
    aside.mkdir()
    (aside / "PG_VERSION").write_text("15\n")
    (tmp_path / "pgdata").mkdir()  # a clone had begun
    assert restore_interrupted(settings) == "put the old data directory back after an interrupted rejoin"
    assert (tmp_path / "pgdata" / "PG_VERSION").read_text() == "15\n"
    assert not aside.exists()
    aside.mkdir()
    assert restore_interrupted(settings) == "removed the old data directory a completed rejoin left"
    assert not aside.exists()
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()


def test_wal_keep_size_defaults_to_512mb_for_pg_rewind_and_a_user_value_wins() -> None:
    settings = Settings.from_env(ENV)
    default = render_postgresql_conf(settings, ClusterConfig(), {}, replica=False, replication=None)
    assert conf_lines(default)["wal_keep_size"] == "'512MB'"
    mine = render_postgresql_conf(settings, ClusterConfig(), {"wal_keep_size": "1GB"}, replica=False, replication=None)
    assert mine.count("wal_keep_size") == 1
    assert conf_lines(mine)["wal_keep_size"] == "'1GB'"


def test_archive_timeout_defaults_to_5min_so_a_quiet_clusters_commits_reach_the_archive_and_a_user_value_wins() -> None:
    settings = Settings.from_env(ENV)
    default = render_postgresql_conf(settings, ClusterConfig(), {}, replica=False, replication=None)
    assert conf_lines(default)["archive_timeout"] == "'5min'"
    mine = render_postgresql_conf(settings, ClusterConfig(), {"archive_timeout": "60"}, replica=False, replication=None)
    assert mine.count("archive_timeout") == 1
    assert conf_lines(mine)["archive_timeout"] == "'60'"
