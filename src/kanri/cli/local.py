"""``kanri local``: run the local cluster (control plane + local node) by hand, and reach what runs on it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kanri.local import BuildError, ControlPlane, controlplane_binary, paths
from kanri.local.access import AccessError, container_log_file, forward, read_pod, resolve_target
from kanri.local.detached import DetachedProcessError
from kanri.local.imagemap import write_default_image_map
from kanri.local.leftovers import find_leftovers
from kanri.local.node import NodeOptions
from kanri.local.nodeprocess import NodeProcess
from kanri.runtime import Client

app = typer.Typer(
    no_args_is_help=True,
    help="The local Kubernetes cluster: a real control plane (etcd, kube-apiserver, controllers) and a local node "
    "that runs pods as processes in their own network and mount namespaces.",
)
# soft_wrap: paths must stay on one line so they can be copied (or parsed) from the output.
err = Console(stderr=True, soft_wrap=True)

ClusterOption = Annotated[str, typer.Option("--name", help="Name of the local cluster (one data dir per name).")]


NamespaceOption = Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the pod or service.")]


def _control_plane(name: str) -> ControlPlane:
    return ControlPlane(paths.cluster_dir(name))


def _node(name: str) -> NodeProcess:
    return NodeProcess(paths.cluster_dir(name))


def _node_options(name: str) -> NodeOptions:
    """The options ``python -m kanri.local.node`` runs with (all defaults but the data dir)."""
    return NodeOptions(data_dir=_node(name).node_dir)


def start_cluster(name: str, image_map: Path | None = None) -> ControlPlane:
    """Build (if needed) and start the control plane, then the local node; what `up` and `kanri up` share."""
    cp = _control_plane(name)
    with err.status("checking the control-plane binary") as status:
        binary = controlplane_binary(on_build=lambda message: status.update(message))
    cp = ControlPlane(cp.data_dir, binary)
    already = cp.running_pid() is not None
    with err.status("starting the control plane"):
        endpoint = cp.start()
    verb = "already running" if already else "ready"
    err.print(f"[green]control plane {verb}[/green] at {endpoint.server} (pid {endpoint.pid})")
    node = _node(name)
    node_running = node.running_pid() is not None
    with err.status("starting the local node"):
        generated = write_default_image_map(cp.data_dir / "images.generated.yaml")
        pid = node.start(endpoint.kubeconfig, cp.apiserver_port(), generated, image_map)
    err.print(f"[green]local node {'already running' if node_running else 'ready'}[/green] (pid {pid})")
    return cp


@app.command()
def up(
    name: ClusterOption = "default",
    image_map: Annotated[
        Path | None, typer.Option("--image-map", help="Your image map (YAML); its entries win over kanri's own.")
    ] = None,
) -> None:
    """Start the control plane (building it if its sources changed) and the local node; wait until both are
    ready. Idempotent."""
    try:
        cp = start_cluster(name, image_map)
    except (BuildError, DetachedProcessError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    err.print(f"  kubectl --kubeconfig {cp.kubeconfig} get nodes")
    err.print(f"  logs: {cp.log_file} (control plane), {_node(name).log_file} (node)")


@app.command()
def down(name: ClusterOption = "default") -> None:
    """Stop the local node (containers get SIGTERM, then its namespaces, links and mountpoints are removed) and
    the control plane. Data stays: `up` brings every object and volume back. Exits 1 if anything was left."""
    try:
        node_stopped = _node(name).stop()
        err.print("local node stopped" if node_stopped else "local node was not running")
        stopped = _control_plane(name).stop()
    except DetachedProcessError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    err.print("control plane stopped" if stopped else "control plane was not running")
    left = find_leftovers(_node_options(name))
    if left:
        err.print("[red]left behind:[/red] " + ", ".join(left))
        raise typer.Exit(1)


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
    node_pid = _node(name).running_pid()
    if node_pid is None:
        err.print("local node: [yellow]stopped[/yellow]")
        raise typer.Exit(1)
    err.print(f"local node: [green]running[/green] (pid {node_pid}), log {_node(name).log_file}")


async def _client(name: str) -> Client:
    kubeconfig = _control_plane(name).kubeconfig
    if not kubeconfig.is_file():
        raise AccessError(f"no kubeconfig at {kubeconfig}; run `kanri local up` first")
    return await Client.from_kubeconfig(str(kubeconfig))


@app.command()
def logs(
    pod: Annotated[str, typer.Argument(help="Pod name.")],
    container: Annotated[str | None, typer.Option("--container", "-c", help="Container (default: the first).")] = None,
    namespace: NamespaceOption = "default",
    previous: Annotated[bool, typer.Option("--previous", "-p", help="The run before the last restart.")] = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    name: ClusterOption = "default",
) -> None:
    """Print a container's log (stdout and stderr), like `kubectl logs`."""

    async def find() -> Path:
        async with await _client(name) as client:
            found = await read_pod(client, pod, namespace)
        return container_log_file(_node(name).node_dir, found, container, previous)

    try:
        path = asyncio.run(find())
    except AccessError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    with path.open("rb") as f:
        while True:
            chunk = f.read(65536)
            if chunk:
                typer.echo(chunk.decode(errors="replace"), nl=False)
            elif follow:
                time.sleep(0.5)
            else:
                break


@app.command("port-forward")
def port_forward(
    resource: Annotated[str, typer.Argument(help="svc/NAME or pod/NAME.")],
    ports: Annotated[str, typer.Argument(help="LOCAL or LOCAL:REMOTE (REMOTE defaults to the first port).")],
    namespace: NamespaceOption = "default",
    address: Annotated[str, typer.Option("--address", help="Local address to listen on.")] = "127.0.0.1",
    name: ClusterOption = "default",
) -> None:
    """Forward a local port to a Service (through its ClusterIP, so it follows the ready endpoints) or a pod,
    until interrupted."""
    local, _, remote = ports.partition(":")

    async def serve() -> None:
        async with await _client(name) as client:
            target = await resolve_target(client, resource, namespace, int(remote) if remote else None)
        server = await forward(target, int(local), lambda message: err.print(message), address)
        err.print(f"Forwarding from {address}:{local} -> {target.description}")
        async with server:
            await server.serve_forever()

    try:
        asyncio.run(serve())
    except AccessError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        pass


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
