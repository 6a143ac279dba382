"""``kanri promote | restart | restore-test | hibernate | wake``: thin wrappers over the documented annotations and
fields, so that what the command does, ``kubectl annotate``/``kubectl patch`` or a GitOps commit can do too.

Each operation is a pure function from the PostgresCluster as read to the merge patch it sends (or a
:class:`Refused` saying why not), so the rules are tested without a cluster; the commands only read, patch and say
what they did.

- ``kanri promote NAME INSTANCE``: ``kanri.dev/switchover-to=INSTANCE``; while a failover is Blocked,
  ``kanri.dev/approve-failover=INSTANCE``;
- ``kanri restart NAME``: ``kanri.dev/restart=<now>``, a rolling restart, one instance at a time;
- ``kanri restore-test NAME``: ``kanri.dev/restore-test=<now>``, a restore rehearsal now;
- ``kanri hibernate NAME``: ``spec.replicas: 0``, the count kept in ``kanri.dev/hibernated-replicas``;
- ``kanri wake NAME``: ``spec.replicas`` back to the kept count (or ``--replicas``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from kanri.postgres.children.statefulset import RESTART
from kanri.postgres.ha.failover import APPROVE, SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client
from kanri.runtime._connection import ConfigError  # not re-exported by kanri.runtime; raised by from_kubeconfig

__all__ = [
    "HIBERNATED_REPLICAS",
    "RESTORE_TEST",
    "Planned",
    "Refused",
    "hibernate",
    "promote",
    "restart",
    "restore_test",
    "wake",
]

Obj = dict[str, Any]
RESTORE_TEST = "kanri.dev/restore-test"
"""Annotation on a PostgresCluster: any new value runs a restore rehearsal (see docs/backups.md)."""
HIBERNATED_REPLICAS = "kanri.dev/hibernated-replicas"
"""Annotation ``kanri hibernate`` leaves: the replica count to wake up with (kubectl users set replicas by hand)."""


@dataclass(frozen=True)
class Planned:
    """The merge patch to send and the sentence to print once it is sent."""

    patch: Obj
    done: str


@dataclass(frozen=True)
class Refused:
    """Why the operation is not sent (nothing is written)."""

    reason: str


def _annotate(key: str, value: str | None) -> Obj:
    return {"metadata": {"annotations": {key: value}}}


def _instances(cluster: Obj) -> list[str]:
    return [i["name"] for i in (cluster.get("status") or {}).get("instances") or [] if i.get("name")]


def promote(cluster: Obj, instance: str) -> Planned | Refused:
    """Make ``instance`` the primary: a switchover when the cluster is healthy; the approval of a Blocked
    failover (which then promotes it) when one waits."""
    name = cluster["metadata"]["name"]
    status = cluster.get("status") or {}
    known = _instances(cluster)
    if instance not in known:
        return Refused(f"{instance} is not an instance of {name} (instances: {', '.join(known) or 'none yet'})")
    failover = status.get("failover") or {}
    if failover.get("phase") == "Blocked":
        return Planned(_annotate(APPROVE, instance), f"approved the blocked failover of {name}: {instance} is "
                       "promoted; the possible data loss is recorded in status.lastFailover")  # fmt: skip
    if failover.get("phase"):
        return Refused(f"a failover of {name} is in progress (phase {failover['phase']}); wait for it to end")
    if status.get("currentPrimary") == instance:
        return Refused(f"{instance} is the primary of {name} already")
    namespace = cluster["metadata"].get("namespace", "default")
    return Planned(_annotate(SWITCHOVER, instance), f"asked for a switchover of {name} to {instance}; follow it "
                   f"with: kanri status {name} -n {namespace} --watch")  # fmt: skip


def restart(cluster: Obj, now: datetime) -> Planned | Refused:
    """Restart every instance, one at a time, replicas first."""
    name = cluster["metadata"]["name"]
    if int((cluster.get("spec") or {}).get("replicas", 1)) == 0:
        return Refused(f"{name} is hibernated: nothing runs to restart (kanri wake {name})")
    return Planned(_annotate(RESTART, _stamp(now)), f"asked for a rolling restart of {name}")


def restore_test(cluster: Obj, now: datetime) -> Planned | Refused:
    """Run a restore rehearsal now."""
    name = cluster["metadata"]["name"]
    if not (cluster.get("spec") or {}).get("backup"):
        return Refused(f"{name} has no spec.backup: there is no backup to rehearse a restore of")
    return Planned(_annotate(RESTORE_TEST, _stamp(now)), f"asked for a restore rehearsal of {name}; its result "
                   "goes to status.backup.lastRestoreTest")  # fmt: skip


def hibernate(cluster: Obj) -> Planned | Refused:
    """Stop every pod, keeping the volumes; the replica count is kept for :func:`wake`."""
    name = cluster["metadata"]["name"]
    replicas = int((cluster.get("spec") or {}).get("replicas", 1))
    if replicas == 0:
        return Refused(f"{name} is hibernated already")
    patch = {"metadata": {"annotations": {HIBERNATED_REPLICAS: str(replicas)}}, "spec": {"replicas": 0}}
    return Planned(patch, f"hibernating {name}: its {replicas} instance(s) stop, their volumes are kept")


def wake(cluster: Obj, replicas: int | None) -> Planned | Refused:
    """Start a hibernated cluster again with the count it had (or ``replicas``)."""
    name = cluster["metadata"]["name"]
    if int((cluster.get("spec") or {}).get("replicas", 1)) != 0:
        return Refused(f"{name} is not hibernated")
    kept = (cluster["metadata"].get("annotations") or {}).get(HIBERNATED_REPLICAS)
    count = replicas if replicas is not None else int(kept) if kept and kept.isdigit() else None
    if count is None or count < 1:
        return Refused(f"{name} has no recorded replica count ({HIBERNATED_REPLICAS}); pass --replicas N")
    patch = {"metadata": {"annotations": {HIBERNATED_REPLICAS: None}}, "spec": {"replicas": count}}
    return Planned(patch, f"waking {name} with {count} instance(s)")


def _stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- commands ----------------------------------------------------------------------------------------------------

Namespace = Annotated[str, typer.Option("--namespace", "-n", help="The cluster's namespace.")]
Kubeconfig = Annotated[Path | None, typer.Option(help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")]
Context = Annotated[str | None, typer.Option(help="kubeconfig context (default: the current one).")]
Name = Annotated[str, typer.Argument(help="The PostgresCluster.")]


async def _apply(name: str, namespace: str, kubeconfig: Path | None, context: str | None,
                 plan: Callable[[Obj], Planned | Refused]) -> Planned | Refused:  # fmt: skip
    async with await Client.from_kubeconfig(str(kubeconfig) if kubeconfig else None, context) as client:
        cluster = await client.get(POSTGRES_CLUSTER, name, namespace)
        outcome = plan(cluster)
        if isinstance(outcome, Planned):
            await client.patch(POSTGRES_CLUSTER, name, outcome.patch, namespace)
        return outcome


def _run(command: str, name: str, namespace: str, kubeconfig: Path | None, context: str | None,
         plan: Callable[[Obj], Planned | Refused]) -> None:  # fmt: skip
    try:
        outcome = asyncio.run(_apply(name, namespace, kubeconfig, context, plan))
    except ApiError as exc:
        what = f"PostgresCluster {namespace}/{name} not found" if exc.status == 404 else str(exc)
        typer.echo(f"kanri {command}: {what}", err=True)
        raise typer.Exit(1) from None
    except ConfigError as exc:
        typer.echo(f"kanri {command}: {exc}", err=True)
        raise typer.Exit(1) from None
    if isinstance(outcome, Refused):
        typer.echo(f"kanri {command}: {outcome.reason}", err=True)
        raise typer.Exit(1)
    typer.echo(outcome.done)


def promote_command(
    name: Name,
    instance: Annotated[str, typer.Argument(help="The instance to make primary (e.g. pg-2).")],
    namespace: Namespace = "default",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Make INSTANCE the primary: a switchover, or the approval of a blocked failover."""
    _run("promote", name, namespace, kubeconfig, context, lambda cluster: promote(cluster, instance))


