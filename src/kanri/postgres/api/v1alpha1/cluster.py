"""The PostgresCluster resource: API coordinates, printer columns and the rules on the whole object."""

from __future__ import annotations

from pydantic import ConfigDict

from kanri.postgres.api.v1alpha1._base import reflow_descriptions
from kanri.postgres.api.v1alpha1.spec import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.status import PostgresClusterStatus
from kanri.runtime import CustomResource, PrinterColumn, cel

__all__ = ["MAX_NAME_LENGTH", "PostgresCluster"]

MAX_NAME_LENGTH = 40
"""Pods, Services (<name>-rw, -ro, -r), claims and Jobs are named after the cluster and must stay valid names."""


class PostgresCluster(
    CustomResource,
    group="kanri.dev",
    version="v1alpha1",
    kind="PostgresCluster",
    plural="postgresclusters",
    short_names=("pgc",),
    categories=("kanri",),
    printer_columns=(
        PrinterColumn("Version", ".spec.version", type="integer", description="PostgreSQL major version"),
        PrinterColumn("Replicas", ".spec.replicas", type="integer", description="Desired number of instances"),
        PrinterColumn("Ready", ".status.readyReplicas", type="integer", description="Instances accepting connections"),
        PrinterColumn("Primary", ".status.currentPrimary", description="The instance that is primary now"),
        PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
    ),
    validations=[
        # Service names must be DNS-1035 labels (start with a letter), and children append suffixes to the name.
        cel(
            f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && "
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            message_expression=f'\'name "%s" must start with a letter, contain only lower case letters, digits and '
            f'"-", and have at most {MAX_NAME_LENGTH} characters: Services and pods are named after the '
            "cluster'.format([self.metadata.name])",
        ),
    ],
):
    """A PostgreSQL cluster managed by kanri: one primary, streaming replicas, their volumes and backups. The
    operator keeps pods, volumes, Services (<name>-rw for writes, <name>-ro for replicas, <name>-r for any) and
    backups in line with spec, and reports what it observes in status."""

    model_config = ConfigDict(json_schema_extra=reflow_descriptions)

    spec: PostgresClusterSpec
    status: PostgresClusterStatus | None = None
