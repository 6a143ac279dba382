"""Backup and restore MiB/s of a ``pgbench -s N`` database next to ``pg_basebackup`` + tar, and archive lag (issue 13).

    flock /tmp/kanri-bench.lock .venv/bin/python bench/backup_restore.py [--scale 50] [--runs 3]
        [--compress none,gzip] [--measure basebackup,product,lag] [--load-seconds 60] [--clients 4] [--json FILE]

Outside Kubernetes, as the integration tests run them (tests/integration/test_instance_base_backup.py,
test_instance_archiving.py, test_instance_restore.py): a real SeaweedFS (``weed mini``) and one primary
``python -m kanri.instance`` (PostgreSQL 15 from PG_BIN, as the ``postgres`` OS user when run as root) archiving
its WAL to the store through ``kanri-instance archive-wal`` / ``barman-cloud-wal-archive``. ``pgbench -i -s N``
fills it; then, ``--runs`` times each:

1. the physical limit: ``pg_basebackup -Ft -c fast`` (WAL streamed into pg_wal.tar) over TCP as the replication
   user, once per ``--compress`` value (``none``: plain tar; ``gzip``: ``--compress=gzip``), then ``tar -xf`` of the
   result into an empty directory;
2. the product's backup: ``POST /backups`` to the instance manager (barman-cloud-backup with the compression the
   manager picks), polled with ``GET /backups/{id}`` every 0.2 s until it is no longer Running; the size stored in
   the bucket is summed from an object listing of the backup's prefix;
3. the product's restore: ``barman-cloud-restore`` of that backup through :func:`kanri.instance.restore.fetch_backup`
   (the function the recovery bootstrap and the rehearsal call) into an empty directory;
4. archive lag: ``pgbench -T <load-seconds> -c <clients>`` (TPC-B), sampling every second the distance from
   ``pg_current_wal_lsn()`` to the end of ``pg_stat_archiver.last_archived_wal``'s segment (MiB) and the age of
   ``last_archived_time`` (s); after the load, the time until every segment it wrote is archived (drain).

MiB/s are the database size (the sum of ``pg_database_size`` over every database) divided by the wall time. Prints
every run, then the median and the maximum (of the seconds; the MiB/s beside them are at the median and at the
slowest run). ``--json FILE`` writes every run's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' instance helpers

import aiohttp

from kanri.instance.archive import ArchiveTarget, credentials_env
from kanri.instance.base_backup import compression_flag
from kanri.instance.restore import fetch_backup, list_backups, lsn_value
from kanri.local.seaweedfs import S3Keys, SeaweedFS, backup_tools_bin, s3_call
from tests.integration.test_instance_manager import CLUSTER, PG_BIN, Instance, Workspace, chown_tree, postmasters
from tests.support import eventually

BUCKET = "kanri-bench"
DESTINATION = f"s3://{BUCKET}/bench"
PREFIX = f"bench/{CLUSTER}"
MIB = 1024 * 1024
WAL_NAME = re.compile(r"^[0-9A-F]{24}$")

_SIZES_SCRIPT = """
import json, sys
import boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], config=Config(s3={"addressing_style": "path"}))
total, count, token = 0, 0, {}
while True:
    page = s3.list_objects_v2(Bucket=sys.argv[2], Prefix=sys.argv[3], **token)
    for item in page.get("Contents", []):
        total += item["Size"]
        count += 1
    if not page.get("IsTruncated"):
        break
    token = {"ContinuationToken": page["NextContinuationToken"]}