def restart_command(name: Name, namespace: Namespace = "default", kubeconfig: Kubeconfig = None,
                    context: Context = None) -> None:  # fmt: skip
    """Restart every instance, one at a time, replicas first."""
    _run("restart", name, namespace, kubeconfig, context, lambda cluster: restart(cluster, datetime.now(UTC)))


def restore_test_command(name: Name, namespace: Namespace = "default", kubeconfig: Kubeconfig = None,
                         context: Context = None) -> None:  # fmt: skip
    """Run a restore rehearsal of the latest backup now."""
    _run("restore-test", name, namespace, kubeconfig, context, lambda cluster: restore_test(cluster, datetime.now(UTC)))


def hibernate_command(name: Name, namespace: Namespace = "default", kubeconfig: Kubeconfig = None,
                      context: Context = None) -> None:  # fmt: skip
    """Stop every instance of the cluster, keeping its volumes (and backups)."""
    _run("hibernate", name, namespace, kubeconfig, context, hibernate)


def wake_command(
    name: Name,
    replicas: Annotated[
        int | None, typer.Option(help="Instances to start (default: as many as before).", min=1)
    ] = None,
    namespace: Namespace = "default",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Start a hibernated cluster again."""
    _run("wake", name, namespace, kubeconfig, context, lambda cluster: wake(cluster, replicas))
