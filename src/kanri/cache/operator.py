"""The Cache operator: loads the Cache, handles deletion per ``deletionPolicy`` (kit.finalize), and runs the steps in
one pass (kit.ObjectPass). Failover itself is Sentinel's, in the pods: the operator configures, observes, routes
and records, and a Cache keeps failing over while the operator is down.

``kanri cache run`` (src/kanri/cli/cache.py) or ``python -m kanri.cache.operator --kubeconfig PATH --install-crd``
(what the Helm chart's ``cache.enabled`` runs in a pod, deploy/operator/cache/). The API rights it uses are listed
in :mod:`kanri.cache.permissions`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.cache.api import FIELD_MANAGER, FINALIZER, KIND, LABELS, Cache
from kanri.cache.metrics import CacheMetrics
from kanri.cache.steps import LAST_PRIMARY, STEPS
from kanri.runtime.kinds import (
    CONFIG_MAP,
    POD,
    PVC,
    ROLE,
    ROLE_BINDING,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
)

__all__ = ["CacheReconciler", "controller", "main", "run"]

SEVERITY = ("ChildConflict", "ChildRejected", kit.EXPANSION_REFUSED)


class CacheReconciler:
    """One Cache per reconcile: deletion by policy, else the steps (children, then what the pods report)."""

    def __init__(self, manager: kr.Manager) -> None:
        self.cache, self.client = manager.cache, manager.client
        self.events = kr.EventRecorder(self.client, component=FIELD_MANAGER)
        self.metrics = CacheMetrics(manager.registry)

    async def reconcile(self, request: kr.Request) -> kr.Result | None:
        obj = self.cache.get(KIND, request.name, request.namespace)
        if obj is None:  # gone: owned children follow by garbage collection; volumes and password per policy
            LAST_PRIMARY.drop(request.namespace, request.name)
            self.metrics.forget(request.namespace, request.name)
            return None
        return await kit.finalize(self.client, KIND, obj, FINALIZER, apply=self.apply, cleanup=self.cleanup)

    async def apply(self, obj: dict[str, Any]) -> kr.Result | None:
        ctx = kit.ObjectPass(client=self.client, cache=self.cache, events=self.events, kind=KIND, obj=obj,
                             labels=LABELS, field_manager=FIELD_MANAGER, severity=SEVERITY)  # fmt: skip
        result = await ctx.run(STEPS)
        self.metrics.observe(ctx.obj)
        return result

    async def cleanup(self, obj: dict[str, Any]) -> kr.Result | None:
        data = kit.data_of(self.cache, [PVC, SECRET], LABELS, obj)
        await kit.carry_out(kit.deletion_policy(obj), self.client, self.events, obj, data)
        return None


def controller(manager: kr.Manager) -> kr.Controller:
    """Owns the ConfigMap, Services, StatefulSet and the agents' ServiceAccount, Role and RoleBinding; pods, claims
    and the password are mapped back by label."""
    built = kr.Controller("cache", CacheReconciler(manager), for_kind=KIND)
    for kind in (CONFIG_MAP, SERVICE, STATEFUL_SET, SERVICE_ACCOUNT, ROLE, ROLE_BINDING):  # the agents' RBAC too
        built = built.owns(kind)
    for kind in (POD, PVC, SECRET):
        built = built.watches(kind, LABELS.owner_requests)
    return built


async def run(
    kubeconfig: str | None,
    *,
    install_crd: bool,
    health_port: int,
    namespaces: tuple[str, ...] = (),
    health_host: str = "127.0.0.1",
    metrics_auth: bool = False,
) -> None:
    """Run the operator until cancelled, for Caches in ``namespaces`` (empty: every namespace). Its Lease lives in
    ``POD_NAMESPACE`` (the chart sets it), else ``default``."""
    async with await kr.Client.auto(kubeconfig) as client:
        if install_crd:
            await kr.install_crd(client, Cache, field_manager=FIELD_MANAGER)
        options = kit.manager_options(
            FIELD_MANAGER,
            health_port=health_port,
            namespaces=namespaces,
            health_host=health_host,
            metrics_auth=metrics_auth,
        )
        manager = kr.Manager(client, options)
        manager.add(controller(manager))
        await manager.run()


def main() -> None:
    args = kit.operator_parser(__doc__, install_flag="--install-crd", health_port=8082).parse_args()
    kr.configure_logging(args.log_level)
    asyncio.run(run(args.kubeconfig, install_crd=args.install_crd, health_port=args.health_port,
                    namespaces=tuple(args.namespace), health_host=args.health_host,
                    metrics_auth=args.metrics_auth))  # fmt: skip


if __name__ == "__main__":
    main()
