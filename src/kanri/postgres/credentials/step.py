"""The step that keeps a cluster's credential Secrets (see :mod:`kanri.postgres.credentials.secrets`): generated
once when missing, adopted as they are when they exist, checked against the contract every pass."""

from __future__ import annotations

from typing import Protocol

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.cluster.problems import Problem, secret_problems
from kanri.postgres.context import ClusterStep
from kanri.postgres.credentials.secrets import desired_secrets
from kanri.runtime import ApiError, Kind
from kanri.runtime.kinds import SECRET

__all__ = ["ensure", "owner", "problems"]


class Pass(ClusterStep, Protocol):
    """What the credentials step needs from the reconcile pass."""

    @property
    def spec(self) -> PostgresClusterSpec: ...

    def rejected(self, kind: Kind, name: str, exc: ApiError) -> None: ...


def owner(spec: PostgresClusterSpec) -> str:
    """The application's database owner: ``bootstrap.initdb.owner``, else ``app``."""
    return spec.bootstrap.initdb.owner if spec.bootstrap.initdb else "app"


async def ensure(step: Pass) -> None:
    """Generate each missing credential Secret once; an existing one is adopted as it is."""
    for wanted in desired_secrets(step.name, owner(step.spec)):
        if step.cache.get(SECRET, wanted.name, step.namespace) is not None:
            continue
        try:
            await step.client.create(SECRET, wanted.build(step.name, step.namespace))
        except ApiError as exc:
            if exc.status != 409:
                step.rejected(SECRET, wanted.name, exc)
            continue  # exists, the cache had not seen it yet: adopted, never overwritten
        await step.events.normal(step.cluster, "CreatedSecret", f"generated Secret {wanted.name}")


def problems(step: Pass) -> list[Problem]:
    """Every adopted credential Secret against the contract (from the cache: costs no request)."""
    wanted = [s.name for s in desired_secrets(step.name, owner(step.spec))]
    found = {name: step.cache.get(SECRET, name, step.namespace) for name in wanted}
    return secret_problems(step.name, found, owner(step.spec))
