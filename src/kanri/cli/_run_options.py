"""The command-line options of ``kanri run``, one annotated type each, so the command's signature reads as a list."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Kubeconfig = Annotated[Path | None, typer.Option(help="kubeconfig file; in-cluster configuration when absent.")]
Namespaces = Annotated[
    list[str] | None,
    typer.Option(
        help="Watch PostgresClusters in this namespace only; repeat it to watch several (default: all namespaces)."
    ),
]
# The other operators' `kanri <operator> run` (cache, cloud, kafka) take one namespace and a kubeconfig path as text.
KubeconfigPath = Annotated[
    str | None, typer.Option("--kubeconfig", help="Kubeconfig file (default: in-cluster, then ~/.kube/config).")
]
OneNamespace = Annotated[str | None, typer.Option("--namespace", help="Watch only this namespace (default: all).")]
HealthPort = Annotated[int, typer.Option(help="Port of /healthz, /readyz and /metrics (0: any free port).")]
HealthHost = Annotated[
    str, typer.Option(help="Address /healthz, /readyz and /metrics listen on; 0.0.0.0 in a pod (kubelet probes).")
]
MetricsAuth = Annotated[
    bool,
    typer.Option(
        help="Serve /metrics only to bearer tokens the API server authenticates and allows get on /metrics "
        "(TokenReview + SubjectAccessReview); /healthz and /readyz stay open."
    ),
]
LeaderElection = Annotated[
    bool, typer.Option(help="Run only while holding the Lease, so replicas of the operator can stand by.")
]
LeaderElectionNamespace = Annotated[
    str | None, typer.Option(help="Namespace of the Lease (default: the operator's own namespace).")
]
LogLevel = Annotated[str, typer.Option(help="debug, info, warning or error.")]
DefaultBackupRepository = Annotated[
    Path | None,
    typer.Option(
        help="YAML file of the platform's default S3 repository (the fields of backup.repository.s3; "
        "its credentialsSecret in the operator's namespace), used by clusters that name none."
    ),
]
AllowedBackupEndpoints = Annotated[
    list[str] | None,
    typer.Option(
        help="An S3 endpoint clusters may name in spec.backup.repository or bootstrap.recovery.repository: a URL "
        "(scheme, host and port must match) or a host[:port]; repeat it for several. Without any: every endpoint "
        "(the operator then sends signed requests wherever a tenant points it). The default repository's "
        "endpoint is always allowed."
    ),
]
AllowedPriorityClasses = Annotated[
    list[str] | None,
    typer.Option(
        help="A PriorityClass a cluster's spec.podTemplate.priorityClassName may name; repeat it for several. "
        "Without any: every class the API accepts (the system- ones never). A cluster naming another runs "
        "without it and says PriorityClassNotAllowed."
    ),
]
BackupClockOffsetFile = Annotated[
    Path | None,
    typer.Option(
        hidden=True,
        help='Test hook: a file holding seconds added to "now" for base backups\' schedule and retention '
        "(read at every use; missing or unreadable: 0). Never in production.",
    ),
]
NodeMonitorGrace = Annotated[
    float,
    typer.Option(
        min=1.0,
        help="Seconds the cluster's node lifecycle controller waits before it marks a silent node Ready=Unknown "
        "(kube-controller-manager --node-monitor-grace-period; upstream 40-50 s). A failover after an operator "
        "outage measures the replicas' evidence against it; never set it above the real value (the default, 20, "
        "is the shortest in use: safe, but then an outage longer than ~12 s may still ask for approval).",
    ),
]
