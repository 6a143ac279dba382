"""TLS Secrets the operator reads are validated (issue 33 item 5): each fault names the Secret and the key, never a
value, and a wrong Secret is reported instead of crashing the pass (the non-PEM ``ca.crt`` SSLError)."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kanri.contract.secrets import SecretProblem
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.tls import certificates as tls
from kanri.postgres.tls.step import ensure_tls
from tests.unit.test_postgres_tls import NOW, Obj, Step, Store

NOT_PEM = b"certainly not a certificate"


@pytest.fixture(scope="module")
def ca() -> tls.Issued:
    return tls.build_ca("orders", "shop", NOW)


@pytest.fixture(scope="module")
def server(ca: tls.Issued) -> tls.Issued:
    return tls.build_server(ca, "orders-rw", ["orders-rw"], NOW)


def keys(found: list[SecretProblem]) -> list[tuple[str, str]]:
    return [(p.key, p.message) for p in found]


def test_a_good_server_secret_has_no_problem(ca: tls.Issued, server: tls.Issued) -> None:
    assert tls.server_problems({"tls.crt": server.cert, "tls.key": server.key, "ca.crt": ca.cert}, NOW) == []


def test_each_server_key_that_is_missing_or_not_pem_is_named(ca: tls.Issued, server: tls.Issued) -> None:
    assert keys(tls.server_problems({}, NOW)) == [
        ("tls.crt", "is missing"), ("tls.key", "is missing"), ("ca.crt", "is missing")]  # fmt: skip
    found = tls.server_problems({"tls.crt": server.cert, "tls.key": server.key, "ca.crt": NOT_PEM}, NOW)
    assert keys(found) == [("ca.crt", "is not a PEM certificate")]
    found = tls.server_problems({"tls.crt": NOT_PEM, "tls.key": NOT_PEM, "ca.crt": ca.cert}, NOW)
    assert keys(found) == [("tls.crt", "is not a PEM certificate"), ("tls.key", "is not a PEM private key")]


def test_a_key_of_another_certificate_an_expired_one_and_a_foreign_ca_are_named(
    ca: tls.Issued, server: tls.Issued
) -> None:
    other = tls.build_ca("other", "shop", NOW)
    found = tls.server_problems({"tls.crt": server.cert, "tls.key": other.key, "ca.crt": ca.cert}, NOW)
    assert keys(found) == [("tls.key", "does not belong to the certificate in tls.crt")]
    later = NOW + dt.timedelta(days=400)
    found = tls.server_problems({"tls.crt": server.cert, "tls.key": server.key, "ca.crt": ca.cert}, later)
    assert [p.key for p in found] == ["tls.crt"]
    assert found[0].message.startswith("expired at 2027-")
    found = tls.server_problems({"tls.crt": server.cert, "tls.key": server.key, "ca.crt": other.cert}, NOW)
    assert keys(found) == [("ca.crt", "does not issue tls.crt (the operator verifies the instances with it)")]


def test_a_chain_through_an_intermediate_is_issued_by_its_root(ca: tls.Issued, server: tls.Issued) -> None:
    # cert-manager's layout: tls.crt holds the leaf then its issuer; ca.crt the root
    found = tls.server_problems({"tls.crt": server.cert + ca.cert, "tls.key": server.key, "ca.crt": ca.cert}, NOW)
    assert found == []


def test_an_encrypted_key_is_named_as_such(ca: tls.Issued, server: tls.Issued) -> None:
    loaded = serialization.load_pem_private_key(server.key, password=None)
    assert isinstance(loaded, ec.EllipticCurvePrivateKey)
    locked = loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"pass"))  # fmt: skip
    found = tls.server_problems({"tls.crt": server.cert, "tls.key": locked, "ca.crt": ca.cert}, NOW)
    assert [p.key for p in found] == ["tls.key"]
    assert "encrypted" in found[0].message


def test_the_ca_key_pair_and_the_published_ca_are_checked(ca: tls.Issued) -> None:
    other = tls.build_ca("other", "shop", NOW)
    assert tls.ca_key_problems({"ca.crt": ca.cert, "ca.key": ca.key}) == []
    assert keys(tls.ca_key_problems({"ca.crt": ca.cert, "ca.key": other.key})) == [
        ("ca.key", "does not belong to ca.crt")
    ]
    assert keys(tls.ca_key_problems({"ca.crt": NOT_PEM})) == [("ca.crt", "is not a PEM certificate"),
                                                             ("ca.key", "is missing")]  # fmt: skip
    assert tls.ca_problems({"ca.crt": ca.cert}) == []
    assert keys(tls.ca_problems({"ca.crt": NOT_PEM})) == [("ca.crt", "is not a PEM certificate")]


def secret(name: str, data: dict[str, bytes], managed: bool = False) -> Obj:
    meta: Obj = {"name": name, "namespace": "shop", "resourceVersion": "1"}
    if managed:
        meta["annotations"] = {tls.MANAGED: "true"}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": meta,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}  # fmt: skip


def tls_pod() -> Obj:
    return {"metadata": {"name": "orders-1-0"}, "status": {"podIP": "10.0.0.1"},
            "spec": {"containers": [{"env": [{"name": "KANRI_TLS_DIR", "value": "/etc/kanri/tls"}]}]}}  # fmt: skip


async def test_an_adopted_server_secret_with_a_non_pem_ca_is_reported_not_raised(
    ca: tls.Issued, server: tls.Issued
) -> None:
    store = Store()
    store.objects[("Secret", "orders-server")] = secret(
        "orders-server", {"tls.crt": server.cert, "tls.key": server.key, "ca.crt": NOT_PEM}
    )
    store.objects[("Pod", "orders-1-0")] = tls_pod()
    client = HttpInstanceClient()
    found = await ensure_tls(Step(store), 1, client, now=NOW)  # before: ssl.SSLError out of the pass
    assert [(p.reason, p.message) for p in found] == [
        ("InvalidServerSecret", "Secret orders-server key ca.crt is not a PEM certificate")
    ]
    assert store.objects[("Secret", "orders-server")]["data"]["ca.crt"] == base64.b64encode(NOT_PEM).decode()
    assert ("Secret", "orders-ca") not in store.objects  # a CA that does not parse is not published
    assert client._tls("10.0.0.1") == {}  # not trusted


async def test_a_managed_server_secret_whose_key_was_spoiled_is_reissued(ca: tls.Issued, server: tls.Issued) -> None:
    store = Store()
    store.objects[("Secret", "orders-ca-key")] = secret("orders-ca-key", {"ca.crt": ca.cert, "ca.key": ca.key}, True)
    store.objects[("Secret", "orders-server")] = secret(
        "orders-server", {"tls.crt": server.cert, "tls.key": NOT_PEM, "ca.crt": ca.cert}, managed=True
    )
    found = await ensure_tls(Step(store), 1, now=NOW)
    assert found == []
    assert ("replace", "orders-server") in store.writes
    replaced = store.objects[("Secret", "orders-server")]["data"]
    data = {k: base64.b64decode(v) for k, v in replaced.items()}
    assert tls.server_problems(data, NOW) == []


async def test_an_unusable_ca_key_pair_is_reported_and_nothing_is_signed(ca: tls.Issued, server: tls.Issued) -> None:
    store = Store()
    store.objects[("Secret", "orders-ca-key")] = secret("orders-ca-key", {"ca.crt": ca.cert, "ca.key": NOT_PEM}, True)
    found = await ensure_tls(Step(store), 1, now=NOW)
    assert [(p.reason, p.message) for p in found] == [
        ("InvalidCASecret", "Secret orders-ca-key key ca.key is not a PEM private key")
    ]
    assert [w for w in store.writes if w[0] != "status"] == []


async def test_a_users_published_ca_that_is_not_the_servers_is_named(ca: tls.Issued, server: tls.Issued) -> None:
    other = tls.build_ca("other", "shop", NOW)
    store = Store()
    store.objects[("Secret", "orders-server")] = secret(
        "orders-server", {"tls.crt": server.cert, "tls.key": server.key, "ca.crt": ca.cert}
    )
    store.objects[("Secret", "orders-ca")] = secret("orders-ca", {"ca.crt": other.cert})
    found = await ensure_tls(Step(store), 1, now=NOW)
    assert [p.reason for p in found] == ["InvalidCASecret"]
    assert found[0].message.startswith("Secret orders-ca key ca.crt is not the CA of orders-server")
    store.objects[("Secret", "orders-ca")] = secret("orders-ca", {"ca.crt": NOT_PEM})
    found = await ensure_tls(Step(store), 1, now=NOW)
    assert [(p.reason, p.message) for p in found] == [
        ("InvalidCASecret", "Secret orders-ca key ca.crt is not a PEM certificate")
    ]
