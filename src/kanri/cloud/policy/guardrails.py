"""The platform team's guardrails (DatabaseClass.spec.guardrails) against what an instance asks for. Pure: every
broken rule is named, so ``kubectl describe`` says which rule to satisfy."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kanri.cloud.api import DatabaseClassSpec, DatabaseInstanceSpec

__all__ = ["Violation", "check", "class_region", "class_sizes"]


@dataclass(frozen=True)
class Violation:
    rule: str
    """The guardrail's field name (allowedSizes, allowedRegions, ...)."""
    message: str


def class_region(cls: DatabaseClassSpec) -> str:
    """The class profile's default region."""
    if cls.provider == "aws" and cls.aws is not None:
        return cls.aws.region
    return cls.kanri.region if cls.kanri is not None else "local"


def class_sizes(cls: DatabaseClassSpec) -> set[str]:
    """The size names the class profile maps."""
    if cls.provider == "aws" and cls.aws is not None:
        return set(cls.aws.sizes)
    return set(cls.kanri.sizes) if cls.kanri is not None else set()


def _cidrs_within(asked: list[str], allowed: list[str]) -> list[str]:
    """The asked ranges that lie in none of the allowed ones (or are not ranges at all)."""
    networks = [ipaddress.ip_network(cidr, strict=False) for cidr in allowed]
    outside = []
    for cidr in asked:
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            outside.append(cidr)
            continue
        if not any(network.version == a.version and network.subnet_of(a) for a in networks):  # type: ignore[arg-type]
            outside.append(cidr)
    return outside


def _private_only(asked: list[str]) -> list[str]:
    bad = []
    for cidr in asked:
        try:
            if not ipaddress.ip_network(cidr, strict=False).is_private:
                bad.append(cidr)
        except ValueError:
            bad.append(cidr)
    return bad


def check(spec: DatabaseInstanceSpec, cls: DatabaseClassSpec) -> list[Violation]:
    """Every guardrail ``spec`` breaks, in a fixed order."""
    rails, found = cls.guardrails, []
    sizes = set(rails.allowed_sizes) or class_sizes(cls)
    if spec.size not in sizes:
        found.append(Violation("allowedSizes", f"size {spec.size!r} is not allowed by class (allowed: "
                                               f"{', '.join(sorted(sizes)) or 'none'})"))  # fmt: skip
    region = spec.region or class_region(cls)
    regions = set(rails.allowed_regions) or {class_region(cls)}
    if region not in regions:
        found.append(Violation("allowedRegions", f"region {region!r} is not allowed (allowed: "
                                                 f"{', '.join(sorted(regions))})"))  # fmt: skip
    if spec.backup_retention_days < rails.min_backup_retention_days:
        found.append(Violation("minBackupRetentionDays", f"backupRetentionDays {spec.backup_retention_days} is "
                               f"below the class's minimum of {rails.min_backup_retention_days}"))  # fmt: skip
    if spec.network.access == "Public" and not rails.allow_public_access:
        found.append(Violation("allowPublicAccess", "network.access Public is not allowed by the class"))
    outside = (_cidrs_within(spec.network.allowed_cidrs, rails.allowed_cidrs) if rails.allowed_cidrs
               else [] if rails.allow_public_access else _private_only(spec.network.allowed_cidrs))  # fmt: skip
    if outside:
        found.append(Violation("allowedCidrs", f"network.allowedCidrs {', '.join(outside)} lie outside what the "
                                               "class allows"))  # fmt: skip
    if spec.deletion_policy == "Delete" and not rails.allow_deletion_policy_delete:
        found.append(Violation("allowDeletionPolicyDelete", "deletionPolicy Delete is not allowed by the class"))
    return found
