"""``kanri local``: run the local cluster (control plane + local node) by hand, and reach what runs on it."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from kanri.images.catalog import built_images, catalog_file
from kanri.images.push import PushError, push_images
from kanri.images.registry import Destination, Oras, RegistryClientError
from kanri.local import BuildError, ControlPlane, controlplane_binary, paths
from kanri.local.access import (
    AccessError,
    container_log_file,
    forward,
    kubectl_port_forward,
    read_pod,
    resolve_target,
)
from kanri.local.controlplane import Endpoint
from kanri.local.detached import DetachedProcessError
from kanri.local.imagemap import write_default_image_map
from kanri.local.leftovers import find_leftovers, undo_chaos
from kanri.local.node import NodeOptions
from kanri.local.node.control import ControlError, call
from kanri.local.node.network import NodeLock
from kanri.local.nodeprocess import NodeProcess
from kanri.local.realnode import NodeRegistry, RealNodeError
from kanri.local.realnode import chaos as realnode_chaos  # issue 27 (rn-cluster)
from kanri.local.realnode import local as realnode_local
from kanri.local.realnode.addons import AddonError
from kanri.local.registry import LocalRegistry, RegistryEndpoint, registry_binary
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


def _start_control_plane(name: str) -> tuple[ControlPlane, Endpoint]:
    """Build (if needed) and start the control plane."""
    cp = _control_plane(name)
    with err.status("checking the control-plane binary") as status:
        binary = controlplane_binary(on_build=lambda message: status.update(message))
    cp = ControlPlane(cp.data_dir, binary)
    already = cp.running_pid() is not None
    with err.status("starting the control plane"):
        endpoint = cp.start()
    verb = "already running" if already else "ready"
    err.print(f"[green]control plane {verb}[/green] at {endpoint.server} (pid {endpoint.pid})")
    return cp, endpoint


def refuse_other_kind_of_nodes(name: str, real_nodes: bool) -> None:
    """Exit 1 when cluster ``name`` was made on the other kind of node: its volumes live on those nodes and its
    pods are bound to them, so on new nodes every pod would wait for ever (seen: a `make up` on real nodes over a
    cluster the home-made node had made left `orders` Terminating on NotReady nodes)."""
    cluster_dir = paths.cluster_dir(name)
    if real_nodes:
        node_dir = _node(name).node_dir
        other = sorted(d.name for d in node_dir.iterdir() if d.is_dir()) if node_dir.is_dir() else []
    else:
        other = [node.spec.name for node in realnode_local.saved_nodes(cluster_dir)]
    if not other:
        return
    made_on = "the home-made node" if real_nodes else "real nodes"
    again = "" if real_nodes else " --real-nodes"
    err.print(
        f"[red]error:[/red] local cluster {name!r} was made on {made_on} ({', '.join(other)}): its volumes and pods "
        f"are bound to those nodes. Run it as it was made (`kanri up{again}`), choose another cluster (`--name`), "
        f"or delete this one and its data (`kanri local delete --name {name}`)."
    )
    raise typer.Exit(1)


def start_real_cluster(name: str) -> ControlPlane:
    """The control plane and three real nodes in three zones (issue 27, docs/real-nodes.md), instead of the
    home-made node; the nodes keep running after this process (their own sessions and cgroups)."""
    refuse_other_kind_of_nodes(name, real_nodes=True)
    cp, _ = _start_control_plane(name)
    # before the nodes, which pull from it what they do not hold; the main job's images are imported instead (each
    # node's start), so the built images are not all copied into it here: `kanri images push --local` does that
    endpoint = start_registry(name, push_built=False)
    registry = None if endpoint is None else NodeRegistry(int(endpoint.address.rsplit(":", 1)[1]), endpoint.ca_file)
    with err.status("starting three real nodes"):
        seconds = realnode_local.start(paths.cluster_dir(name), cp.data_dir, registry)
    started = ", ".join(f"{node} in {s:.1f} s" for node, s in sorted(seconds.items()))
    err.print(f"[green]real nodes ready[/green] ({started or 'all already running'})")
    via = realnode_local.route_services(paths.cluster_dir(name), cp.data_dir)
    err.print(f"Service addresses reachable from this machine through {via or 'no node (none runs healthy)'}")
    with err.status("starting the local-path provisioner"):
        provisioner = realnode_local.start_provisioner(paths.cluster_dir(name), cp.data_dir)
    err.print(f"local-path provisioner (default StorageClass local-path): {provisioner}")
    return cp


def start_cluster(name: str, image_map: Path | None = None, nodes: int = 3) -> ControlPlane:
    """Build (if needed) and start the control plane, then the node host with ``nodes`` nodes; what `up` and
    `kanri up` share."""
    refuse_other_kind_of_nodes(name, real_nodes=False)
    cp, endpoint = _start_control_plane(name)
    node = _node(name)
    node_running = node.running_pid() is not None
    with err.status("starting the local nodes"):
        generated = write_default_image_map(cp.data_dir / "images.generated.yaml")
        pid = node.start(endpoint.kubeconfig, cp.apiserver_port(), generated, image_map, nodes=nodes)
    state = "already running (with the nodes it has)" if node_running else f"ready with {nodes} node(s)"
    err.print(f"[green]local nodes {state}[/green] (pid {pid})")
    start_registry(name)
    return cp


def start_registry(name: str, *, push_built: bool = True) -> RegistryEndpoint | None:
    """Start the cluster's image registry and (``push_built``) push what `make images` built to it (nothing is
    copied twice); a checkout without `make registry-tools` runs on without one, and says so (None)."""
    registry = LocalRegistry(paths.cluster_dir(name))
    if not registry_binary().is_file():
        err.print("[yellow]no image registry[/yellow]: run `make registry-tools` to build it")
        return None
    with err.status("starting the image registry"):
        endpoint = registry.start()
    err.print(f"[green]image registry ready[/green] at {endpoint.address} (CA {endpoint.ca_file})")
    if not push_built or not catalog_file().is_file():
        return endpoint
    dest = Destination(endpoint.address, "kanri", ca_file=endpoint.ca_file)
    try:
        with err.status("pushing the built images to it"):
            pushed = push_images(Oras(), built_images(), dest)
    except (PushError, RegistryClientError) as exc:
        err.print(f"[yellow]the built images were not pushed:[/yellow] {exc}")
        return endpoint
    err.print(f"  {len(pushed)} image(s) under {endpoint.address}/kanri")
    return endpoint


@app.command()
def up(
    name: ClusterOption = "default",
    image_map: Annotated[
        Path | None, typer.Option("--image-map", help="Your image map (YAML); its entries win over kanri's own.")
    ] = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=26, help="How many nodes (one zone each).")] = 3,
    real_nodes: Annotated[
        bool,
        typer.Option(
            "--real-nodes", help="Three real nodes (kubelet, containerd) in three zones instead of the home-made node."
        ),
    ] = False,
) -> None:
    """Start the control plane (building it if its sources changed) and the local nodes; wait until both are
    ready. Idempotent."""
    try:
        cp = start_real_cluster(name) if real_nodes else start_cluster(name, image_map, nodes)
    except (BuildError, DetachedProcessError, RealNodeError, AddonError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    err.print(f"  kubectl --kubeconfig {cp.kubeconfig} get nodes")
    nodes_log = realnode_chaos.real_nodes_dir(cp.data_dir) / "NODE" if real_nodes else _node(name).log_file
    err.print(f"  logs: {cp.log_file} (control plane), {nodes_log} (node)")


def _runs_no_other_pod_network(own: int | None) -> bool:
    """Whether the machine's home-made pod network (its namespaces, bridge, kube-proxy and partition tables) may be
    this cluster's: nobody holds the machine's node lock, or this cluster's node (pid ``own``) did. While another
    cluster's node or a test session's holds it, `down` leaves those alone and checks only what is its own."""
    holder = NodeLock().holder()
    if holder is None or (own is not None and holder == str(own)):
        return True
    err.print(f"another local node (pid {holder}) runs the machine's pod network: its namespaces and tables are "
              "not this cluster's, only this cluster's own files and processes are checked")  # fmt: skip
    return False


@app.command()
def down(name: ClusterOption = "default") -> None:
    """Stop the local node (containers get SIGTERM, then its namespaces, links and mountpoints are removed) and
    the control plane. Data stays: `up` brings every object and volume back. Exits 1 if anything was left.
    Stopped, frozen or partitioned nodes are undone (thawed, the partition tables removed) even after a crash."""
    try:
        own = _node(name).running_pid()
        node_stopped = _node(name).stop()
        machine_wide = _runs_no_other_pod_network(own)
        undo_chaos(_node_options(name), machine_wide)
        err.print("local node stopped" if node_stopped else "local node was not running")
        if LocalRegistry(paths.cluster_dir(name)).stop():
            err.print("image registry stopped")
        real_left = realnode_local.stop(paths.cluster_dir(name))  # issue 27: the real nodes, by name
        stopped = _control_plane(name).stop()
    except (DetachedProcessError, RealNodeError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    err.print("control plane stopped" if stopped else "control plane was not running")
    left = real_left + find_leftovers(_node_options(name), machine_wide)
    if left:
        err.print("[red]left behind:[/red] " + ", ".join(left))
        raise typer.Exit(1)


@app.command()
def delete(name: ClusterOption = "default") -> None:
    """Stop everything of the cluster (as `down`), then remove its data: every object, volume and node directory.
    Nothing is removed when `down` left anything behind."""
    down(name)
    cluster_dir = paths.cluster_dir(name)
    shutil.rmtree(cluster_dir, ignore_errors=True)
    if cluster_dir.exists():
        err.print(f"[red]error:[/red] {cluster_dir} could not be removed entirely")
        raise typer.Exit(1)
    err.print(f"local cluster {name!r} deleted ({cluster_dir})")


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
    real = realnode_local.rows(paths.cluster_dir(name))
    for row in real:
        err.print(f"  real node {row.name} ({row.zone}): {row.state}")
    node_pid = _node(name).running_pid()
    if node_pid is None and real:
        if all(row.state == "Stopped" for row in real):
            raise typer.Exit(1)
        return
    if node_pid is None:
        err.print("local node: [yellow]stopped[/yellow]")
        raise typer.Exit(1)
    err.print(f"local nodes: [green]running[/green] (pid {node_pid}), log {_node(name).log_file}")
    try:
        nodes = asyncio.run(call(_node(name).control_socket, "GET", "/nodes"))
    except ControlError as exc:
        err.print(f"  [yellow]{exc}[/yellow]")
        return
    for node in nodes:
        err.print(f"  {node['name']} ({node['zone']}): {node['state']}, {node['pods']} pod(s)")


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
        node_name = (found.get("spec") or {}).get("nodeName")
        if not node_name:
            raise AccessError(f"pod {namespace}/{pod} is not on a node yet")
        return container_log_file(_node(name).node_dir / node_name, found, container, previous)

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
    """Forward a local port to a Service or a pod until interrupted. On the home-made node a Service is reached
    through its ClusterIP, so the forward follows the ready endpoints; on real nodes (`up --real-nodes`) this is
    `kubectl port-forward` (API server and kubelet), which picks one ready pod of the Service when it starts."""
    local, _, remote = ports.partition(":")

    async def serve() -> None:
        async with await _client(name) as client:
            target = await resolve_target(client, resource, namespace, int(remote) if remote else None)
        if _node(name).running_pid() is None and realnode_local.real_nodes_run(paths.cluster_dir(name)):
            kubeconfig = _control_plane(name).kubeconfig
            argv = kubectl_port_forward(kubeconfig, resource, namespace, f"{local}:{target.port}", address)
            raise typer.Exit(await _run_until_interrupted(argv))
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


async def _run_until_interrupted(argv: list[str]) -> int:
    """Run ``argv`` with this process's stdout and stderr; its exit code. Cancelled (Ctrl-C), it is ended too."""
    process = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL)
    try:
        return await process.wait()
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


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


