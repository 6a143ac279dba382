"""Per-operator label sets: every key in the operator's own domain, plus ``app.kubernetes.io/name``.

Product-wide keys (``kanri.dev/cluster``) would let one operator's Service selector or clean-up match another
operator's objects of the same name: a Valkey cluster ``orders`` would be routed to by PostgreSQL's ``orders-rw`` and
its claims deleted by PostgreSQL's ``deletionPolicy: Delete``. A :class:`LabelSet` makes that impossible by
construction: its selectors always carry both the operator's owner key and its ``app.kubernetes.io/name``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kanri.runtime import Request

__all__ = ["APP_INSTANCE", "APP_NAME", "MANAGED_BY", "LabelSet"]

APP_NAME = "app.kubernetes.io/name"
APP_INSTANCE = "app.kubernetes.io/instance"
MANAGED_BY = "app.kubernetes.io/managed-by"

_DOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _check_name(text: str, what: str) -> str:
    if len(text) > 63 or not _NAME.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a valid label name or value (63 characters, alphanumeric ends)")
    return text


@dataclass(frozen=True)
class LabelSet:
    """The labels one operator puts on its children and selects them by.

    ``domain`` is the operator's own (``postgres.kanri.dev``), ``app`` its ``app.kubernetes.io/name`` value
    (``postgresql``), ``owner_key`` the name of the key that holds the owning object's name (``cluster``)::

        PG = LabelSet("postgres.kanri.dev", "postgresql")
        PG.labels("orders", instance="orders-1")
        # {"postgres.kanri.dev/cluster": "orders", "app.kubernetes.io/name": "postgresql",
        #  "app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "kanri",
        #  "postgres.kanri.dev/instance": "orders-1"}
    """

    domain: str
    app: str
    owner_key: str = "cluster"
    managed_by: str = "kanri"

    def __post_init__(self) -> None:
        if len(self.domain) > 253 or not _DOMAIN.fullmatch(self.domain):
            raise ValueError(f"label domain {self.domain!r} must be a DNS subdomain with a dot (postgres.kanri.dev)")
        _check_name(self.app, "app name")
        _check_name(self.owner_key, "owner key")
        _check_name(self.managed_by, "managed-by value")

    def key(self, name: str) -> str:
        """``<domain>/<name>``: a label or annotation key of this operator."""
        return f"{self.domain}/{_check_name(name, 'key name')}"

    @property
    def owner(self) -> str:
        """The key holding the owning object's name (``<domain>/<owner_key>``)."""
        return self.key(self.owner_key)

    def selector(self, owner: str, **extra: str) -> dict[str, str]:
        """Selects this operator's objects of ``owner`` (and ``extra``, keys in the operator's domain): never
        another operator's, whatever their names."""
        found = {self.owner: _check_name(owner, "owner name"), APP_NAME: self.app}
        for name, value in extra.items():
            found[self.key(name)] = _check_name(value, name)
        return found

    def labels(self, owner: str, **extra: str) -> dict[str, str]:
        """What to put on a child of ``owner``: :meth:`selector`'s labels plus the recommended ``instance`` and
        ``managed-by``."""
        return {**self.selector(owner, **extra), APP_INSTANCE: owner, MANAGED_BY: self.managed_by}

    def selector_text(self, owner: str, **extra: str) -> str:
        """:meth:`selector` as a ``labelSelector`` query value (``a=b,c=d``)."""
        return ",".join(f"{key}={value}" for key, value in sorted(self.selector(owner, **extra).items()))

    def matches(self, obj: Mapping[str, Any], owner: str, **extra: str) -> bool:
        """Whether ``obj`` carries every label of :meth:`selector` (so it is this operator's child of ``owner``)."""
        present = (obj.get("metadata") or {}).get("labels") or {}
        return all(present.get(key) == value for key, value in self.selector(owner, **extra).items())

    def owner_requests(self, obj: Mapping[str, Any]) -> list[Request]:
        """A ``Controller.watches`` mapper for children without an owner reference (kept data): the owner named by
        the object's labels, when they are this operator's."""
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        owner = labels.get(self.owner)
        if not owner or labels.get(APP_NAME) != self.app:
            return []
        return [Request(str(meta.get("namespace") or ""), str(owner))]