print(json.dumps([total, count]))
"""


def stored(store: SeaweedFS, prefix: str) -> tuple[int, int]:
    """Bytes and objects under ``prefix`` in the bucket (boto3 from the backup tools' venv, keys in its env)."""
    env = {"PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": store.keys.access_key_id,
           "AWS_SECRET_ACCESS_KEY": store.keys.secret_access_key, "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    argv = [str(backup_tools_bin() / "python"), "-c", _SIZES_SCRIPT, store.endpoint, BUCKET, prefix]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True)
    total, count = json.loads(done.stdout)
    return int(total), int(count)


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def span(begin: Any, end: Any) -> float | None:
    """Seconds between two ISO 8601 times of a backup record (whole seconds: that is what they hold)."""
    if not isinstance(begin, str) or not isinstance(end, str):
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(begin)).total_seconds()


def mib(size: int) -> float:
    return size / MIB


async def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> tuple[float, str]:
    """Run ``argv`` to completion; its wall seconds and output (stdout + stderr). Non-zero exit: RuntimeError."""
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {text[-2000:]}")
    return time.monotonic() - began, text


class Bench:
    """The store, the instance and the scratch space one benchmark runs in."""

    def __init__(self, scratch: Path, store: SeaweedFS, workspace: Workspace, instance: Instance) -> None:
        self.scratch = scratch
        self.store = store
        self.workspace = workspace
        self.instance = instance
        self.target = ArchiveTarget.model_validate(
            {"destination": DESTINATION, "endpointURL": store.endpoint, "serverName": CLUSTER}
        )
        self.db_size = 0

    def client_env(self, role: str = "superuser") -> dict[str, str]:
        """libpq's environment for PG_BIN's clients over TCP as ``role`` (the Workspace's Secret files)."""
        user = (self.workspace.secret_dir(role) / "username").read_text()
        return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PGHOST": "127.0.0.1",
                "PGPORT": str(self.instance.pg_port), "PGUSER": user, "PGPASSWORD": self.workspace.passwords[role],
                "PGDATABASE": "postgres"}  # fmt: skip

    async def one(self, sql: str) -> tuple[Any, ...]:
        [row] = await self.instance.query(sql)
        return row

    async def archived_through_now(self, timeout: float = 900) -> float:
        """Close the current segment and wait until it is archived; the seconds it took."""
        began = time.monotonic()
        [segment] = await self.one("SELECT pg_walfile_name(pg_switch_wal())")

        async def done() -> bool:
            [last] = await self.one("SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver")
            return str(last)[:24] >= str(segment)

        await eventually(done, timeout=timeout, interval=0.2)
        return time.monotonic() - began

    # --- 0: the data -------------------------------------------------------------------------------------------

    async def fill(self, scale: int) -> dict[str, Any]:
        [before] = await self.one("SELECT pg_current_wal_lsn()::text")
        seconds, _ = await run([str(PG_BIN / "pgbench"), "-i", "-s", str(scale), "-q"], self.client_env())
        [after] = await self.one("SELECT pg_current_wal_lsn()::text")
        drain = await self.archived_through_now()
        [size] = await self.one("SELECT sum(pg_database_size(oid))::bigint FROM pg_database")
        self.db_size = int(size)
        return {"scale": scale, "init_seconds": round(seconds, 1), "init_wal_mib": round(mib(lsn_value(after)
                - lsn_value(before)), 1), "archive_drain_after_init_seconds": round(drain, 1),
                "database_mib": round(mib(self.db_size), 1),
                "data_directory_mib": round(mib(tree_size(self.instance.pgdata)), 1)}  # fmt: skip

    # --- 1: the physical limit ---------------------------------------------------------------------------------

    async def basebackup(self, n: int, compress: str) -> dict[str, Any]:
        target = self.scratch / f"basebackup-{compress}-{n}"
        restored = self.scratch / f"untar-{compress}-{n}"
        try:
            argv = [str(PG_BIN / "pg_basebackup"), "-Ft", "-c", "fast", "-D", str(target)]
            if compress != "none":
                argv.append(f"--compress={compress}")
            seconds, _ = await run(argv, self.client_env("replication"))
            size = tree_size(target)
            restored.mkdir(mode=0o700)
            (restored / "pg_wal").mkdir(mode=0o700)
            method = compress.split(":")[0]  # e.g. gzip:9
            suffix = {"none": "", "gzip": ".gz", "lz4": ".lz4", "zstd": ".zst"}[method]
            flags = {"none": [], "gzip": ["-z"], "lz4": ["-I", "lz4"], "zstd": ["--zstd"]}[method]
            began = time.monotonic()
            await run(["tar", *flags, "-xf", str(target / f"base.tar{suffix}"), "-C", str(restored)])
            await run(["tar", *flags, "-xf", str(target / f"pg_wal.tar{suffix}"), "-C", str(restored / "pg_wal")])
            untar = time.monotonic() - began
            return {"measure": f"pg_basebackup ({compress})", "run": n, "backup_seconds": round(seconds, 2),
                    "backup_mib_s": round(mib(self.db_size) / seconds, 1), "stored_mib": round(mib(size), 1),
                    "restore": "tar -xf", "restore_seconds": round(untar, 2),
                    "restore_mib_s": round(mib(self.db_size) / untar, 1)}  # fmt: skip
        finally:
            shutil.rmtree(target, ignore_errors=True)
            shutil.rmtree(restored, ignore_errors=True)
            await self.archived_through_now()  # the backup's WAL and history file, before the next measurement

    # --- 2 and 3: the product's backup and restore -------------------------------------------------------------

    async def record(self, backup: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.workspace.token}"}
        url = f"{self.instance.url}/backups/{backup}"
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as answer:
            body: dict[str, Any] = await answer.json()
            if answer.status != 200:
                raise RuntimeError(f"GET /backups/{backup} answered {answer.status}: {body}")
            return body

    async def product(self, n: int) -> dict[str, Any]:
        backup = f"bench-{n}-{secrets.token_hex(3)}"
        began = time.monotonic()
        code, started = await self.instance.post_json("/backups", self.workspace.token, {"id": backup})
        if code != 202:
            raise RuntimeError(f"POST /backups answered {code}: {started}")

        async def finished() -> dict[str, Any] | None:
            body = await self.record(backup)
            return body if body["phase"] != "Running" else None

        record: dict[str, Any] = await eventually(finished, timeout=3600, interval=0.2)
        seconds = time.monotonic() - began
        if record["phase"] != "Completed":
            raise RuntimeError(f"the backup failed: {record}")
        size, objects = stored(self.store, f"{PREFIX}/base/{record['backupId']}/")
        await self.archived_through_now()

        into = self.scratch / f"barman-restore-{n}"
        keys = credentials_env(self.workspace.root / "secrets" / "backup")
        try:
            listed = time.monotonic()
            info = next(b for b in await list_backups(self.target, keys) if b.backup_id == record["backupId"])
            fetched = time.monotonic()
            await fetch_backup(self.target, info, into, keys)
            restore = time.monotonic() - fetched
            restored = tree_size(into)
        finally:
            shutil.rmtree(into, ignore_errors=True)
        return {"measure": "kanri backup (barman-cloud)", "run": n, "backup_seconds": round(seconds, 2),
                "backup_mib_s": round(mib(self.db_size) / seconds, 1), "stored_mib": round(mib(size), 1),
                "stored_objects": objects, "barman_size_mib": round(mib(record.get("sizeBytes") or 0), 1),
                "barman_begin_to_end_s": span(record.get("beginTime"), record.get("endTime")),
                "manager_start_to_end_s": span(record.get("startedAt"), record.get("completedAt")),
                "restore": "barman-cloud-restore", "list_seconds": round(fetched - listed, 2),
                "restore_seconds": round(restore, 2), "restore_mib_s": round(mib(self.db_size) / restore, 1),
                "restored_mib": round(mib(restored), 1)}  # fmt: skip

    # --- 4: archive lag under load -----------------------------------------------------------------------------

    async def archive_lag(self, n: int, seconds: int, clients: int) -> dict[str, Any]:
        await self.archived_through_now()
        [segment_size] = await self.one("SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'")
        per_log = 0x1_0000_0000 // int(segment_size)
        status = self.instance.pgdata / "pg_wal" / "archive_status"
        [start_lsn] = await self.one("SELECT pg_current_wal_lsn()::text")
        argv = [str(PG_BIN / "pgbench"), "-T", str(seconds), "-c", str(clients), "-P", "10"]
        proc = await asyncio.create_subprocess_exec(*argv, env=self.client_env(), stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        samples: list[dict[str, float]] = []
        archived_end = 0
        began = time.monotonic()
        try:
            output = asyncio.create_task(proc.communicate())
            async with await self.instance.connect() as conn:
                while not output.done():
                    cursor = await conn.execute(
                        "SELECT pg_current_wal_lsn()::text, last_archived_wal,"
                        " extract(epoch FROM clock_timestamp() - last_archived_time)::float8 FROM pg_stat_archiver"
                    )
                    row = await cursor.fetchone()
                    assert row is not None
                    current, last, age = row
                    if isinstance(last, str) and WAL_NAME.fullmatch(last):  # not a .backup or .history file
                        log, seg = int(last[8:16], 16), int(last[16:24], 16)
                        archived_end = (log * per_log + seg + 1) * int(segment_size)
                    ready = sum(1 for p in status.iterdir() if p.name.endswith(".ready"))
                    samples.append({"t": round(time.monotonic() - began, 1),
                                    "lag_mib": round(mib(max(0, lsn_value(current) - archived_end)), 2),
                                    "age_s": round(float(age or 0), 2), "ready": ready})  # fmt: skip
                    await asyncio.wait([output], timeout=1.0)
            out, _ = await output
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if not output.done():
                output.cancel()
        load = time.monotonic() - began
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"pgbench exited {proc.returncode}: {text[-2000:]}")
        [end_lsn] = await self.one("SELECT pg_current_wal_lsn()::text")
        drain = await self.archived_through_now()
        tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
        lags = [s["lag_mib"] for s in samples]
        ages = [s["age_s"] for s in samples]
        wal = mib(lsn_value(end_lsn) - lsn_value(start_lsn))
        return {"measure": "archive lag", "run": n, "tps": float(tps.group(1)) if tps else None,
                "wal_mib": round(wal, 1), "wal_mib_s": round(wal / load, 2), "samples": len(samples),
                "lag_median_mib": round(statistics.median(lags), 1), "lag_max_mib": round(max(lags), 1),
                "age_median_s": round(statistics.median(ages), 1), "age_max_s": round(max(ages), 1),
                "ready_max": max(int(s["ready"]) for s in samples), "drain_seconds": round(drain, 1),
                "series": samples}  # fmt: skip