node_app = typer.Typer(
    no_args_is_help=True,
    help="The local nodes and their chaos verbs: stop/start (power), freeze/thaw (every pod process stopped at "
    "once), partition/heal (cut off from other nodes, Services and the API server). Every verb is idempotent.",
)
app.add_typer(node_app, name="node")
NodeArgument = Annotated[str, typer.Argument(help="Node name (see `kanri local node list`).")]


def _control(name: str, method: str, route: str) -> Any:
    try:
        return asyncio.run(call(_node(name).control_socket, method, route))
    except ControlError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc


@node_app.command("list")
def node_list(name: ClusterOption = "default") -> None:
    """The nodes: zone, chaos state (Running, Stopped, Frozen, Partitioned), address, pod CIDR, pods."""
    real = realnode_local.rows(paths.cluster_dir(name))
    rows = _control(name, "GET", "/nodes") if _node(name).running_pid() is not None or not real else []
    typer.echo(f"{'NAME':<16}{'ZONE':<10}{'STATE':<24}{'INTERNAL-IP':<16}{'POD-CIDR':<18}PODS")
    for r in real:  # issue 27: real nodes; their pods are the API server's to count
        typer.echo(f"{r.name:<16}{r.zone:<10}{r.state:<24}{r.ip:<16}{r.pod_cidr:<18}-")
    for row in rows:
        typer.echo(
            f"{row['name']:<16}{row['zone'] or '':<10}{row['state']:<24}{row['internalIP']:<16}"
            f"{row['podCIDR']:<18}{row['pods']}"
        )


