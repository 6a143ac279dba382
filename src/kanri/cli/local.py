"""``kanri local``: run the local control plane by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kanri.local import BuildError, ControlPlane, ControlPlaneError, controlplane_binary, paths

app = typer.Typer(no_args_is_help=True, help="The local Kubernetes control plane (etcd, kube-apiserver, controllers).")
# soft_wrap: paths must stay on one line so they can be copied (or parsed) from the output.
err = Console(stderr=True, soft_wrap=True)

ClusterOption = Annotated[str, typer.Option("--name", help="Name of the local cluster (one data dir per name).")]


def _control_plane(name: str) -> ControlPlane:
    return ControlPlane(paths.cluster_dir(name))


@app.command()
def up(name: ClusterOption = "default") -> None:
    """Build the control plane if its sources changed, start it, and wait until it is ready."""
    cp = _control_plane(name)
    try:
        with err.status("checking the control-plane binary") as status:
            binary = controlplane_binary(on_build=lambda message: status.update(message))
        cp = ControlPlane(cp.data_dir, binary)
        already = cp.running_pid() is not None
        with err.status("starting the control plane"):
            endpoint = cp.start()
    except (BuildError, ControlPlaneError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    verb = "already running" if already else "ready"
    err.print(f"[green]control plane {verb}[/green] at {endpoint.server} (pid {endpoint.pid})")
    err.print(f"  kubectl --kubeconfig {endpoint.kubeconfig} get namespaces")
    err.print(f"  logs: {cp.log_file}")


@app.command()
def down(name: ClusterOption = "default") -> None:
    """Stop the control plane (its data stays; `up` brings every object back)."""
    try:
        stopped = _control_plane(name).stop()
    except ControlPlaneError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    err.print("control plane stopped" if stopped else "control plane was not running")


@app.command()
def status(name: ClusterOption = "default") -> None:
    """Say whether the control plane runs and is ready; exit 1 when it is not ready."""
    cp = _control_plane(name)
    pid = cp.running_pid()
    if pid is None:
        err.print("control plane: [yellow]stopped[/yellow]")
        raise typer.Exit(1)
    if not cp.is_ready():
        err.print(f"control plane: [yellow]running (pid {pid}) but not ready[/yellow]; see {cp.log_file}")
        raise typer.Exit(1)
    err.print(f"control plane: [green]ready[/green] (pid {pid}), kubeconfig {cp.kubeconfig}")


@app.command()
def kubeconfig(name: ClusterOption = "default") -> None:
    """Print the admin kubeconfig's path, for `kubectl --kubeconfig $(kanri local kubeconfig)`."""
    path: Path = _control_plane(name).kubeconfig
    if not path.is_file():
        err.print(f"[red]error:[/red] no kubeconfig at {path}; run `kanri local up` first")
        raise typer.Exit(1)
    typer.echo(str(path))


@app.command()
def build() -> None:
    """Build the control-plane binary if its sources (or the Go toolchain) changed; print its path."""
    try:
        binary = controlplane_binary(on_build=lambda message: err.print(message))
    except BuildError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    typer.echo(str(binary))
