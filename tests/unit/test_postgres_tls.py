"""TLS (issue 16 item 1): certificate names, the renewal decision, adoption, the instance's files and conf."""

from __future__ import annotations

import base64
import datetime as dt
import os
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry

from kanri.cli.up import connect_commands
from kanri.instance import tls as instance_tls
from kanri.instance.conf import render_hba, render_postgresql_conf
from kanri.instance.config import ClusterConfig, Credentials, Settings
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.tls import certificates as tls
from kanri.postgres.tls.step import ensure_tls
from kanri.runtime import ApiError, Kind
from kanri.runtime.kinds import POD, SECRET

Obj = dict[str, Any]
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def sans(cert: bytes) -> set[str]:
    alt = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return set(alt.value.get_values_for_type(x509.DNSName))


@pytest.fixture(scope="module")
def ca() -> tls.Issued:
    return tls.build_ca("orders", "shop", NOW)


def test_the_server_certificate_names_every_service_form_and_every_pod(ca: tls.Issued) -> None:
    dns = tls.dns_names("orders", "shop", ["orders-1", "orders-2"])
    server = tls.build_server(ca, "orders-rw", dns, NOW)
    names = sans(server.cert)
    for service in ("orders-rw", "orders-ro", "orders-r"):
        assert {service, f"{service}.shop", f"{service}.shop.svc", f"{service}.shop.svc.cluster.local"} <= names
    assert {"orders-1-0.orders-r.shop.svc", "orders-2-0.orders-r.shop.svc", "orders-1", "orders-2-0"} <= names
    cert = x509.load_pem_x509_certificate(server.cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert))
    assert tls.expiry(server.cert) == NOW + tls.SERVER_LIFETIME


def test_python_verifies_the_certificate_for_the_service_name_with_the_ca(ca: tls.Issued, tmp_path: Path) -> None:
    server = tls.build_server(ca, "orders-rw", tls.dns_names("orders", "shop", ["orders-1"]),
                              dt.datetime.now(dt.UTC))  # fmt: skip
    (tmp_path / "c.pem").write_bytes(server.cert)
    (tmp_path / "k.pem").write_bytes(server.key)
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")  # key and certificate belong together
    client = ssl.create_default_context(cadata=ca.cert.decode())
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert client.check_hostname


def test_the_longest_cluster_and_namespace_names_still_make_certificates() -> None:
    cluster, namespace = "c" * 40, "n" * 63  # the API's limits
    ca = tls.build_ca(cluster, namespace, NOW)
    server = tls.build_server(ca, f"{cluster}-rw", tls.dns_names(cluster, namespace, [f"{cluster}-12"]), NOW)
    assert f"{cluster}-12-0.{cluster}-r.{namespace}.svc" in sans(server.cert)


def test_renewal_is_due_once_a_third_of_the_lifetime_remains(ca: tls.Issued) -> None:
    dns = tls.dns_names("orders", "shop", ["orders-1"])
    server = tls.build_server(ca, "orders-rw", dns, NOW, dt.timedelta(days=300))
    assert tls.needs_renewal(server.cert, ca.cert, dns, NOW + dt.timedelta(days=199)) is None
    why = tls.needs_renewal(server.cert, ca.cert, dns, NOW + dt.timedelta(days=201))
    assert why is not None
    assert why.startswith("it expires at")


def test_renewal_is_due_for_a_new_instance_another_ca_or_garbage(ca: tls.Issued) -> None:
    dns = tls.dns_names("orders", "shop", ["orders-1"])
    server = tls.build_server(ca, "orders-rw", dns, NOW)
    grown = tls.dns_names("orders", "shop", ["orders-1", "orders-2"])
    assert tls.needs_renewal(server.cert, ca.cert, grown, NOW) == "it does not name orders-2"
    other = tls.build_ca("orders", "shop", NOW)
    assert tls.needs_renewal(server.cert, other.cert, dns, NOW) == "it is not signed by the cluster's CA"
    assert tls.needs_renewal(b"nonsense", ca.cert, dns, NOW) == "the certificate does not parse"


