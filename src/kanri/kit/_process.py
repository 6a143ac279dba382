"""The command line of an operator's process, as the Helm chart's Deployments run them (``python -m
kanri.<operator>.operator``): one set of flags for every operator on the kit."""

from __future__ import annotations

import argparse
import os

from kanri.runtime import ManagerOptions

__all__ = ["manager_options", "operator_parser"]


def operator_parser(description: str | None, *, install_flag: str, health_port: int) -> argparse.ArgumentParser:
    """``--kubeconfig``, ``install_flag`` (install the operator's CRDs first), ``--health-port``, ``--namespace``
    (repeated: only these namespaces, the chart's watchNamespaces), ``--health-host`` (``0.0.0.0`` in a pod: the
    kubelet probes the pod's IP), ``--[no-]metrics-auth`` (/metrics only for tokens the API server authenticates and
    allows ``get`` on /metrics) and ``--log-level``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--kubeconfig")
    parser.add_argument(install_flag, action="store_true")
    parser.add_argument("--health-port", type=int, default=health_port)
    parser.add_argument("--namespace", action="append", default=[])
    parser.add_argument("--health-host", default="127.0.0.1")
    parser.add_argument("--metrics-auth", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def manager_options(
    name: str,
    *,
    health_port: int,
    namespace: str | None = None,
    namespaces: tuple[str, ...] = (),
    health_host: str = "127.0.0.1",
    metrics_auth: bool = False,
) -> ManagerOptions:
    """The manager of an operator's process: leader election with its Lease in ``POD_NAMESPACE`` (the chart sets
    it), else ``default``, so further replicas stand by."""
    return ManagerOptions(name=name, health_port=health_port, namespace=namespace, namespaces=namespaces,
                          health_host=health_host, metrics_auth=metrics_auth,
                          leader_election_namespace=os.environ.get("POD_NAMESPACE") or "default")  # fmt: skip
