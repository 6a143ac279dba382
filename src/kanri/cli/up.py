"""``kanri up``: the main job on a fresh machine — a local cluster running a 3-instance PostgreSQL cluster.

1. ``kanri local up``: the control plane and the local node;
2. the CRDs (``deploy/crds/``), then the object store in ``kanri-system`` (SeaweedFS as a StatefulSet with its claim,
   the Service ``kanri-s3`` on port 8333 and the key Secret ``kanri-s3-keys``, generated once and kept;
   :mod:`kanri.local.seaweedfs`) and the platform's default backup repository pointing at it (the ConfigMap
   ``kanri-backup-repository``);
3. the operator (``deploy/operator/``) installed by server-side apply, running as a pod like any real install, with
   that ConfigMap mounted and ``--default-backup-repository`` naming the file: the example's ``backup:
   {retentionDays: 14}`` archives there from its first minute;
4. ``examples/postgrescluster.yaml`` applied;
5. the cluster's status followed until it is Ready (or the timeout passes, naming what is missing), and where its
   backups go;
6. how to connect: ``kanri psql <name>`` (:mod:`kanri.cli.psql`: the port-forward, the password and the CA in one
   command); :func:`connect_commands` is the long form docs/security.md shows for machines without kanri.
"""

from __future__ import annotations

import asyncio
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console

from kanri.cli import up_real
from kanri.cli.local import start_cluster, start_real_cluster
from kanri.local import BuildError, paths
from kanri.local.detached import DetachedProcessError
from kanri.local.realnode import RealNodeError
from kanri.local.seaweedfs import S3_BUCKET, S3_PORT, S3_SERVICE, keys_secret, new_keys, object_store
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    CONFIG_MAP,
    CRD,
    DEPLOYMENT,
    NAMESPACE,
    NETWORK_POLICY,
    ROLE,
    ROLE_BINDING,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
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
        CONFIG_MAP,
        SERVICE,
        STATEFUL_SET,
        NETWORK_POLICY,
    )
}
SYSTEM_NAMESPACE = "kanri-system"
REPOSITORY_CONFIG_MAP = "kanri-backup-repository"
REPOSITORY_DIR = "/etc/kanri/backup-repository"


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


def default_repository() -> Obj:
    """The platform's default repository on the local cluster: the object store's Service, its key Secret in the
    operator's namespace (the fields of ``backup.repository.s3``, see docs/backups.md)."""
    return {
        "endpoint": f"http://{S3_SERVICE}.{SYSTEM_NAMESPACE}.svc.cluster.local:{S3_PORT}",
        "bucket": S3_BUCKET,
        "credentialsSecret": {"name": f"{S3_SERVICE}-keys"},
    }


def with_default_repository(docs: list[Obj]) -> list[Obj]:
    """The operator's manifests with the repository ConfigMap mounted into its Deployment and
    ``--default-backup-repository`` naming the file (the chart has no value for it yet)."""
    changed = copy.deepcopy(docs)
    for doc in changed:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        pod.setdefault("volumes", []).append({"name": "backup-repository",
                                              "configMap": {"name": REPOSITORY_CONFIG_MAP}})  # fmt: skip
        container = pod["containers"][0]
        container.setdefault("args", []).append(f"--default-backup-repository={REPOSITORY_DIR}/repository.yaml")
        container.setdefault("volumeMounts", []).append({"name": "backup-repository", "mountPath": REPOSITORY_DIR,
                                                         "readOnly": True})  # fmt: skip
    return changed


async def install_object_store(client: Client, rename: Callable[[list[Obj]], list[Obj]] = list) -> str:
    """The object store and the default repository's ConfigMap in ``kanri-system``; the key pair is generated only
    when its Secret does not exist yet (a restart keeps the keys, and the data made with them). Returns where
    backups go."""
    await client.apply(NAMESPACE, {"metadata": {"name": SYSTEM_NAMESPACE}}, field_manager=FIELD_MANAGER)
    secret = keys_secret(SYSTEM_NAMESPACE, new_keys())
    try:
        await client.create(SECRET, secret)
    except ApiError as exc:
        if exc.status != 409:  # exists: keep its keys
            raise
    for doc in rename(object_store(SYSTEM_NAMESPACE)):
        body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
        await client.apply(_KINDS[(doc["apiVersion"], doc["kind"])], body, field_manager=FIELD_MANAGER)
    repository = default_repository()
    config = {"metadata": {"name": REPOSITORY_CONFIG_MAP, "namespace": SYSTEM_NAMESPACE},
              "data": {"repository.yaml": yaml.safe_dump(repository, sort_keys=False)}}  # fmt: skip
    await client.apply(CONFIG_MAP, config, field_manager=FIELD_MANAGER)
    return f"s3://{repository['bucket']} at {repository['endpoint']}"


