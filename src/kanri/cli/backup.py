"""``kanri backup NAME [-n NAMESPACE] [--name BACKUP] [--wait]``: a base backup now, as a kubectl user would ask for
one — by creating a PostgresBackup whose ``spec.cluster`` is NAME (``kubectl create -f`` of the same object does
the same). With ``--wait`` the command follows the backup's status until it is Completed (exit 0) or Failed (exit 1).

:func:`plan` is pure (the cluster as read → the object to create, or why not), so its rules are tested without a
cluster; the command only reads, creates, and watches the status.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from kanri.cli.operations import Context, Kubeconfig, Name, Namespace, Refused
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client
from kanri.runtime._connection import ConfigError  # not re-exported by kanri.runtime; raised by from_kubeconfig

__all__ = ["backup_command", "plan"]

Obj = dict[str, Any]
POLL = 1.0


def plan(cluster: Obj, now: datetime, name: str | None = None) -> Obj | Refused:
    """The PostgresBackup to create for ``cluster`` (named ``name``, default ``<cluster>-<yyyymmddhhmmss>``)."""
    meta = cluster["metadata"]
    if not (cluster.get("spec") or {}).get("backup"):
        return Refused(f"{meta['name']} has no spec.backup: there is no repository to back up into")
    if meta.get("deletionTimestamp"):
        return Refused(f"{meta['name']} is being deleted")
    backup = name or f"{meta['name']}-{now.astimezone(UTC):%Y%m%d%H%M%S}"
    metadata = {"name": backup, "namespace": meta["namespace"]}
    return {"apiVersion": POSTGRES_BACKUP.api_version, "kind": POSTGRES_BACKUP.kind, "metadata": metadata,
            "spec": {"cluster": meta["name"]}}  # fmt: skip


def _describe(status: Obj) -> str:
    phase = status.get("phase") or "Pending"
    why = status.get("message") or status.get("reason") or ""
    return f"{phase}: {why}" if why else phase


async def _backup(name: str, namespace: str, kubeconfig: Path | None, context: str | None, backup: str | None,
                  wait: bool, timeout: float) -> int:  # fmt: skip
    async with await Client.from_kubeconfig(str(kubeconfig) if kubeconfig else None, context) as client:
        try:
            cluster = await client.get(POSTGRES_CLUSTER, name, namespace)
        except ApiError as exc:
            if exc.status == 404:
                typer.echo(f"kanri backup: PostgresCluster {namespace}/{name} not found", err=True)
                return 1
            raise
        wanted = plan(cluster, datetime.now(UTC), backup)
        if isinstance(wanted, Refused):
            typer.echo(f"kanri backup: {wanted.reason}", err=True)
            return 1
        created = await client.create(POSTGRES_BACKUP, wanted)
        made = created["metadata"]["name"]
        typer.echo(f"created PostgresBackup {namespace}/{made} (kubectl get pgbackup {made} -n {namespace})")
        if not wait:
            return 0
        deadline, said = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            status = (await client.get(POSTGRES_BACKUP, made, namespace)).get("status") or {}
            if (line := _describe(status)) != said:
                typer.echo(line)
                said = line
            if status.get("phase") == "Completed":
                size = status.get("sizeBytes")
                typer.echo(f"backup {status.get('backupId')} completed" + (
                    f" ({size / 1048576:.1f} MiB)" if isinstance(size, int) else ""))  # fmt: skip
                return 0
            if status.get("phase") == "Failed":
                return 1
            await asyncio.sleep(POLL)
        typer.echo(f"kanri backup: {made} did not finish within {timeout:.0f} s (it goes on)", err=True)
        return 2


def backup_command(
    name: Name,
    namespace: Namespace = "default",
    backup: Annotated[
        str | None, typer.Option("--name", help="Name of the PostgresBackup (default: <cluster>-<yyyymmddhhmmss>).")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the backup until it completed (exit 0) or failed (exit 1).")
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="With --wait: give up waiting after this many seconds (exit 2).", min=1)
    ] = 3600.0,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Take a base backup of the cluster now (creates a PostgresBackup)."""
    try:
        code = asyncio.run(_backup(name, namespace, kubeconfig, context, backup, wait, timeout))
    except (ApiError, ConfigError) as exc:
        typer.echo(f"kanri backup: {exc}", err=True)
        raise typer.Exit(1) from None
    if code:
        raise typer.Exit(code)