async def started(scratch: Path, store: SeaweedFS) -> tuple[Workspace, Instance]:
    """The primary, archiving to the store, as tests/integration/test_instance_archiving.py configures it."""
    root = scratch / "instance"
    root.mkdir()
    workspace = Workspace(root)
    workspace.write_secrets()
    backup = workspace.write_backup_keys(store.keys.access_key_id, store.keys.secret_access_key)
    target = {"destination": DESTINATION, "endpointURL": store.endpoint, "serverName": CLUSTER}
    workspace.write_config({}, [f"{CLUSTER}-1"], extra={"archive": target})
    chown_tree(root)
    instance = Instance(workspace, f"{CLUSTER}-1", "primary", extra_env={
        "KANRI_BARMAN_BIN": str(backup_tools_bin()), "KANRI_BACKUP_CREDENTIALS_DIR": str(backup)})  # fmt: skip
    await instance.start()
    return workspace, instance


async def stop(instance: Instance) -> None:
    """SIGTERM to the manager (a fast shutdown of its PostgreSQL); if that hangs, kill both."""
    process = instance.process
    if process is None or process.returncode is not None:
        return
    try:
        await instance.stop(timeout=60)
    except TimeoutError:
        process.kill()
        await process.wait()
    for pid in postmasters(instance.pgdata):  # only this instance's own server
        os.kill(int(pid), signal.SIGQUIT)