@dataclass
class Store:
    """The cache and client of one pass: objects by (kind, name); writes recorded."""

    objects: dict[tuple[str, str], Obj] = field(default_factory=dict)
    writes: list[tuple[str, str]] = field(default_factory=list)
    version: int = 0

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        return self.objects.get((kind.kind, name))

    def list(self, kind: Kind, namespace: str | None = None, labels: dict[str, str] | None = None) -> list[Obj]:
        return [o for (k, _), o in self.objects.items() if k == kind.kind]

    async def create(self, kind: Kind, obj: Obj) -> Obj:
        key = (kind.kind, obj["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409, {"reason": "AlreadyExists"})
        return self._store("create", key, obj)

    async def replace(self, kind: Kind, obj: Obj) -> Obj:
        return self._store("replace", (kind.kind, obj["metadata"]["name"]), obj)

    async def patch_status(self, kind: Kind, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        self.writes.append(("status", name))
        return {}

    def _store(self, verb: str, key: tuple[str, str], obj: Obj) -> Obj:
        self.version += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        self.objects[key] = obj
        self.writes.append((verb, key[1]))
        return obj


@dataclass
class Step:
    store: Store
    name: str = "orders"
    namespace: str = "shop"
    status: Obj = field(default_factory=dict)

    @property
    def cache(self) -> Any:
        return self.store

    @property
    def client(self) -> Any:
        return self.store

    def existing_instances(self) -> list[str]:
        return ["orders-1"]


def data(secret: Obj, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


async def test_the_step_generates_once_and_a_converged_cluster_writes_nothing() -> None:
    store = Store()
    step = Step(store)
    await ensure_tls(step, 2, now=NOW)
    assert [w for w in store.writes if w[0] != "status"] == [
        ("create", "orders-ca-key"), ("create", "orders-server"), ("create", "orders-ca")]  # fmt: skip
    server = store.objects[("Secret", "orders-server")]
    assert server["type"] == "kubernetes.io/tls"
    assert "orders-2" in sans(data(server, "tls.crt"))  # the spec's second instance, before its pod exists
    published = store.objects[("Secret", "orders-ca")]
    assert set(published["data"]) == {"ca.crt"}  # the CA key is never published
    assert data(published, "ca.crt") == data(server, "ca.crt")
    assert step.status["tls"]["serverCertificateExpires"] == "2027-12-01T00:00:00Z"
    store.writes.clear()
    await ensure_tls(step, 2, now=NOW + dt.timedelta(days=30))
    assert store.writes == []


async def test_a_managed_certificate_due_for_renewal_is_reissued_with_the_same_ca() -> None:
    store = Store()
    step = Step(store)
    await ensure_tls(step, 1, now=NOW)
    before = data(store.objects[("Secret", "orders-server")], "tls.crt")
    store.writes.clear()
    await ensure_tls(step, 1, now=NOW + dt.timedelta(days=250))
    assert ("replace", "orders-server") in store.writes
    after = store.objects[("Secret", "orders-server")]
    assert data(after, "tls.crt") != before
    assert tls.needs_renewal(data(after, "tls.crt"), data(after, "ca.crt"), [], NOW + dt.timedelta(days=250)) is None
    assert ("replace", "orders-ca") not in store.writes  # same CA: clients keep trusting


async def test_an_adopted_server_secret_is_never_overwritten_and_its_ca_is_published() -> None:
    user_ca = tls.build_ca("mine", "shop", NOW)
    expired = tls.build_server(user_ca, "x", ["x"], NOW - dt.timedelta(days=400), dt.timedelta(days=365))
    store = Store()
    mine = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "orders-server", "namespace": "shop", "resourceVersion": "1"},
            "data": {k: base64.b64encode(v).decode() for k, v in
                     {"tls.crt": expired.cert, "tls.key": expired.key, "ca.crt": user_ca.cert}.items()}}  # fmt: skip
    store.objects[("Secret", "orders-server")] = mine
    step = Step(store)
    await ensure_tls(step, 3, now=NOW)
    assert store.objects[("Secret", "orders-server")] is mine  # expired, missing names: still the user's business
    assert [w for w in store.writes if w[0] != "status"] == [("create", "orders-ca")]
    assert data(store.objects[("Secret", "orders-ca")], "ca.crt") == user_ca.cert
    assert ("Secret", "orders-ca-key") not in store.objects


async def test_an_adopted_published_ca_is_never_overwritten() -> None:
    store = Store()
    theirs = {"metadata": {"name": "orders-ca", "resourceVersion": "1"}, "data": {"ca.crt": "eA=="}}
    store.objects[("Secret", "orders-ca")] = theirs
    await ensure_tls(Step(store), 1, now=NOW)
    assert store.objects[("Secret", "orders-ca")] is theirs


async def test_the_instance_client_verifies_the_pods_that_serve_tls() -> None:
    store = Store()
    step = Step(store)
    tls_pod = {
        "metadata": {"name": "orders-1-0"},
        "status": {"podIP": "10.0.0.1"},
        "spec": {"containers": [{"env": [{"name": "KANRI_TLS_DIR", "value": "/etc/kanri/tls"}]}]},
    }
    old_pod = {"metadata": {"name": "orders-2-0"}, "status": {"podIP": "10.0.0.2"}, "spec": {"containers": [{}]}}
    store.objects[("Pod", "orders-1-0")] = tls_pod
    store.objects[("Pod", "orders-2-0")] = old_pod  # fmt: skip
    client = HttpInstanceClient()
    await ensure_tls(step, 2, client, now=NOW)
    assert client._url("10.0.0.1", "/status") == "https://10.0.0.1:8008/status"
    assert client._url("10.0.0.2", "/status") == "http://10.0.0.2:8008/status"  # a pod from before TLS
    options = client._tls("10.0.0.1")
    assert options["server_hostname"] == "orders-rw"
    assert options["ssl"].verify_mode == ssl.CERT_REQUIRED
    client.trust("shop/orders", [], None, "orders-rw")
    assert client._url("10.0.0.1", "/status").startswith("http://")
    assert POD.kind == "Pod"
    assert SECRET.kind == "Secret"


def instance_settings(tmp_path: Path, mounted: bool = True) -> Settings:
    env = {"KANRI_CLUSTER": "orders", "POD_NAME": "orders-2", "KANRI_SOCKET_DIR": str(tmp_path / "run"),
           "PGDATA": str(tmp_path / "data")}  # fmt: skip
    if mounted:
        env["KANRI_TLS_DIR"] = str(tmp_path / "mount")
    return Settings.from_env(env)


def mount(tmp_path: Path, server: tls.Issued, ca: tls.Issued) -> None:
    (tmp_path / "mount").mkdir(exist_ok=True)
    for name, value in {"tls.crt": server.cert, "tls.key": server.key, "ca.crt": ca.cert}.items():
        (tmp_path / "mount" / name).write_bytes(value)
        os.chmod(tmp_path / "mount" / name, 0o644)


def test_the_instance_copies_the_mount_to_private_files_and_sees_a_renewal(ca: tls.Issued, tmp_path: Path) -> None:
    settings = instance_settings(tmp_path)
    assert instance_tls.install(settings) is False  # nothing mounted yet: TLS stays off
    assert not instance_tls.enabled(settings)
    server = tls.build_server(ca, "orders-rw", ["orders-rw"], NOW)
    mount(tmp_path, server, ca)
    assert instance_tls.install(settings) is True
    assert instance_tls.enabled(settings)
    key = instance_tls.installed(settings) / "tls.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_bytes() == server.key
    assert instance_tls.install(settings) is False  # converged: no reload
    mount(tmp_path, tls.build_server(ca, "orders-rw", ["orders-rw"], NOW), ca)
    assert instance_tls.install(settings) is True  # renewed: the manager reloads PostgreSQL
    assert instance_tls.server_context(settings) is not None


def test_with_tls_postgres_speaks_it_and_pg_hba_refuses_plaintext_tcp(ca: tls.Issued, tmp_path: Path) -> None:
    settings = instance_settings(tmp_path)
    mount(tmp_path, tls.build_server(ca, "orders-rw", ["orders-rw"], NOW), ca)
    instance_tls.install(settings)
    replication = Credentials("streaming_replica", "pw")
    config = ClusterConfig(instances=("orders-1", "orders-2"))
    conf = render_postgresql_conf(settings, config, {}, replica=True, replication=replication, tls=True)
    run = tmp_path / "run" / "tls"
    assert "ssl = 'on'" in conf
    assert f"ssl_key_file = '{run}/tls.key'" in conf
    assert f"sslmode=verify-full sslrootcert={run}/ca.crt" in conf  # replication checks the primary's name
    hba = [line.split() for line in render_hba(replication, tls=True).splitlines() if not line.startswith("#")]
    assert hba[0][:2] == ["local", "all"]  # the socket is unchanged
    assert hba[1] == ["hostnossl", "all", "all", "all", "reject"]
    assert all(line[0] == "hostssl" for line in hba[2:])
    plain = render_hba(replication)
    assert "hostssl" not in plain
    assert "reject" not in plain
    assert "ssl =" not in render_postgresql_conf(settings, config, {}, replica=True, replication=replication)


def test_without_a_mount_the_instance_stays_plain(tmp_path: Path) -> None:
    settings = instance_settings(tmp_path, mounted=False)
    assert settings.tls_dir is None
    assert instance_tls.install(settings) is False
    assert instance_tls.client_options(settings) == {}
    assert instance_tls.server_context(settings) is None


def test_kanri_up_prints_a_verify_full_psql_with_the_published_ca() -> None:
    fetch_ca, psql = connect_commands("kubectl", "demo", "shop", "app")
    assert "get secret -n shop demo-ca -o jsonpath='{.data.ca\\.crt}' | base64 -d > demo-ca.crt" in fetch_ca
    assert '"host=demo-rw.shop.svc hostaddr=127.0.0.1 port=5432 dbname=app sslmode=verify-full' in psql
    assert "sslrootcert=demo-ca.crt" in psql
    assert psql.startswith("PGPASSWORD=$(")  # the password comes from the Secret at run time, never printed


async def test_the_expiry_metric_follows_the_mounted_certificate_and_goes_with_the_cluster() -> None:
    registry = CollectorRegistry()
    metrics = PostgresMetrics(registry)
    await ensure_tls(Step(Store()), 1, metrics=metrics, now=NOW)
    name = "kanri_postgres_tls_certificate_expiry_timestamp_seconds"
    labels = {"namespace": "shop", "cluster": "orders"}
    assert registry.get_sample_value(name, labels) == (NOW + tls.SERVER_LIFETIME).timestamp()
    metrics.observe({"metadata": {"namespace": "shop", "name": "orders"}}, {})  # a pass does not drop it
    assert registry.get_sample_value(name, labels) is not None
    metrics.forget("shop", "orders")
    assert registry.get_sample_value(name, labels) is None
