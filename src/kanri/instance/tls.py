"""The instance's TLS files: the server certificate Secret's mount, copied where PostgreSQL accepts them.

The Secret (``tls.crt``, ``tls.key``, ``ca.crt``; see :mod:`kanri.postgres.tls`) is mounted read-only at
``KANRI_TLS_DIR``. PostgreSQL refuses a key file that group or others may read unless root owns it, and a Secret
volume's files are root's or the fsGroup's with wider modes, so :func:`install` copies the three files into the
private socket directory with mode 0600 (owned by the manager's user, PostgreSQL's). A renewed Secret shows up in
the mount; the next copy reports a change and the manager reloads PostgreSQL (SIGHUP re-reads the ssl files), so
renewal needs no restart. Without a mounted certificate nothing here applies (``ssl`` stays off): the instance
manager's own tests and old pods run without TLS.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from kanri.instance.config import Settings

__all__ = [
    "FILES",
    "client_env",
    "client_options",
    "enabled",
    "install",
    "installed",
    "reload_context",
    "server_context",
    "server_parameters",
]

FILES = ("tls.crt", "tls.key", "ca.crt")


def installed(settings: Settings) -> Path:
    """Where the copies live."""
    return settings.socket_dir / "tls"


def enabled(settings: Settings) -> bool:
    """True once the copies are in place (so postgresql.conf may name them)."""
    target = installed(settings)
    return settings.tls_dir is not None and all((target / name).is_file() for name in FILES)


def install(settings: Settings) -> bool:
    """Copy the mounted files (mode 0600) when they differ from the copies; True when anything changed. A mount
    missing a file changes nothing (a half-written Secret is not installed)."""
    if settings.tls_dir is None:
        return False
    try:
        wanted = {name: (settings.tls_dir / name).read_bytes() for name in FILES}
    except FileNotFoundError:
        return False
    target = installed(settings)
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    changed = False
    for name, data in wanted.items():
        path = target / name
        try:
            if path.read_bytes() == data:
                continue
        except FileNotFoundError:
            pass
        tmp = target / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
        changed = True
    return changed


def server_parameters(settings: Settings) -> dict[str, str | bool]:
    """The postgresql.conf keys that turn TLS on with the installed files."""
    target = installed(settings)
    return {
        "ssl": True,
        "ssl_cert_file": str(target / "tls.crt"),
        "ssl_key_file": str(target / "tls.key"),
        "ssl_ca_file": str(target / "ca.crt"),
        "ssl_min_protocol_version": "TLSv1.2",
    }


def client_options(settings: Settings) -> dict[str, str]:
    """libpq options for a connection to another instance (replication, pg_basebackup, pg_rewind): TLS with the
    server's name checked against the cluster's CA. Empty without TLS."""
    if not enabled(settings):
        return {}
    return {"sslmode": "verify-full", "sslrootcert": str(installed(settings) / "ca.crt")}


def client_env(settings: Settings) -> dict[str, str]:
    """:func:`client_options` as libpq environment variables, for the PostgreSQL tools run as subprocesses."""
    return {f"PG{key.upper()}": value for key, value in client_options(settings).items()}


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """An SSL context for the HTTP API with the installed certificate, or None without TLS. Renewal: a context is
    built at start; a renewed certificate is loaded into it again by :func:`reload_context`."""
    if not enabled(settings):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    reload_context(settings, context)
    return context


def reload_context(settings: Settings, context: ssl.SSLContext) -> None:
    """Load the installed certificate and key into ``context`` (new handshakes use them)."""
    target = installed(settings)
    context.load_cert_chain(str(target / "tls.crt"), str(target / "tls.key"))
