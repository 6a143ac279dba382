"""``kanri cache run``: run the Cache (Valkey) operator (docs/cache.md)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from kanri.cache.operator import run as run_operator
from kanri.cli import _run_options as opts
from kanri.runtime import configure_logging

app = typer.Typer(no_args_is_help=True, help="The Cache (Valkey) operator.")


@app.command("run")
def run(
    kubeconfig: opts.KubeconfigPath = None,
    namespace: Annotated[
        list[str] | None,
        typer.Option(help="Watch Caches in this namespace only; repeat it for several (default: all namespaces)."),
    ] = None,
    health_port: Annotated[int, typer.Option(help="Port of /healthz, /readyz and /metrics.")] = 8082,
    install_crd: Annotated[bool, typer.Option(help="Apply the Cache CRD first (development clusters).")] = False,
) -> None:
    """Run the Cache operator until interrupted."""
    configure_logging()
    asyncio.run(run_operator(kubeconfig, install_crd=install_crd, health_port=health_port,
                             namespaces=tuple(namespace or ())))  # fmt: skip
