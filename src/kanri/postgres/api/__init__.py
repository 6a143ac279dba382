"""The PostgreSQL operator's API types, one subpackage per API version.

``CUSTOM_RESOURCES`` lists every CRD the operator serves, each as the tuple of its version classes (one today);
``kanri crds`` renders them and deploy/crds/ holds the result (v1alpha1 alone). ``v1beta1`` is the next version:
``conversion`` holds both versions and the conversion between them, and ``served`` this release's pair (v1alpha1
stored, v1beta1 served), which an operator given a webhook serves (the chart's ``conversionWebhook.enabled``).
"""

from __future__ import annotations

from kanri.postgres.api import v1alpha1, v1beta1
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPooler
from kanri.runtime import CustomResource

__all__ = ["CUSTOM_RESOURCES", "v1alpha1", "v1beta1"]

CUSTOM_RESOURCES: tuple[tuple[type[CustomResource], ...], ...] = (
    (v1alpha1.PostgresCluster,),
    (v1alpha1.PostgresBackup,),
    (PostgresPooler,),
)