def _verb(verb: str, doc: str) -> None:
    def command(node: NodeArgument, name: ClusterOption = "default") -> None:
        # issue 27 (rn-cluster): a real node of the cluster is found by name in its directory and acted on here
        if (real := realnode_chaos.find(paths.cluster_dir(name), node)) is not None:
            try:
                changed = realnode_chaos.apply(real, verb)
            except RealNodeError as exc:
                err.print(f"[red]error:[/red] {exc}")
                raise typer.Exit(1) from exc
            err.print(f"{node}: {verb} {'done' if changed else 'nothing to do'}; now {realnode_chaos.state(real)}")
            if changed:  # the machine's way to the Service addresses goes through a node that can carry it
                realnode_local.route_services(paths.cluster_dir(name), real.control_plane_dir)
            return
        answer = _control(name, "POST", f"/nodes/{node}/{verb}")
        done = "done" if answer["changed"] else "nothing to do"
        err.print(f"{node}: {verb} {done}; now {answer['node']['state']}")

    command.__doc__ = doc
    node_app.command(verb)(command)


_verb("stop", "Power the node off: every container SIGKILLed at once, heartbeats and kubelet stop (NotReady soon).")
_verb("start", "Power the node on: heartbeats again; the kubelet starts the pods still bound to it afresh.")
_verb("freeze", "Freeze every process of every pod of the node at once (freezer cgroup); heartbeats pause.")
_verb("thaw", "Resume what freeze stopped.")
_verb("partition", "Cut the node's pods off from other nodes' pods, Services and the API server; heartbeats pause.")
_verb("heal", "Undo partition.")
