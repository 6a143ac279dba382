"""``kanri up``: the main job on a fresh machine — a local cluster running a 3-instance PostgreSQL cluster.

1. ``kanri local up``: the control plane and the local node;
2. the CRDs (``deploy/crds/``) and the operator (``deploy/operator/``) installed by server-side apply, the operator
   running as a pod like any real install;
3. ``examples/postgrescluster.yaml`` applied;
4. the cluster's status followed until it is Ready (or the timeout passes, naming what is missing);
5. how to connect: ``kanri local port-forward svc/<name>-rw`` and ``psql "sslmode=verify-full ..."`` with the CA
   from ``<name>-ca``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console

from kanri.cli.local import start_cluster
from kanri.local import BuildError, paths
from kanri.local.detached import DetachedProcessError
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    CRD,
    DEPLOYMENT,
    NAMESPACE,
    ROLE,
    ROLE_BINDING,
    SERVICE_ACCOUNT,
)

Obj = dict[str, Any]
err = Console(stderr=True, soft_wrap=True)
FIELD_MANAGER = "kanri-up"
_KINDS = {
    (k.api_version, k.kind): k
    for k in (
        CRD,
        NAMESPACE,
        SERVICE_ACCOUNT,
        CLUSTER_ROLE,
        CLUSTER_ROLE_BINDING,
        ROLE,
        ROLE_BINDING,
        DEPLOYMENT,
        POSTGRES_CLUSTER,
    )
}


def documents(*files: Path) -> list[Obj]:
    """Every YAML document of ``files`` (directories: their ``*.yaml``, sorted), in order."""
    found: list[Obj] = []
    for path in files:
        for file in sorted(path.glob("*.yaml")) if path.is_dir() else [path]:
            found += [d for d in yaml.safe_load_all(file.read_text()) if d]
    return found


async def apply_all(client: Client, docs: list[Obj], namespace: str = "default") -> list[str]:
    """Server-side apply each document (namespaced ones without a namespace go to ``namespace``)."""
    applied = []
    for doc in docs:
        kind = _KINDS.get((doc["apiVersion"], doc["kind"]))
        if kind is None:
            raise typer.BadParameter(f"kanri up cannot apply {doc['apiVersion']} {doc['kind']}")
        body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
        if kind.namespaced:
            body["metadata"] = {"namespace": namespace, **body["metadata"]}
        await client.apply(kind, body, field_manager=FIELD_MANAGER)
        applied.append(f"{doc['kind']}/{doc['metadata']['name']}")
        if kind is CRD:
            await _established(client, doc["metadata"]["name"])
    return applied


async def _established(client: Client, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = await client.get(CRD, name)
        condition = get_condition((crd.get("status") or {}).get("conditions"), "Established")
        if condition is not None and condition["status"] == "True":
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"CRD {name} not established within {timeout:.0f}s")


def describe(cluster: Obj) -> str:
    """One line of what the cluster's status says."""
    status = cluster.get("status") or {}
    spec = cluster.get("spec") or {}
    conditions = status.get("conditions") or []
    parts = [f"ready {status.get('readyReplicas', 0)}/{spec.get('replicas', '?')}"]
    if status.get("currentPrimary"):
        parts.append(f"primary {status['currentPrimary']}")
    for kind in ("Ready", "Progressing", "Degraded"):
        condition = get_condition(conditions, kind)
        if condition is not None:
            parts.append(f"{kind}={condition['status']} ({condition.get('reason', '')})")
    return ", ".join(parts)


async def follow(client: Client, name: str, namespace: str, timeout: float) -> Obj:
    """Print each change of the cluster's status until Ready; raise TimeoutError with the last state."""
    deadline = time.monotonic() + timeout
    last = ""
    cluster: Obj = {}
    while time.monotonic() < deadline:
        try:
            cluster = await client.get(POSTGRES_CLUSTER, name, namespace)
        except ApiError as exc:
            if not exc.not_found:
                raise
            await asyncio.sleep(1)
            continue
        line = describe(cluster)
        if line != last:
            err.print(f"  {time.strftime('%H:%M:%S')} {name}: {line}")
            last = line
        ready = get_condition((cluster.get("status") or {}).get("conditions"), "Ready")
        if ready is not None and ready["status"] == "True":
            return cluster
        await asyncio.sleep(1)
    raise TimeoutError(f"{name} not Ready within {timeout:.0f}s; last status: {last or 'none yet'}")


