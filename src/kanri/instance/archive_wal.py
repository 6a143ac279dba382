"""``kanri-instance archive-wal %p``: PostgreSQL's ``archive_command``. It reads where WAL goes from the cluster
config (``instance.json``) and the key pair from the mounted repository Secret, ships one segment with
``barman-cloud-wal-archive`` (built by :mod:`kanri.instance.archive`), and exits with barman's code. It runs as a
process of its own, apart from the manager and its state."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from kanri.instance.archive import DEFAULT_CREDENTIALS_DIR, credentials_env, wal_archive_argv
from kanri.instance.config import ClusterConfig

ARCHIVE_TIMEOUT = 60.0
"""Seconds one segment may take by default (measured: 0.4-1.1 s; ``KANRI_ARCHIVE_TIMEOUT`` overrides it): barman's S3
client would otherwise retry an unreachable store for minutes while PostgreSQL reports nothing."""


def archive_wal(wal_path: str, env: Mapping[str, str] | None = None) -> int:
    """Ship ``wal_path`` (``%p``, relative to PGDATA, PostgreSQL's working directory) to the cluster's repository;
    the exit code PostgreSQL gets. Messages go to stderr, i.e. PostgreSQL's log; no secret is ever in them."""
    env = os.environ if env is None else env
    config_file = Path(env.get("KANRI_CONFIG_FILE") or "/etc/kanri/config/instance.json")
    try:
        target = ClusterConfig.parse(config_file.read_bytes()).archive
    except (OSError, ValueError) as exc:
        print(f"kanri archive-wal: cannot read the cluster config: {exc}", file=sys.stderr)
        return 1
    if target is None:
        print("kanri archive-wal: no backup repository is configured; keeping the segment", file=sys.stderr)
        return 1
    directory = Path(env.get("KANRI_BACKUP_CREDENTIALS_DIR") or DEFAULT_CREDENTIALS_DIR)
    try:
        secrets = credentials_env(directory, target.region)
    except OSError as exc:
        print(f"kanri archive-wal: repository credentials unreadable: {exc.strerror} ({directory})", file=sys.stderr)
        return 1
    argv = wal_archive_argv(target, wal_path, env)
    timeout = float(env.get("KANRI_ARCHIVE_TIMEOUT") or ARCHIVE_TIMEOUT)
    try:
        # bounded: an unreachable store must show as a failure (pg_stat_archiver, the condition), not a silent hang
        return subprocess.run(argv, env={**env, **secrets}, stdin=subprocess.DEVNULL, check=False,
                              timeout=timeout).returncode  # fmt: skip
    except subprocess.TimeoutExpired:
        print(f"kanri archive-wal: {wal_path} not archived within {timeout:.0f}s (is the object store "
              "reachable?); keeping the segment", file=sys.stderr)  # fmt: skip
        return 1
    except OSError as exc:
        print(f"kanri archive-wal: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 1
