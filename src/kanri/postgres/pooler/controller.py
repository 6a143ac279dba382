"""The PostgresPooler reconciler: one pass per pooler, reading like the procedure.

No finalizer: every child is owned by the pooler and goes with it (garbage collection); the lookup role stays in
the cluster (other poolers of the cluster use it; it can only read ordinary roles' verifiers). Status is written once
per pass (``kit.ObjectPass``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from kanri import kit
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPoolerSpec
from kanri.postgres.kinds import POSTGRES_CLUSTER, POSTGRES_POOLER
from kanri.postgres.pooler import names, readiness, steps
from kanri.runtime import Cache, Client, Controller, ControllerOptions, EventRecorder, Kind, Request, Result
from kanri.runtime.kinds import CONFIG_MAP, DEPLOYMENT, SECRET, SERVICE

__all__ = ["FIELD_MANAGER", "OWNED", "POSTGRES_POOLER", "PostgresPoolerReconciler", "pooler_controller"]

Obj = dict[str, Any]
FIELD_MANAGER = "kanri-postgres-pooler"
OWNED: tuple[Kind, ...] = (DEPLOYMENT, SERVICE, CONFIG_MAP, SECRET)
SEVERITY = ("ChildConflict", "ChildRejected")
RECHECK = 30.0
"""A Ready pooler is looked at again this often (certificate renewal; everything else wakes it by a watch)."""


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _database(cluster: Obj) -> str:
    initdb = (((cluster.get("spec") or {}).get("bootstrap") or {}).get("initdb")) or {}
    return str(initdb.get("database") or "app")


class PostgresPoolerReconciler:
    """Auth Secret → certificate → lookup role on the primary → children → status."""

    def __init__(self, cache: Cache, client: Client, *, instances: steps.PoolerRoleClient, events: EventRecorder,
                 now: Callable[[], dt.datetime] = _utc_now) -> None:  # fmt: skip
        self.cache, self.client, self.instances, self.events, self.now = cache, client, instances, events, now

    async def reconcile(self, request: Request) -> Result | None:
        obj = self.cache.get(POSTGRES_POOLER, request.name, request.namespace)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None  # gone or going: its children follow by owner reference
        ctx = kit.ObjectPass(client=self.client, cache=self.cache, events=self.events, kind=POSTGRES_POOLER, obj=obj,
                             labels=names.LABELS, field_manager=FIELD_MANAGER, severity=SEVERITY)  # fmt: skip
        spec = PostgresPoolerSpec.model_validate(obj.get("spec") or {})
        status = obj.get("status") or {}
        cluster = self.cache.get(POSTGRES_CLUSTER, spec.cluster, ctx.namespace)
        confirmed = status.get("authSecretVersion")
        wanted: str | None = None
        cert: bytes | None = None
        digest = status.get("configHash")
        deployment: Obj | None = None
        if cluster is not None:
            # the lookup role's password first: the pods' auth file and the primary's role both come from it
            secret = await steps.ensure_auth_secret(ctx)
            wanted = steps.role_version(secret, cluster)
            # the certificate clients verify, from the cluster's CA
            cert = await steps.ensure_tls(ctx, spec.cluster, self.now())
            # the role PgBouncer logs in as, on the primary, whenever the Secret is new or changed
            if steps.cluster_ready(cluster):
                confirmed = await steps.ensure_role(ctx, self.instances, cluster, secret, confirmed, _database(cluster))
            # PgBouncer's pods only once they can start: a certificate and an auth file to read
            if cert is not None and secret is not None:
                digest = await steps.ensure_children(ctx, spec, cert, steps.auth_version(secret) or "",
                                                     _database(cluster))  # fmt: skip
            deployment = ctx.cache.get(DEPLOYMENT, names.deployment(ctx.name), ctx.namespace)
        ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        confirmed_now = wanted is not None and confirmed == wanted
        seen = readiness.Observed(cluster=spec.cluster, cluster_exists=cluster is not None,
                                  cluster_ready=steps.cluster_ready(cluster), ca_available=cert is not None,
                                  auth_confirmed=confirmed_now, wanted=spec.instances, ready=ready)  # fmt: skip
        verdict = readiness.decide(seen)
        ctx.ledger.condition("Ready", verdict.ready, verdict.reason, verdict.message)
        ctx.ledger.stage("instances", spec.instances)
        ctx.ledger.stage("readyInstances", ready)
        ctx.ledger.stage("service", names.service(ctx.name))
        ctx.ledger.stage("authSecretVersion", confirmed)
        ctx.ledger.stage("configHash", digest)
        ctx.requeue(RECHECK if verdict.ready else 5.0)
        return await ctx.finish()


def pooler_controller(cache: Cache, reconciler: PostgresPoolerReconciler, *, max_concurrent_reconciles: int = 2
                      ) -> Controller:  # fmt: skip
    """Woken by its own children and by its cluster (ready now? a new primary?) and the cluster's CA Secret."""
    controller = Controller("postgrespooler", reconciler, for_kind=POSTGRES_POOLER,
                            options=ControllerOptions(max_concurrent_reconciles=max_concurrent_reconciles,
                                                      log_name_key="pooler"))  # fmt: skip
    for kind in OWNED:
        controller.owns(kind)

    def poolers_of(obj: Obj) -> list[Request]:
        meta = obj["metadata"]
        name = meta["name"] if obj.get("kind") == POSTGRES_CLUSTER.kind else (meta.get("labels") or {}).get(
            "kanri.dev/cluster")  # fmt: skip
        return [Request(p["metadata"]["namespace"], p["metadata"]["name"])
                for p in cache.list(POSTGRES_POOLER, meta.get("namespace"))
                if (p.get("spec") or {}).get("cluster") == name]  # fmt: skip

    controller.watches(POSTGRES_CLUSTER, poolers_of)
    controller.watches(SECRET, poolers_of)  # the cluster's CA: a renewed one reissues the pooler's certificate
    return controller