def summary(rows: list[dict[str, Any]], measure: str) -> str:
    rows = [r for r in rows if r["measure"] == measure]
    if not rows:
        return ""
    lines = []
    for phase in ("backup", "restore"):
        seconds = [r[f"{phase}_seconds"] for r in rows]
        slowest = max(rows, key=lambda r: float(r[f"{phase}_seconds"]))
        rates = [r[f"{phase}_mib_s"] for r in rows]
        name = measure if phase == "backup" else f"  restore: {rows[0]['restore']}"
        lines.append(f"{name:<34} {len(rows):>4}  {statistics.median(seconds):7.2f}  {max(seconds):7.2f}  "
                     f"{statistics.median(rates):8.1f}  {slowest[f'{phase}_mib_s']:8.1f}")  # fmt: skip
    return "\n".join(lines)


async def measure(bench: Bench, args: argparse.Namespace, report: dict[str, Any],
                  emit: Callable[[dict[str, Any]], Awaitable[None]]) -> None:  # fmt: skip
    report["data"] = await bench.fill(args.scale)
    print(f"pgbench -i -s {args.scale}: {report['data']}", flush=True)
    wanted = set(args.measure.split(","))
    for compress in args.compress.split(",") if "basebackup" in wanted else ():
        for n in range(1, args.runs + 1):
            await emit(await bench.basebackup(n, compress))
    for n in range(1, args.runs + 1 if "product" in wanted else 1):
        await emit(await bench.product(n))
    for n in range(1, args.runs + 1 if "lag" in wanted else 1):
        await emit(await bench.archive_lag(n, args.load_seconds, args.clients))


