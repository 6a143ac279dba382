"""The CA renewed before it expires (kanri.postgres.tls.rotation and the TLS step, issue 29 item 5): the phases, what
each one serves and trusts, and that every certificate served at any moment is trusted by every bundle handed out
from the phase before on (so no verifier that lags one phase behind fails a handshake)."""

from __future__ import annotations

import base64
import datetime as dt

from cryptography import x509

from kanri.postgres.tls import certificates as tls
from kanri.postgres.tls import rotation
from kanri.postgres.tls.rotation import TlsSettings, bundle, due, next_step
from kanri.postgres.tls.step import ensure_tls
from tests.unit.test_postgres_tls import NOW, Step, Store

SETTLE = dt.timedelta(seconds=20)
SETTINGS = TlsSettings(ca_lifetime=dt.timedelta(minutes=3), rotation_settle=SETTLE)


def secret_value(store: Store, name: str, key: str) -> bytes | None:
    found = store.objects.get(("Secret", name))
    raw = ((found or {}).get("data") or {}).get(key)
    return base64.b64decode(raw) if raw else None


def certificates(pem: bytes | None) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem else []


def trusted_by(cert_pem: bytes, bundle_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca in certificates(bundle_pem):
        try:
            cert.verify_directly_issued_by(ca)
        except Exception:  # InvalidSignature: another CA
            continue
        return True
    return False


def test_the_phases_follow_the_settle_time_and_start_only_when_the_ca_is_due() -> None:
    assert next_step("steady", None, False, NOW, SETTLE) == "none"
    assert next_step("steady", None, True, NOW, SETTLE) == "start"
    assert next_step("trusting", NOW, True, NOW + SETTLE / 2, SETTLE) == "none"
    assert next_step("trusting", NOW, True, NOW + SETTLE, SETTLE) == "reissue"
    assert next_step("reissued", NOW, False, NOW + SETTLE, SETTLE) == "finish"
    assert next_step("reissued", None, False, NOW + SETTLE, SETTLE) == "none"  # stamped first, then counted


def test_a_ca_is_due_when_a_third_of_its_lifetime_remains() -> None:
    ca = tls.build_ca("orders", "shop", NOW, dt.timedelta(days=30))  # valid from NOW - 5 min
    assert not due(ca.cert, NOW + dt.timedelta(days=19))
    assert due(ca.cert, NOW + dt.timedelta(days=21))
    assert bundle(b"A\n", None) == b"A\n"
    assert bundle(b"A\n", b"B\n") == b"A\nB\n"


async def test_a_rotation_trusts_both_then_moves_the_server_then_drops_the_old_ca_without_a_gap() -> None:
    store = Store()
    step = Step(store)
    told: list[str] = []

    async def announce(reason: str, message: str) -> None:
        told.append(reason)

    moments = [NOW + dt.timedelta(seconds=s) for s in range(0, 200, 5)]
    served: list[bytes] = []  # the server certificate after each pass
    bundles: list[bytes] = []  # the published ca.crt after each pass
    pods: list[bytes] = []  # the server Secret's ca.crt (what instances and replicas verify with)
    phases: list[str] = []
    for now in moments:
        assert await ensure_tls(step, 1, now=now, settings=SETTINGS, announce=announce) == []
        served.append(secret_value(store, "orders-server", "tls.crt") or b"")
        bundles.append(secret_value(store, "orders-ca", "ca.crt") or b"")
        pods.append(secret_value(store, "orders-server", "ca.crt") or b"")
        key = store.objects[("Secret", "orders-ca-key")]
        phases.append((key["metadata"].get("annotations") or {}).get(rotation.PHASE, "steady"))
    assert "trusting" in phases
    assert "reissued" in phases
    assert told[:2] == ["CARotationStarted", "CARotated"]
    first_ca = certificates(bundles[0])[0]
    final = certificates(bundles[phases.index("reissued") + phases[phases.index("reissued") :].index("steady")])
    assert len(final) == 1
    assert final[0] != first_ca  # a new CA, alone again
    for i in range(len(moments)):
        assert pods[i] == bundles[i]  # clients and instances are handed the same trust
        # what is served now is trusted by the bundle handed out now and by the one of the pass before (a verifier
        # whose mounted file has not changed yet)
        assert trusted_by(served[i], bundles[i]), (i, phases[i])
        if i:
            assert trusted_by(served[i], bundles[i - 1]), (i, phases[i], phases[i - 1])
    # every phase lasted the settle time: the server moved only after the bundle had held both CAs that long
    start = phases.index("trusting")
    new_ca = bundles[start].split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    assert not trusted_by(served[start], new_ca)
    moved = next(i for i in range(start, len(served)) if trusted_by(served[i], new_ca))
    assert moments[moved] - moments[start] >= SETTLE
    dropped = next(i for i in range(moved, len(served)) if len(certificates(bundles[i])) == 1)
    assert moments[dropped] - moments[moved] >= SETTLE


async def test_a_converged_cluster_writes_nothing_between_phases() -> None:
    store = Store()
    step = Step(store)
    settings = TlsSettings(ca_lifetime=dt.timedelta(minutes=30), rotation_settle=SETTLE)
    await ensure_tls(step, 1, now=NOW, settings=settings)
    store.writes.clear()
    await ensure_tls(step, 1, now=NOW + dt.timedelta(seconds=30), settings=settings)
    assert [w for w in store.writes if w[0] != "status"] == []
