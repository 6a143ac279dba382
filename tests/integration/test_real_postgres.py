"""The PostgreSQL operator's product on a real node (docs/real-nodes.md, "PostgreSQL on real nodes"): the instance
image ``kanri-postgres:17`` built by ``make images``, run by the upstream kubelet, containerd and runc under the pod
security the operator asks for (non-root, read-only root filesystem, RuntimeDefault seccomp, no capabilities,
fsGroup), on a ``local-path`` volume made by rancher's provisioner.

The operator runs in the test process (its real Manager) and is told the image the node knows through its own knob,
``KANRI_POSTGRES_IMAGES`` (what the Helm chart sets). It reaches the instance API at the pod's address (the host
routes the pod networks); a client reaches ``-rw`` through its ClusterIP from inside the pod network only (kube-proxy
runs in the node's namespace), so the row is written and read back by ``psql`` run in the instance pod with
``kubectl exec``.

One node for the module on the session's control plane. Run it serialized with the other tests that use the
machine's pod networks: ``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_postgres.py -q``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.local.realnode import RealCluster, RealNode
from kanri.local.realnode.addons import (
    ClusterDNS,
    NetworkPolicyAgent,
)
from kanri.local.realnode.addons.localpath import STORAGE_CLASS, LocalPathProvisioner
from kanri.local.realnode.network import route_services, unroute_services
from kanri.postgres.children.images import ENV as POSTGRES_IMAGES_ENV
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import SWITCHOVER as SWITCHOVER_TO
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER, POSTGRES_POOLER
from kanri.postgres.pooler import children as pooler_children
from kanri.postgres.pooler import names as pooler_names
from kanri.postgres.recovery.rehearsal import FIRST_BACKUP
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import POD, SERVICE
from tests.e2e.postgres_helpers import (
    cluster,
    cluster_ip,
    credentials,
    every_instance_has,
    pods_of,
    rows_through,
    write_row,
)
from tests.e2e.test_backup_archiving_e2e import Store, segments, start_store, superuser_rows
from tests.e2e.test_postgres_failover_e2e import NAME as FAILOVER_NAME
from tests.e2e.test_postgres_failover_e2e import (
    ack_elsewhere,
    failed_over_from,
    lost_commits,
    one_per_node,
    primary_and_node,
    rejoined,
    wait_until_instances_agree,
    workload,
)
from tests.helm_support import template
from tests.integration.realnode_support import (
    coredns_on,
    environment,
    kubectl,
    local_path_on,
    pod,
    three_real_nodes,
)
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import NotYet, eventually

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]

PREFIX = "pg"
MAJOR = 17
IMAGE = f"kanri-postgres-{MAJOR}"
PSQL = f"/opt/postgresql/{MAJOR}/bin/psql"
STORE_IMAGE = "kanri-seaweedfs"
POOLER_IMAGE = "kanri-pgbouncer"


@pytest.fixture(scope="module")
def work_dir() -> Iterator[Path]:
    """The module's nodes and provisioner live here: a short path, unlike pytest's (the kubelet binds unix sockets,
    at most 107 bytes, deep inside a node's directory)."""
    work = Path(tempfile.mkdtemp(prefix="krp-"))
    yield work
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_nodes(control_plane: Endpoint, work_dir: Path) -> Iterator[RealCluster]:
    """Three real nodes in three zones holding the PostgreSQL image, the pooler's and CoreDNS's (a replica clones from
    and streams from ``<cluster>-rw`` by name); node 0 also the chart's operator image and the object store's."""
    with three_real_nodes(control_plane, work_dir, PREFIX, IMAGE, ("kanri-operator", STORE_IMAGE),
                          (POOLER_IMAGE,)) as nodes:  # fmt: skip
        yield nodes


@pytest.fixture(scope="module")
def cluster_dns(pg_nodes: RealCluster) -> Iterator[ClusterDNS]:
    with coredns_on(pg_nodes) as dns:
        yield dns


@pytest.fixture(scope="module")
def provisioner(pg_nodes: RealCluster, work_dir: Path) -> Iterator[LocalPathProvisioner]:
    with local_path_on(pg_nodes, work_dir, IMAGE) as local_path:
        yield local_path


@pytest.fixture(scope="module")
def images_env(pg_nodes: RealCluster) -> Iterator[str]:
    """``KANRI_POSTGRES_IMAGES`` and ``KANRI_PGBOUNCER_IMAGE`` naming the images as the nodes imported them (the
    operator reads them when built)."""
    ref = pg_nodes.nodes[0].image(IMAGE).ref
    with (
        environment(POSTGRES_IMAGES_ENV, json.dumps({"postgres": {str(MAJOR): ref}})),
        environment(pooler_children.IMAGE_ENV, pg_nodes.nodes[0].image(POOLER_IMAGE).ref),
    ):
        yield ref


@pytest_asyncio.fixture(loop_scope="session")
async def operator(
    control_plane: Endpoint,
    client: Client,
    namespace: str,
    images_env: str,
    provisioner: LocalPathProvisioner,
    cluster_dns: ClusterDNS,
) -> AsyncIterator[Operator]:
    await install_postgres_crd(client)
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances, poolers=True)
    finally:
        await instances.close()


