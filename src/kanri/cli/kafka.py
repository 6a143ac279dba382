"""``kanri kafka``: the Kafka operator (KafkaCluster, KafkaTopic; docs/kafka.md)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from kanri.cli import _run_options as opts
from kanri.kafka.operator import run as run_operator
from kanri.runtime import configure_logging

app = typer.Typer(no_args_is_help=True, help="The Kafka operator: KafkaCluster and KafkaTopic.")


@app.command("run")
def run(
    kubeconfig: opts.KubeconfigPath = None,
    namespace: opts.OneNamespace = None,
    install_crds: Annotated[bool, typer.Option(help="Install or update the two CRDs first.")] = False,
    health_port: Annotated[int, typer.Option(help="Port of /healthz, /readyz and /metrics (0: none).")] = 8084,
) -> None:
    """Run the KafkaCluster and KafkaTopic controllers until interrupted."""
    configure_logging()
    asyncio.run(run_operator(kubeconfig, install_crds=install_crds, health_port=health_port, namespace=namespace))
