"""The major upgrade's instance side with real PyPI PostgreSQL 14 and 15, outside Kubernetes: ``kanri-instance
upgrade-check`` against a live 14 server (passes; a ``regproc`` column — a real pg_upgrade incompatibility — makes it
fail with pg_upgrade's own reason), and ``kanri-instance upgrade`` on a stopped 14 data directory: upgraded with
``--link``, data and extension kept, and its refusals when an earlier run was interrupted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kanri.local.pg_binaries import Installation, installed, newest_per_major
from kanri.local.ports import free_port
from tests.integration.test_instance_manager import chown_tree, python_for_instances, run_as

_NEWEST = newest_per_major(installed())
pytestmark = [
    pytest.mark.skipif(not {14, 15} <= set(_NEWEST), reason="PyPI PostgreSQL 14 and 15 not installed"),
    pytest.mark.timeout(300),
]
PASSWORD = "pw-upgrade-check-secret"


def _env(release: Installation, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"PATH": f"{release.bin_dir}:/usr/bin:/bin", "LANG": "C.UTF-8",
            "LD_LIBRARY_PATH": str(release.prefix / "lib"), **(extra or {})}  # fmt: skip


def _run(args: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    user = run_as()
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False,
                          user=user.pw_uid if user else None, group=user.pw_gid if user else None)  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"{args[0]} failed: {done.stdout}\n{done.stderr}")
    return done


class Old14:
    """A PostgreSQL 14 data directory made as kanri's initdb makes it, with data and an extension."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.volume = root / "volume"
        self.pgdata = self.volume / "pgdata"
        self.socket = root / "run"
        self.port = free_port()
        self.release = _NEWEST[14]
        self.env = _env(self.release)

    def bin(self, program: str) -> str:
        return str(self.release.bin_dir / program)

    def create(self) -> None:
        for path in (self.volume, self.socket, self.root / "secrets"):
            path.mkdir(parents=True, exist_ok=True)
        (self.root / "secrets" / "password").write_text(PASSWORD + "\n")
        chown_tree(self.root)
        _run([self.bin("initdb"), "-D", str(self.pgdata), "--data-checksums", "--auth-local=peer",
              "--auth-host=scram-sha-256", "--encoding=UTF8", "--lc-collate=C", "--lc-ctype=C",
              "--username=postgres"], self.env)  # fmt: skip
        with (self.pgdata / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = "
                       f"'{self.socket}'\n")  # fmt: skip

    def start(self) -> None:
        _run([self.bin("pg_ctl"), "start", "-w", "-D", str(self.pgdata), "-l", str(self.root / "log")], self.env)

    def stop(self) -> None:
        _run([self.bin("pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.pgdata)], self.env)

    def sql(self, query: str, release: Installation | None = None) -> str:
        release = release or self.release
        args = [str(release.bin_dir / "psql"), "-X", "-A", "-t", "-h", str(self.socket), "-p", str(self.port),
                "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", query]  # fmt: skip
        done = _run(args, _env(release))
        return done.stdout.strip()


@pytest.fixture
def old14() -> Iterator[Old14]:
    root = Path(tempfile.mkdtemp(prefix="kanri-upgrade-"))
    os.chmod(root, 0o755)
    cluster = Old14(root)
    cluster.create()
    cluster.start()
    cluster.sql(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
    cluster.sql("CREATE EXTENSION pgcrypto")
    cluster.sql("CREATE TABLE ledger (id int PRIMARY KEY, note text)")
    cluster.sql("INSERT INTO ledger SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
    try:
        yield cluster
    finally:
        _run([cluster.bin("pg_ctl"), "stop", "-m", "immediate", "-D", str(cluster.pgdata)], cluster.env, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _command(cluster: Old14, command: str, pgdata: Path) -> tuple[int, dict[str, object], str]:
    python, python_env = python_for_instances()
    new = _NEWEST[15]
    env = {**_env(new), **python_env, "KANRI_CLUSTER": "orders", "POD_NAME": "orders-1", "PGDATA": str(pgdata),
           "KANRI_PG_BIN": str(new.bin_dir), "KANRI_PG_BIN_14": str(cluster.release.bin_dir),
           "KANRI_SOCKET_DIR": str(cluster.socket), "KANRI_UPGRADE_FROM": "14", "KANRI_UPGRADE_TO": "15",
           "KANRI_PRIMARY_HOST": "127.0.0.1", "KANRI_PRIMARY_PORT": str(cluster.port),
           "KANRI_SUPERUSER_DIR": str(cluster.root / "secrets"),
           "KANRI_TERMINATION_LOG": str(cluster.root / f"{command}.verdict")}  # fmt: skip
    done = _run([python, "-m", "kanri.instance", command], env, check=False)
    verdict = json.loads((cluster.root / f"{command}.verdict").read_text())
    return done.returncode, verdict, done.stdout + done.stderr


def test_the_check_passes_for_a_compatible_catalog_and_names_a_real_incompatibility(old14: Old14) -> None:
    scratch = old14.root / "check-volume" / "pgdata"
    scratch.parent.mkdir()
    chown_tree(scratch.parent)
    code, verdict, output = _command(old14, "upgrade-check", scratch)
    assert code == 0, output
    assert verdict["result"] == "Succeeded"
    assert "pg_upgrade --check 14 -> 15 passed" in str(verdict["message"])
    assert PASSWORD not in output  # the password went through a passfile, never into the log
    # a column of type regproc: pg_upgrade cannot carry reg* OIDs (they differ in the new catalog)
    old14.sql("CREATE TABLE procs (p regproc)")
    shutil.rmtree(scratch.parent / "check", ignore_errors=True)
    code, verdict, output = _command(old14, "upgrade-check", scratch)
    assert code == 1, output
    assert verdict["result"] == "Failed"
    assert "reg*" in str(verdict["message"]), verdict
    assert "procs" in str(verdict["message"]), verdict  # the offending table, from pg_upgrade's own list
    assert old14.sql("SELECT count(*) FROM ledger") == "5000"  # the live server was only read


def test_the_upgrade_links_the_data_directory_to_the_new_major_once(old14: Old14) -> None:
    before = old14.sql("SELECT md5(string_agg(id::text || note, ',' ORDER BY id)) FROM ledger")
    old14.stop()
    code, verdict, output = _command(old14, "upgrade", old14.pgdata)
    assert code == 0, output
    assert verdict["result"] == "Succeeded", verdict
    assert (old14.pgdata / "PG_VERSION").read_text().strip() == "15"
    assert not old14.pgdata.with_name("pgdata.kanri-old").exists()
    state = json.loads((old14.volume / "kanri-upgrade" / "state.json").read_text())
    identifier = str(verdict["systemIdentifier"])
    assert identifier.isdigit()  # the new cluster's own (pg_upgrade does not keep it): the operator records it
    assert state == {"from": 14, "to": 15, "step": "done", "systemIdentifier": identifier}
    assert (old14.volume / "kanri-upgrade" / "post-upgrade.json").is_file()
    # started with 15's binaries, the data is all there, checksums stayed on
    new = _NEWEST[15]
    # the new cluster has initdb's postgresql.conf (the instance manager writes its own at start)
    options = f"-c port={old14.port} -c unix_socket_directories={old14.socket}"
    _run([str(new.bin_dir / "pg_ctl"), "start", "-w", "-D", str(old14.pgdata), "-o", options, "-l",
          str(old14.root / "log15")], _env(new))  # fmt: skip
    try:
        assert old14.sql("SHOW server_version_num", new).startswith("15")
        assert old14.sql("SELECT md5(string_agg(id::text || note, ',' ORDER BY id)) FROM ledger", new) == before
        assert old14.sql("SHOW data_checksums", new) == "on"
        assert old14.sql("SELECT extname FROM pg_extension WHERE extname = 'pgcrypto'", new) == "pgcrypto"
    finally:
        _run([str(new.bin_dir / "pg_ctl"), "stop", "-w", "-D", str(old14.pgdata)], _env(new), check=False)
    # run again (a pod started twice): nothing is redone
    code, verdict, output = _command(old14, "upgrade", old14.pgdata)
    assert code == 0, output
    assert verdict.get("resumed") == "done", verdict


def test_an_interrupted_link_is_never_run_again(old14: Old14) -> None:
    old14.stop()
    work = old14.volume / "kanri-upgrade"
    work.mkdir()
    (work / "state.json").write_text(json.dumps({"from": 14, "to": 15, "step": "linking"}))
    os.rename(old14.pgdata / "global" / "pg_control", old14.pgdata / "global" / "pg_control.old")
    chown_tree(old14.volume)
    code, verdict, _ = _command(old14, "upgrade", old14.pgdata)
    assert code == 1
    assert "after it began linking" in str(verdict["message"])
    assert (old14.pgdata / "PG_VERSION").read_text().strip() == "14"  # untouched
    # interrupted before linking: the old data directory is intact, and still not upgraded behind anyone's back
    os.rename(old14.pgdata / "global" / "pg_control.old", old14.pgdata / "global" / "pg_control")
    code, verdict, _ = _command(old14, "upgrade", old14.pgdata)
    assert code == 1
    assert "before it began linking" in str(verdict["message"])