async def install_and_follow(kubeconfig: Path, root: Path, example: Path, timeout: float) -> Obj:
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        for what, files in (("CRDs", [root / "deploy" / "crds"]), ("operator", [root / "deploy" / "operator"])):
            applied = await apply_all(client, documents(*files))
            err.print(f"[green]{what} applied[/green]: {', '.join(applied)}")
        (cluster,) = documents(example)
        await apply_all(client, [cluster])
        name, namespace = cluster["metadata"]["name"], cluster["metadata"].get("namespace", "default")
        err.print(f"[green]applied[/green] {example} (PostgresCluster {namespace}/{name}); following its status:")
        return await follow(client, name, namespace, timeout)


def connect_commands(kubectl: str, cluster: str, namespace: str, database: str) -> list[str]:
    """Fetch the cluster's CA, then ``psql`` with ``sslmode=verify-full``: libpq checks the certificate against the
    ``-rw`` Service's name while ``hostaddr`` reaches the port-forward (the password in PGPASSWORD, not argv)."""
    secret = f"{kubectl} get secret -n {namespace}"
    ca_file = f"{cluster}-ca.crt"
    return [
        f"{secret} {cluster}-ca -o jsonpath='{{.data.ca\\.crt}}' | base64 -d > {ca_file}",
        f"PGPASSWORD=$({secret} {cluster}-app -o jsonpath='{{.data.password}}' | base64 -d) psql "
        f'"host={cluster}-rw.{namespace}.svc hostaddr=127.0.0.1 port=5432 dbname={database} sslmode=verify-full '
        f"sslrootcert={ca_file} user=$({secret} {cluster}-app -o jsonpath='{{.data.username}}' | base64 -d)\"",
    ]


def up(
    name: Annotated[str, typer.Option("--name", help="Name of the local cluster.")] = "default",
    example: Annotated[Path | None, typer.Option(help="The PostgresCluster to apply.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the cluster to become Ready.")] = 600,
) -> None:
    """Start the local cluster, install kanri as a real install would, apply the example PostgresCluster and
    follow it until Ready; then print how to connect."""
    root = paths.source_root()
    manifest = example or root / "examples" / "postgrescluster.yaml"
    try:
        control_plane = start_cluster(name)
        cluster = asyncio.run(install_and_follow(control_plane.kubeconfig, root, manifest, timeout))
    except (BuildError, DetachedProcessError, TimeoutError, ApiError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        err.print("  operator log: kanri local logs -n kanri-system <pod>  (kubectl get pods -n kanri-system)")
        raise typer.Exit(1) from exc
    cluster_name = cluster["metadata"]["name"]
    namespace = cluster["metadata"].get("namespace", "default")
    database = ((cluster["spec"].get("bootstrap") or {}).get("initdb") or {}).get("database", "app")
    # The programs as this install has them (a new user has neither kanri nor kubectl on PATH yet).
    bin_dir = Path(sys.executable).parent
    kanri = str(bin_dir / "kanri") if (bin_dir / "kanri").exists() else "kanri"
    kubectl_binary = str(bin_dir / "kubectl") if (bin_dir / "kubectl").exists() else "kubectl"
    kubectl = f"{kubectl_binary} --kubeconfig {control_plane.kubeconfig}"
    err.print(f"[green]{cluster_name} is Ready[/green]. Connect from this machine:")
    err.print(f"  {kanri} local port-forward svc/{cluster_name}-rw 5432 -n {namespace} &")
    for line in connect_commands(kubectl, cluster_name, namespace, database):
        err.print(f"  {line}")
    err.print(f"  {kubectl} get pgc,pods -n {namespace}")
    err.print(f"  stop everything: {kanri} local down (data is kept; {kanri} up starts it again)")