def new_scratch() -> Path:
    """A temporary directory the instance user may walk into (its workspace is below it)."""
    scratch = Path(tempfile.mkdtemp(prefix="kanri-bench-backup-", dir="/var/tmp"))
    scratch.chmod(0o755)
    return scratch


async def main(args: argparse.Namespace) -> None:
    os.environ["KANRI_BARMAN_BIN"] = str(backup_tools_bin())  # barman_program() in this process (the restore)
    report: dict[str, Any] = {"command": " ".join(sys.argv), "cpus": os.cpu_count(), "runs": []}
    rows: list[dict[str, Any]] = report["runs"]

    async def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        shown = {k: v for k, v in row.items() if k != "series"}
        print(json.dumps(shown), flush=True)

    scratch = new_scratch()
    try:
        store = SeaweedFS(scratch / "seaweedfs", S3Keys("kanri-bench", secrets.token_hex(16)))
        async with store.running():

            async def bucket() -> bool:
                return await asyncio.to_thread(s3_call, store.endpoint, store.keys, "create-bucket", BUCKET) is not None

            await eventually(bucket, timeout=60, interval=0.3)
            workspace, instance = await started(scratch, store)
            try:
                await instance.wait_ready()
                bench = Bench(scratch, store, workspace, instance)
                report["barman_compression"] = compression_flag(dict(os.environ))
                report["postgres"] = (await bench.one("SELECT version()"))[0]
                await measure(bench, args, report, emit)
                wal_bytes, wal_objects = stored(store, f"{PREFIX}/wals/")
                report["wal_archive"] = {"objects": wal_objects, "stored_mib": round(mib(wal_bytes), 1)}
            finally:
                await stop(instance)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\ndatabase {report['data']['database_mib']} MiB (sum of pg_database_size), "
          f"barman compression {report['barman_compression']}, WAL in the bucket {report['wal_archive']}")  # fmt: skip
    print(f"\n{'measure':<34} {'runs':>4}  {'median':>7}  {'max':>7}  {'MiB/s':>8}  {'slowest':>8}   (seconds; MiB/s)")
    for name in dict.fromkeys(r["measure"] for r in rows if r["measure"] != "archive lag"):
        print(summary(rows, name))
    lag = [r for r in rows if r["measure"] == "archive lag"]
    if lag:
        series = [s for r in lag for s in r["series"]]
        lags = [s["lag_mib"] for s in series]
        ages = [s["age_s"] for s in series]
        tps = [r["tps"] for r in lag if r["tps"] is not None]
        print(f"\narchive lag under pgbench -T {args.load_seconds} -c {args.clients}, {len(lag)} runs, "
              f"{len(series)} one-second samples: lag median {statistics.median(lags):.1f} MiB, max {max(lags):.1f}"
              f" MiB; age of the last archived WAL median {statistics.median(ages):.1f} s, max {max(ages):.1f} s; "
              f"tps median {statistics.median(tps) if tps else 0:.0f}; WAL "
              f"{statistics.median(r['wal_mib_s'] for r in lag):.2f} MiB/s; drain after the load median "
              f"{statistics.median(r['drain_seconds'] for r in lag):.1f} s")  # fmt: skip
    if args.json is not None:
        await asyncio.to_thread(args.json.write_text, json.dumps(report, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=50, help="pgbench -i -s")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--compress", default="none,gzip",
                        help="pg_basebackup --compress values, e.g. gzip:9 (none: plain tar)")  # fmt: skip
    parser.add_argument("--measure", default="basebackup,product,lag", help="which measurements to run")
    parser.add_argument("--load-seconds", type=int, default=60, help="pgbench -T of each archive-lag run")
    parser.add_argument("--clients", type=int, default=4, help="pgbench -c of each archive-lag run")
    parser.add_argument("--json", type=Path, default=None)
    asyncio.run(main(parser.parse_args()))