async def install_and_follow(
    kubeconfig: Path, root: Path, example: Path, timeout: float, real_nodes: bool = False
) -> tuple[Obj, str]:
    rename = up_real.on_real_nodes if real_nodes else list
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        applied = await apply_all(client, documents(root / "deploy" / "crds"))
        err.print(f"[green]CRDs applied[/green]: {', '.join(applied)}")
        where = await install_object_store(client, rename)
        err.print(f"[green]object store applied[/green]: StatefulSet/{S3_SERVICE}, Service/{S3_SERVICE}, "
                  f"Secret/{S3_SERVICE}-keys in {SYSTEM_NAMESPACE}; default backup repository {where}")  # fmt: skip
        applied = await apply_all(client, rename(with_default_repository(documents(root / "deploy" / "operator"))))
        err.print(f"[green]operator applied[/green]: {', '.join(applied)}")
        (cluster,) = documents(example)
        await apply_all(client, [cluster])
        name, namespace = cluster["metadata"]["name"], cluster["metadata"].get("namespace", "default")
        err.print(f"[green]applied[/green] {example} (PostgresCluster {namespace}/{name}); following its status:")
        ready = await follow(client, name, namespace, timeout)
        if ready["spec"].get("backup") is None:
            return ready, where
        return await follow_archiving(client, name, namespace, ready, timeout=120), where


async def follow_archiving(client: Client, name: str, namespace: str, cluster: Obj, timeout: float) -> Obj:
    """After Ready: wait (a little) for ContinuousArchiving=True, the first WAL segment reaching the object store;
    the cluster as last seen either way (the printout names the condition's state)."""
    deadline = time.monotonic() + timeout
    while True:
        condition = get_condition((cluster.get("status") or {}).get("conditions"), "ContinuousArchiving")
        if (condition is not None and condition["status"] == "True") or time.monotonic() > deadline:
            return cluster
        await asyncio.sleep(1)
        cluster = await client.get(POSTGRES_CLUSTER, name, namespace)


def connect_commands(kubectl: str, cluster: str, namespace: str, database: str) -> list[str]:
    """The long form of ``kanri psql`` (docs/security.md shows it; a unit test keeps the two equal): fetch the
    cluster's CA, then ``psql`` with ``sslmode=verify-full``: libpq checks the certificate against the ``-rw``
    Service's name while ``hostaddr`` reaches the port-forward (the password in PGPASSWORD, not argv)."""
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
    real_nodes: Annotated[
        bool,
        typer.Option("--real-nodes", help="Run on three real nodes (kubelet, containerd, runc) from the built images."),
    ] = False,
) -> None:
    """Start the local cluster, install kanri as a real install would, apply the example PostgresCluster and
    follow it until Ready; then print how to connect."""
    root = paths.source_root()
    manifest = example or root / "examples" / "postgrescluster.yaml"
    try:
        control_plane = start_real_cluster(name) if real_nodes else start_cluster(name)
        if real_nodes:
            with err.status("importing the images into the nodes"):
                imported = up_real.import_images(name, documents(manifest)[0])
            err.print(f"[green]images on every node[/green]: {', '.join(imported)}")
        started = time.monotonic()
        cluster, where = asyncio.run(
            install_and_follow(control_plane.kubeconfig, root, manifest, timeout, real_nodes=real_nodes)
        )
    except (BuildError, DetachedProcessError, TimeoutError, ApiError, RealNodeError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        err.print("  operator log: kanri local logs -n kanri-system <pod>  (kubectl get pods -n kanri-system)")
        raise typer.Exit(1) from exc
    cluster_name = cluster["metadata"]["name"]
    namespace = cluster["metadata"].get("namespace", "default")
    # The programs as this install has them (a new user has neither kanri nor kubectl on PATH yet).
    bin_dir = Path(sys.executable).parent
    kanri = str(bin_dir / "kanri") if (bin_dir / "kanri").exists() else "kanri"
    kubectl_binary = str(bin_dir / "kubectl") if (bin_dir / "kubectl").exists() else "kubectl"
    kubectl = f"{kubectl_binary} --kubeconfig {control_plane.kubeconfig}"
    err.print(f"[green]{cluster_name} is Ready[/green] ({time.monotonic() - started:.0f}s after the install began).")
    if cluster["spec"].get("backup") is not None:
        archiving = get_condition((cluster.get("status") or {}).get("conditions"), "ContinuousArchiving")
        state = f"{archiving['status']} ({archiving.get('reason', '')})" if archiving else "not reported yet"
        # the platform's default repository keeps a folder per namespace (kanri.postgres.backup.archiving.Repository)
        folder = f"{cluster_name}/" if cluster["spec"]["backup"].get("repository") else f"{namespace}/{cluster_name}/"
        err.print(f"  backups: WAL is archived to {where} under {folder} (ContinuousArchiving={state});")
        err.print(f"  watch it: {kubectl} get pgc {cluster_name} -n {namespace} -o jsonpath="
                  "'{.status.conditions[?(@.type==\"ContinuousArchiving\")]}'")  # fmt: skip
    err.print("Connect from this machine (psql as the app user, TLS verified; --superuser for postgres):")
    err.print(f"  {kanri} psql {cluster_name} -n {namespace} --kubeconfig {control_plane.kubeconfig}")
    err.print(
        "  (without kanri: the port-forward and psql commands of docs/security.md, 'Connecting with verification')"
    )
    err.print(f"  {kubectl} get pgc,pods -n {namespace}")
    err.print(f"  stop everything: {kanri} local down (data is kept; {kanri} up starts it again)")
