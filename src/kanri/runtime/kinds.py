"""Built-in kinds operators commonly touch, as :class:`kanri.runtime.Kind` constants."""

from kanri.runtime._kinds import (
    CONFIG_MAP,
    CRD,
    DEPLOYMENT,
    EVENT,
    LEASE,
    NAMESPACE,
    POD,
    POD_DISRUPTION_BUDGET,
    PVC,
    ROLE,
    ROLE_BINDING,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
)

__all__ = [
    "CONFIG_MAP",
    "CRD",
    "DEPLOYMENT",
    "EVENT",
    "LEASE",
    "NAMESPACE",
    "POD",
    "POD_DISRUPTION_BUDGET",
    "PVC",
    "ROLE",
    "ROLE_BINDING",
    "SECRET",
    "SERVICE",
    "SERVICE_ACCOUNT",
    "STATEFUL_SET",
]
