"""What the platform allows in a cluster's pod template beyond what the API's schema refuses for everyone.

The CRD already refuses the ``system-`` priority classes and annotations that weaken a pod's security profile (CEL in
:mod:`kanri.postgres.api.v1alpha1.pod_template`). A platform may narrow the priority classes further
(``kanri run --allowed-priority-class NAME``, repeatable; Helm ``allowedPriorityClasses``): a class that could
preempt other tenants' pods is the platform's to hand out. A cluster naming another class is not refused by the API
(the list is the operator's configuration, not the schema's): its pods are built without it (the cluster's default
priority) and ``Degraded`` says ``PriorityClassNotAllowed`` with the class and the allowed ones, until the spec
changes or the platform allows it. Pure.
"""

from __future__ import annotations

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.cluster.problems import Problem

__all__ = ["REASON", "allowed_spec"]

REASON = "PriorityClassNotAllowed"


def allowed_spec(spec: PostgresClusterSpec, allowed: tuple[str, ...]) -> tuple[PostgresClusterSpec, Problem | None]:
    """``spec`` with a priority class outside ``allowed`` (empty: every class the API accepts) left out, and the
    problem to report; ``spec`` itself and None when nothing is left out."""
    template = spec.pod_template
    wanted = template.priority_class_name if template is not None else None
    if template is None or wanted is None or not allowed or wanted in allowed:
        return spec, None
    message = (f"spec.podTemplate.priorityClassName {wanted!r} is not one this platform allows "
               f"({', '.join(sorted(allowed))}); the pods run with the default priority until it names one of "
               "them or is removed")  # fmt: skip
    stripped = spec.model_copy(update={"pod_template": template.model_copy(update={"priority_class_name": None})})
    return stripped, Problem(REASON, message)
