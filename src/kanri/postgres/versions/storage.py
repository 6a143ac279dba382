"""Which version the API server stores PostgresClusters, PostgresBackups and PostgresPoolers in: the second step of a
version change.

docs/runtime-versions.md's release rule: a release that *adds* a version keeps the old storage version, and storage
switches only once every replica knows both versions. This release carries both steps and lets the platform team
take the second when it is ready: ``KANRI_STORAGE_VERSION`` (the chart's ``conversionWebhook.storageVersion``)
``v1alpha1`` (the default: v1beta1 only served) or ``v1beta1`` (stored; the leader's storage migration rewrites every
object and prunes ``status.storedVersions``). Setting it back to ``v1alpha1`` migrates every object back, which is
what makes a downgrade to the release before (v1alpha1 alone) possible.

Turning the webhook off is refused while the API server may still hold objects in v1beta1: the CRD could not drop
v1beta1 (the API server refuses a CRD whose ``storedVersions`` names a version it no longer has), and an operator
that cannot write its CRD must say why instead of failing on a 422.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from kanri.postgres.api.conversion import POSTGRES
from kanri.postgres.api.served import SERVED
from kanri.runtime import Conversions

__all__ = [
    "STORAGE_VERSIONS",
    "STORAGE_VERSION_ENV",
    "StorageVersionRefused",
    "check_single_version",
    "versions_from_environment",
]

STORAGE_VERSION_ENV = "KANRI_STORAGE_VERSION"
"""``v1alpha1`` or ``v1beta1``: the version the API server stores in while the conversion webhook is served."""

STORAGE_VERSIONS: Mapping[str, Conversions] = {"v1alpha1": SERVED, "v1beta1": POSTGRES}
"""Each storage version this release can run with, and the versions (models and conversions) it then serves."""

Obj = dict[str, Any]


class StorageVersionRefused(RuntimeError):
    """The operator's settings and what the API server stores do not fit together; the message says what to do."""


def versions_from_environment(environ: Mapping[str, str] | None = None) -> Conversions:
    """The served versions for ``KANRI_STORAGE_VERSION`` (unset or empty: ``v1alpha1``, this release's default)."""
    env = os.environ if environ is None else environ
    chosen = env.get(STORAGE_VERSION_ENV) or "v1alpha1"
    if chosen not in STORAGE_VERSIONS:
        raise StorageVersionRefused(
            f"{STORAGE_VERSION_ENV}={chosen!r}: the storage version must be one of {', '.join(STORAGE_VERSIONS)}"
        )
    return STORAGE_VERSIONS[chosen]


def check_single_version(installed: Sequence[Obj]) -> None:
    """Refuse to replace two-version CRDs by v1alpha1 alone while any of them lists another stored version.

    ``installed`` are the CRDs as the API server has them now (absent ones left out)."""
    for crd in installed:
        stored = [v for v in ((crd.get("status") or {}).get("storedVersions") or []) if v != "v1alpha1"]
        if stored:
            name = crd["metadata"]["name"]
            raise StorageVersionRefused(
                f"CRD {name} has objects stored in {', '.join(stored)} (status.storedVersions); an operator without "
                f"the conversion webhook serves v1alpha1 alone and cannot take the CRD back to it. Run the operator "
                f"with the webhook and {STORAGE_VERSION_ENV}=v1alpha1 (chart: conversionWebhook.enabled=true, "
                f"conversionWebhook.storageVersion=v1alpha1) until its storage migration has brought storedVersions "
                f"back to [v1alpha1], then turn the webhook off; see docs/helm.md, 'Serving v1beta1'."
            )
