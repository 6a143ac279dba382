"""The instance manager's inputs: settings from the environment, the cluster config file, credentials.

Everything the operator tells a pod arrives here: plain settings as environment variables (read once, at start) and
the cluster-wide ``instance.json`` from a ConfigMap (re-read while running). The Secret files are read and checked
in :mod:`kanri.instance.credentials`. Nothing in this module talks to PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kanri.contract.instance_config import ClusterConfig, UpgradeNote
from kanri.contract.roles import SUPERUSER

__all__ = ["SUPERUSER", "Bootstrap", "ClusterConfig", "Credentials", "Settings", "SettingsError", "UpgradeNote"]

Bootstrap = Literal["primary", "replica"]


class SettingsError(ValueError):
    """The environment does not describe a runnable instance (a missing or malformed variable)."""


@dataclass(frozen=True)
class Settings:
    """Where things are and who this instance is; see docs/instance-manager.md for each variable."""

    cluster: str
    name: str
    namespace: str
    pod_ip: str
    pgdata: Path
    pg_bin: Path | None
    """``KANRI_PG_BIN``; None: the programs are found on ``PATH`` (an image that puts its binaries there)."""
    bootstrap: Bootstrap
    primary_host: str
    primary_port: int
    superuser_dir: Path
    replication_dir: Path
    app_dir: Path
    app_database: str
    token_file: Path
    config_file: Path
    pg_port: int
    http_port: int
    pg_listen: str
    http_listen: str
    socket_dir: Path
    config_interval: float = 2.0
    tls_dir: Path | None = None
    """The mounted server certificate Secret (``KANRI_TLS_DIR``); None: no TLS (see :mod:`kanri.instance.tls`)."""

    @property
    def passfile(self) -> Path:
        """The libpq password file for replication connections: in the private socket directory, so it is neither on
        the data volume nor copied by pg_basebackup."""
        return self.socket_dir / "kanri.pgpass"

    def binary(self, program: str) -> str:
        """The path of one PostgreSQL program (``postgres``, ``initdb``, ...)."""
        if self.pg_bin is None:
            return shutil.which(program) or program
        return str(self.pg_bin / program)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``env`` (default: ``os.environ``); raises SettingsError naming the first bad variable."""
        env = os.environ if env is None else env

        def required(key: str) -> str:
            value = env.get(key, "").strip()
            if not value:
                raise SettingsError(f"{key} must be set")
            return value

        def port(key: str, default: int) -> int:
            raw = env.get(key, "").strip() or str(default)
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise SettingsError(f"{key} must be a TCP port, not {raw!r}")
            return int(raw)

        bootstrap = env.get("KANRI_BOOTSTRAP", "primary").strip() or "primary"
        if bootstrap not in ("primary", "replica"):
            raise SettingsError(f"KANRI_BOOTSTRAP must be 'primary' or 'replica', not {bootstrap!r}")
        listen = env.get("KANRI_LISTEN_ADDRESS", "").strip()
        name = required("POD_NAME")
        return cls(
            cluster=required("KANRI_CLUSTER"),
            name=name,
            namespace=env.get("POD_NAMESPACE", ""),
            pod_ip=env.get("POD_IP", ""),
            pgdata=Path(env.get("PGDATA") or "/var/lib/postgresql/data/pgdata"),
            pg_bin=Path(env["KANRI_PG_BIN"]) if env.get("KANRI_PG_BIN", "").strip() else None,
            bootstrap=bootstrap,  # type: ignore[arg-type]  # checked just above
            primary_host=env.get("KANRI_PRIMARY_HOST", "").strip() or f"{required('KANRI_CLUSTER')}-rw",
            primary_port=port("KANRI_PRIMARY_PORT", 5432),
            superuser_dir=Path(env.get("KANRI_SUPERUSER_DIR") or "/etc/kanri/superuser"),
            replication_dir=Path(env.get("KANRI_REPLICATION_DIR") or "/etc/kanri/replication"),
            app_dir=Path(env.get("KANRI_APP_DIR") or "/etc/kanri/app"),
            app_database=env.get("KANRI_APP_DATABASE", "").strip() or "app",
            token_file=Path(env.get("KANRI_API_TOKEN_FILE") or "/etc/kanri/api/token"),
            config_file=Path(env.get("KANRI_CONFIG_FILE") or "/etc/kanri/config/instance.json"),
            pg_port=port("KANRI_PG_PORT", 5432),
            http_port=port("KANRI_HTTP_PORT", 8008),
            pg_listen=listen or "*",
            http_listen=listen or "0.0.0.0",
            socket_dir=Path(env.get("KANRI_SOCKET_DIR") or "/var/run/postgresql"),
            tls_dir=Path(env["KANRI_TLS_DIR"]) if env.get("KANRI_TLS_DIR", "").strip() else None,
        )


@dataclass(frozen=True)
class Credentials:
    """A username and password from a kubernetes.io/basic-auth Secret. The password never shows in ``repr``."""

    username: str
    password: str = field(repr=False)