async def ready(client: Client, namespace: str, name: str, replicas: int) -> dict[str, object] | None:
    status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    condition = get_condition(status.get("conditions"), "Ready")
    if condition is not None and condition["status"] == "True" and status.get("readyReplicas") == replicas:
        return status
    return None


async def diagnose(kubeconfig: Path, namespace: str) -> str:
    """What the namespace shows when a wait failed: pods, claims, the last Events and the instance's log tail."""
    parts = [
        await kubectl(kubeconfig, "-n", namespace, "get", "pods,pvc,postgrescluster", "-o", "wide", check=False),
        (await kubectl(kubeconfig, "-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False))[-4000:],
    ]
    pods = await kubectl(kubeconfig, "-n", namespace, "get", "pods", "-o", "name", check=False)
    for name in pods.split():
        parts.append(f"--- {name}\n" + (await kubectl(kubeconfig, "-n", namespace, "logs", name, "--tail=30",
                                                      "--all-containers", check=False))[-3000:])  # fmt: skip
    return "\n".join(parts)


async def psql(kubeconfig: Path, namespace: str, pod: str, host: str, sql: str, sslmode: str = "prefer") -> str:
    """``sql`` run by psql in ``pod`` against ``host`` as the app user; the password is read inside the pod from the
    mounted Secret (never on a command line)."""
    script = (
        f'PGSSLMODE="$3" PGPASSWORD="$(cat /etc/kanri/app/password)" {PSQL} -h "$1" '
        '-U "$(cat /etc/kanri/app/username)" -d app -Atc "$2"'
    )
    command = ["-n", namespace, "exec", pod, "-c", "postgres", "--", "bash", "-c", script, "psql", host, sql, sslmode]

    async def run() -> str | None:
        # kube-proxy programs a Service's endpoints a moment after the cluster says Ready: until then its rule
        # rejects the connection (nothing ran), and psql is asked again
        out = await kubectl(kubeconfig, *command, check=False)
        return None if "Connection refused" in out else out

    try:
        out = await eventually(run, timeout=30, interval=0.5)
    except NotYet as exc:
        raise AssertionError(f"psql through {host}: {exc}") from None
    assert "command terminated with exit code" not in out, out  # psql failed (kubectl appended its stderr)
    return out


async def pooler_ready(client: Client, namespace: str, name: str) -> dict[str, object] | None:
    """The pooler's status once Ready, else None."""
    status = (await client.get(POSTGRES_POOLER, name, namespace)).get("status") or {}
    condition = get_condition(status.get("conditions"), "Ready")
    return status if condition is not None and condition["status"] == "True" else None


def pgbouncer_processes() -> list[dict[str, str]]:
    """``/proc/PID/status`` of every process named pgbouncer on this machine (the real nodes' runc containers are
    its processes), as a field -> value map: what the runtime really gave them."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
            status = (proc / "status").read_text()
        except OSError:
            continue
        if argv0.endswith(b"/pgbouncer"):
            found.append({k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines() if ":" in line)})
    return found


async def assert_pgbouncer_confined(client: Client, namespace: str) -> None:
    """The pooler pod's PgBouncer runs as the image's uid 70, without privileges: no new privileges, a seccomp filter,
    no capability; the pod is Ready."""
    selector = ",".join(f"{k}={v}" for k, v in pooler_names.LABELS.selector("orders-pool").items())
    (pooler_pod,) = (await client.list(POD, namespace, label_selector=selector))[0]
    conditions = {c["type"]: c["status"] for c in pooler_pod["status"].get("conditions", [])}
    assert conditions.get("Ready") == "True", conditions
    (process,) = [p for p in pgbouncer_processes() if p["Uid"].split()[0] == str(pooler_children.UID)]
    assert process["Uid"].split() == [str(pooler_children.UID)] * 4, process["Uid"]
    assert process["Gid"].split() == [str(pooler_children.UID)] * 4, process["Gid"]
    assert process["NoNewPrivs"] == "1", process["NoNewPrivs"]
    assert process["Seccomp"] == "2", f"seccomp mode {process['Seccomp']} (2: filter)"
    assert int(process["CapEff"], 16) == 0, process["CapEff"]


def on_local_path(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    """A PostgresCluster of ``replicas`` on the module's image major, its volumes from local-path."""
    return cluster(name, namespace, replicas, version=MAJOR, storage={"size": "1Gi", "storageClassName": STORAGE_CLASS})


async def test_one_instance_on_a_local_path_volume_becomes_ready_and_serves_through_rw(
    control_plane: Endpoint, client: Client, operator: Operator, namespace: str
) -> None:
    kubeconfig = control_plane.kubeconfig
    started = time.monotonic()
    await client.create(POSTGRES_CLUSTER, on_local_path("orders", namespace, 1))
    async with operator.running(refresh=2.0):
        try:
            await eventually(lambda: ready(client, namespace, "orders", 1), timeout=150, interval=1)
        except NotYet as exc:
            raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
        print(f"PostgresCluster create -> Ready on a real node in {time.monotonic() - started:.1f} s")

        status = await client.get(POSTGRES_CLUSTER, "orders", namespace)
        primary_pod = f"{status['status']['currentPrimary']}-0"
        rw = str((await client.get(SERVICE, "orders-rw", namespace))["spec"]["clusterIP"])
        # through -rw's ClusterIP: kube-proxy's DNAT in the node's namespace, back to the pod itself (hairpin)
        await psql(kubeconfig, namespace, primary_pod, rw, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)")
        assert (await psql(kubeconfig, namespace, primary_pod, rw, "SELECT x FROM t")).split() == ["42"]
        # The root filesystem is read-only here (runc): barman-cloud-backup's first step, its staging directory,
        # found no writable place before the pod had a TMPDIR, and every base backup failed (the same call here)
        staging = "import tempfile; print(tempfile.mkdtemp(prefix='barman-cloud-backup-'))"
        out = await kubectl(kubeconfig, "-n", namespace, "exec", primary_pod, "-c", "postgres", "--",
                            "/opt/barman/bin/python3", "-c", staging, check=False)  # fmt: skip
        assert out.startswith("/run/kanri-tmp/barman-cloud-backup-"), out

        # a PostgresPooler (rw, TLS both ways) from the built kanri-pgbouncer image, in front of the same cluster
        started = time.monotonic()
        await client.create(POSTGRES_POOLER, {
            "apiVersion": POSTGRES_POOLER.api_version, "kind": "PostgresPooler",
            "metadata": {"name": "orders-pool", "namespace": namespace},
            "spec": {"cluster": "orders", "instances": 1, "type": "rw"}})  # fmt: skip
        try:
            await eventually(lambda: pooler_ready(client, namespace, "orders-pool"), timeout=120, interval=1)
        except NotYet as exc:
            raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
        print(f"PostgresPooler create -> Ready on a real node in {time.monotonic() - started:.1f} s")
        pooled = str((await client.get(SERVICE, "orders-pool", namespace))["spec"]["clusterIP"])
        # a pooled write over TLS to PgBouncer (sslmode=require), and PgBouncer's own server connection is TLS
        await psql(kubeconfig, namespace, primary_pod, pooled, "INSERT INTO t VALUES (43)", sslmode="require")
        ssl = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        assert (await psql(kubeconfig, namespace, primary_pod, pooled, ssl, sslmode="require")).split() == ["t"]
        rows = await psql(kubeconfig, namespace, primary_pod, rw, "SELECT x FROM t ORDER BY x")
        assert rows.split() == ["42", "43"]
        await assert_pgbouncer_confined(client, namespace)


async def test_three_instances_spread_over_the_nodes_replicate_and_switch_over(
    control_plane: Endpoint, client: Client, operator: Operator, namespace: str, pg_nodes: RealCluster
) -> None:
    kubeconfig = control_plane.kubeconfig
    started = time.monotonic()
    await client.create(POSTGRES_CLUSTER, on_local_path("trio", namespace, 3))
    async with operator.running(refresh=2.0):
        try:
            await eventually(lambda: ready(client, namespace, "trio", 3), timeout=180, interval=1)
        except NotYet as exc:
            raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
        print(f"3-instance PostgresCluster create -> Ready on three real nodes in {time.monotonic() - started:.1f} s")
        pods = await pods_of(client, namespace, "trio")
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(n.spec.name for n in pg_nodes.nodes)

        rw = str((await client.get(SERVICE, "trio-rw", namespace))["spec"]["clusterIP"])
        primary = (await client.get(POSTGRES_CLUSTER, "trio", namespace))["status"]["currentPrimary"]
        replica_pod = next(p["metadata"]["name"] for p in pods if not p["metadata"]["name"].startswith(f"{primary}-"))
        # from a replica's pod on another node: kube-proxy's DNAT there, routed across nodes to the primary
        await psql(kubeconfig, namespace, replica_pod, rw, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        await eventually(lambda: every_instance_has(client, namespace, "trio", [1]), timeout=60, interval=1)

        target = replica_pod.removesuffix("-0")
        await client.patch(POSTGRES_CLUSTER, "trio", {"metadata": {"annotations": {SWITCHOVER_TO: target}}}, namespace)

        async def switched() -> dict[str, object] | None:
            status = await ready(client, namespace, "trio", 3)
            return status if status is not None and status.get("currentPrimary") == target else None

        switch_started = time.monotonic()
        try:
            await eventually(switched, timeout=90, interval=0.5)
        except NotYet as exc:
            raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
        print(f"switchover {primary} -> {target}: Ready again in {time.monotonic() - switch_started:.1f} s")
        for node in pg_nodes.nodes:
            print(f"{node.spec.name} RSS (MiB) with one instance: {node_memory(node)}")
        await psql(kubeconfig, namespace, f"{primary}-0", rw, "INSERT INTO t VALUES (2)")
        await eventually(lambda: every_instance_has(client, namespace, "trio", [1, 2]), timeout=60, interval=1)


@pytest.fixture
def services_routed(control_plane: Endpoint, pg_nodes: RealCluster) -> Iterator[Callable[[RealNode], None]]:
    """Routes the cluster's Service addresses from the host through a node of the test's choosing (the host has no
    kube-proxy of its own), so a client on the host uses ``-rw``'s ClusterIP as an application would."""
    cidr = str(json.loads((control_plane.kubeconfig.parent / "config.json").read_text())["serviceCIDR"])
    try:
        yield lambda node: route_services(cidr, node.spec)
    finally:
        unroute_services(cidr)


FAULTS: dict[str, tuple[Callable[[RealNode], None], Callable[[RealNode], object]]] = {
    "stop": (RealNode.stop, RealNode.start),
    "freeze": (RealNode.freeze, RealNode.thaw),
    "partition": (RealNode.partition, RealNode.heal),
}
"""How each fault hits the primary's real node, and how the node comes back."""


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_primary_node_stopped_frozen_or_cut_off_fails_over_in_sync_mode_without_losing_an_acknowledged_commit(
    control_plane: Endpoint,
    client: Client,
    operator: Operator,
    namespace: str,
    pg_nodes: RealCluster,
    services_routed: Callable[[RealNode], None],
    fault: str,
) -> None:
    """The primary's node fails under a ledger writing through ``-rw`` — it loses power (kubelet, containerd, shims
    and PostgreSQL SIGKILLed at once; its volume stays), every process of it is frozen (its cgroup), or its network
    is cut off the other nodes and the control plane (nftables in its namespace) while it runs on: a replica is
    promoted, no acknowledged commit is missing, no two servers acknowledged at once, and once the node is back the
    old primary rejoins the new timeline. Which part stops the old primary differs: the power loss itself, its
    manager fencing itself at once when it finds it was frozen longer than its window, its manager fencing itself
    after 4 s without the API server or a standby."""
    inject, recover = FAULTS[fault]
    kubeconfig = control_plane.kubeconfig
    ha = on_local_path(FAILOVER_NAME, namespace, 3)
    ha["spec"] |= {"replication": {"mode": "Sync", "syncStandbys": 1}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, ha)
    async with operator.running(refresh=10.0):
        try:
            await eventually(lambda: ready(client, namespace, FAILOVER_NAME, 3), timeout=180, interval=1)
        except NotYet as exc:
            raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
        old, node_name, old_ip = await primary_and_node(client, namespace)
        victim = next(n for n in pg_nodes.nodes if n.spec.name == node_name)
        services_routed(next(n for n in pg_nodes.nodes if n is not victim))  # the clients' way in survives the fault
        async with workload(client, namespace, write_probe=True) as (ledger, watcher):
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
            fault_at = time.monotonic()
            inject(victim)
            try:
                record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=90, interval=0.5)
                first = await eventually(functools.partial(ack_elsewhere, ledger, fault_at, old_ip), timeout=30)
            except NotYet as exc:
                raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
            finally:
                if fault != "stop":  # a stopped node is started below, after writes on the new timeline
                    await asyncio.sleep(2)
                    recover(victim)
            print(f"real node {fault} (Sync): first commit on the new primary {first.at - fault_at:.2f} s after the "
                  f"fault; lastFailover {record}")  # fmt: skip
            if fault == "stop":
                await asyncio.sleep(2)  # writes on the new timeline the old primary must not have
                print(f"the stopped node is Ready again {recover(victim):.1f} s after its start")
            try:
                await eventually(lambda: rejoined(client, namespace, old), timeout=180, interval=1)
            except NotYet as exc:
                raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
        await wait_until_instances_agree(client, namespace, ledger)
        assert await lost_commits(client, namespace, ledger) == set()
        assert ledger.servers_overlap() == []
        assert watcher.double_writers() == []
        assert len(watcher.rounds) > 20
        print(f"ledger: {len(ledger.acks)} acknowledged, {len(ledger.unknown)} unanswered, {ledger.errors} errors")


async def test_a_backup_to_an_object_store_on_a_real_node_restores_into_a_new_cluster(
    control_plane: Endpoint,
    client: Client,
    namespace: str,
    pg_nodes: RealCluster,
    images_env: str,
    provisioner: LocalPathProvisioner,
    cluster_dns: ClusterDNS,
    services_routed: Callable[[RealNode], None],
) -> None:
    """Barman Cloud in the instance pod (read-only root, the scratch TMPDIR) archives WAL and takes the first base
    backup into SeaweedFS running as a pod on a real node; a new cluster bootstrapped from it holds the row written
    after the backup (replayed from the archive), and the first restore rehearsal passes."""
    kubeconfig = control_plane.kubeconfig
    first = pg_nodes.nodes[0]
    services_routed(first)  # the operator (in this process) talks to the store through its ClusterIP
    await install_postgres_crd(client)
    try:
        store = await start_store(client, namespace, node=first.spec.name, image=first.image(STORE_IMAGE).ref,
                                  storage_class=STORAGE_CLASS)  # fmt: skip
    except NotYet as exc:
        raise AssertionError(f"the object store: {exc}\n{await diagnose(kubeconfig, namespace)}") from None
    instances = HttpInstanceClient()
    operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=store.repository())
    source = on_local_path("vault", namespace, 1)
    source["spec"]["backup"] = {"retentionDays": 14}
    await client.create(POSTGRES_CLUSTER, source)
    try:
        async with operator.running(refresh=2.0):
            try:
                await eventually(lambda: ready(client, namespace, "vault", 1), timeout=150, interval=1)
                backup = await eventually(lambda: completed_backup(client, namespace, "vault"), timeout=180,
                                          interval=1)  # fmt: skip
            except NotYet as exc:
                raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
            print(f"first base backup on a real node: {backup.get('status')}")
            await write_row(client, namespace, "vault", 7)
            rows = await superuser_rows(client, namespace, "vault", "SELECT pg_walfile_name(pg_switch_wal())")
            segment = str(rows[0][0])
            await eventually(lambda: archived_segment(store, namespace, "vault", segment), timeout=120, interval=1)

            started = time.monotonic()
            copy = on_local_path("vault-copy", namespace, 1)
            copy["spec"]["bootstrap"] = {"recovery": {"source": "vault"}}
            await client.create(POSTGRES_CLUSTER, copy)
            try:
                await eventually(lambda: ready(client, namespace, "vault-copy", 1), timeout=240, interval=1)
            except NotYet as exc:
                raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None
            print(f"restore from the object store -> Ready in {time.monotonic() - started:.1f} s")
            user, password = await credentials(client, namespace, "vault-copy")
            assert await rows_through(await cluster_ip(client, namespace, "vault-copy-rw"), user, password) == [7]
            rehearsal = await eventually(lambda: first_rehearsal_of(client, namespace, "vault"), timeout=240,
                                         interval=1)  # fmt: skip
            assert rehearsal["result"] == "Succeeded", rehearsal
    finally:
        await instances.close()


async def completed_backup(client: Client, namespace: str, name: str) -> dict[str, Any] | None:
    backups = (await client.list(POSTGRES_BACKUP, namespace))[0]
    done = [b for b in backups if b["spec"]["cluster"] == name and (b.get("status") or {}).get("phase") == "Completed"]
    return done[0] if done else None


async def archived_segment(store: Store, namespace: str, name: str, segment: str) -> bool:
    return segment in segments(await store.keys_under(f"e2e/{namespace}/{name}/"))


async def first_rehearsal_of(client: Client, namespace: str, name: str) -> dict[str, Any] | None:
    """The restore rehearsal the operator ran by itself after the first backup, once recorded."""
    status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    record = (status.get("backup") or {}).get("lastRestoreTest") or {}
    return dict(record) if record.get("request") == FIRST_BACKUP else None


def node_memory(node: RealNode) -> dict[str, int]:
    """Resident memory of the node's processes by program (kubelet, containerd, shims, postgres, python3 ...),
    in MiB; shared pages count once per process, so the sums are upper bounds."""
    totals: dict[str, int] = {}
    for pid in node.pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss_kib = int(fields.get("VmRSS", "0 kB").split()[0])
        name = fields["Name"].strip()
        totals[name] = totals.get(name, 0) + rss_kib
    return {name: kib // 1024 for name, kib in sorted(totals.items()) if kib >= 1024}


#: Prints ``reached PORT`` when a TCP connection to HOST:PORT opens within 2 s (a traceback otherwise).
CONNECT = (
    "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); "
    "print('reached %s' % sys.argv[2])"
)


@pytest.fixture
def policy_agents(pg_nodes: RealCluster) -> Iterator[list[NetworkPolicyAgent]]:
    """A NetworkPolicy agent on every node (last in the module: from now on every policy is enforced)."""
    agents = [NetworkPolicyAgent(node) for node in pg_nodes.nodes]
    try:
        for agent in agents:
            agent.start()
        yield agents
    finally:
        for agent in agents:
            agent.stop()


def chart_objects(release_namespace: str, watched: str, operator_tag: str) -> list[dict[str, Any]]:
    """The Helm chart's operator for the images the nodes imported (``kanri.local/...``, never pulled), watching
    ``watched`` only (the in-process operator of the other tests watches theirs)."""
    values = ("image.registry=kanri.local", "image.pullPolicy=Never", f"image.tag={operator_tag}",
              "createNamespace=true", f"watchNamespaces={{{watched}}}",
              rf"nodeSelector.kubernetes\.io/hostname={PREFIX}-0")  # fmt: skip
    return template(*values, release="kanri", namespace=release_namespace)


async def reaches(kubeconfig: Path, namespace: str, pod: str, host: str, port: int) -> bool:
    out = await kubectl(kubeconfig, "-n", namespace, "exec", pod, "--", "python3", "-c", CONNECT, host, str(port),
                        check=False)  # fmt: skip
    return f"reached {port}" in out


async def test_the_charts_operator_pod_runs_a_cluster_under_its_enforced_network_policy(
    control_plane: Endpoint,
    client: Client,
    namespace: str,
    pg_nodes: RealCluster,
    provisioner: LocalPathProvisioner,
    cluster_dns: ClusterDNS,
    policy_agents: list[NetworkPolicyAgent],
) -> None:
    """Issue 27's "Done means": the operator's NetworkPolicy enforced — the operator's own pod (the chart's, from
    kanri-operator's image) reaches the instance API; a pod of the cluster's namespace reaches 5432 only; a pod of
    another namespace reaches neither."""
    kubeconfig = control_plane.kubeconfig
    await install_postgres_crd(client)
    first = pg_nodes.nodes[0]
    release = f"{namespace[:50]}-op"
    objects = chart_objects(release, namespace, first.image("kanri-operator").tag)
    chart = {"apiVersion": "v1", "kind": "List", "items": objects}
    await kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=chart)
    other = f"{namespace[:50]}-out"
    await kubectl(kubeconfig, "create", "namespace", other)
    try:
        await _policy_scenario(kubeconfig, client, namespace, release, other, first.image(IMAGE).ref)
    finally:
        await kubectl(kubeconfig, "delete", "-f", "-", "--ignore-not-found", "--wait=false", stdin=chart)
        await kubectl(kubeconfig, "delete", "namespace", other, "--wait=false")


async def _policy_scenario(
    kubeconfig: Path, client: Client, namespace: str, release: str, other: str, image: str
) -> None:
    started = time.monotonic()
    await client.create(POSTGRES_CLUSTER, on_local_path("fenced", namespace, 2))
    try:
        await eventually(lambda: ready(client, namespace, "fenced", 2), timeout=180, interval=1)
    except NotYet as exc:
        details = await diagnose(kubeconfig, namespace) + "\n" + await diagnose(kubeconfig, release)
        raise AssertionError(f"{exc}\n{details}") from None
    print(
        f"2 instances under the chart's operator and the enforced policy: Ready in {time.monotonic() - started:.1f} s"
    )
    pods = await pods_of(client, namespace, "fenced")
    target = str(pods[0]["status"]["podIP"])
    probe = ["sleep", "3600"]
    for where in (namespace, other):
        spec = pod("probe", pg_nodes_name(pods[0]), image, probe, restart="Always")
        await kubectl(kubeconfig, "-n", where, "create", "-f", "-", stdin=spec)
    for where in (namespace, other):
        await eventually(lambda where=where: running(kubeconfig, where, "probe"), timeout=60)  # type: ignore[misc]

    async def seen() -> dict[str, bool]:
        return {
            "same namespace 5432": await reaches(kubeconfig, namespace, "probe", target, 5432),
            "same namespace 8008": await reaches(kubeconfig, namespace, "probe", target, 8008),
            "other namespace 5432": await reaches(kubeconfig, other, "probe", target, 5432),
            "other namespace 8008": await reaches(kubeconfig, other, "probe", target, 8008),
        }

    expected = {"same namespace 5432": True, "same namespace 8008": False,
                "other namespace 5432": False, "other namespace 8008": False}  # fmt: skip

    async def as_expected() -> dict[str, bool] | None:
        found = await seen()
        return found if found == expected else None

    await eventually(as_expected, timeout=60, interval=1)  # each blocked port costs its 2 s connect timeout


def pg_nodes_name(pod_object: dict[str, Any]) -> str:
    return str(pod_object["spec"]["nodeName"])


async def running(kubeconfig: Path, namespace: str, name: str) -> bool:
    status = json.loads(await kubectl(kubeconfig, "-n", namespace, "get", "pod", name, "-o", "json"))["status"]
    return bool(status.get("phase") == "Running")
