"""``kanri cloud run``: run the cloud-resource operator (DatabaseInstance, DatabaseClass; docs/cloud.md)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from kanri.cli import _run_options as opts
from kanri.cloud.operator import run as run_operator
from kanri.runtime import configure_logging

app = typer.Typer(no_args_is_help=True, help="The cloud-resource operator (DatabaseInstance on RDS or kanri).")


@app.command("run")
def run(
    kubeconfig: opts.KubeconfigPath = None,
    namespace: opts.OneNamespace = None,
    health_port: Annotated[int, typer.Option(help="Port of /healthz, /readyz and /metrics.")] = 8083,
    install_crds: Annotated[
        bool, typer.Option(help="Apply the DatabaseInstance and DatabaseClass CRDs first (development clusters).")
    ] = False,
    leader_election: Annotated[bool, typer.Option(help="Run only while holding the Lease.")] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the cloud operator until SIGTERM or SIGINT."""
    configure_logging(log_level)
    asyncio.run(run_operator(kubeconfig, namespace=namespace, health_port=health_port, install_crds=install_crds,
                             leader_election=leader_election))  # fmt: skip
