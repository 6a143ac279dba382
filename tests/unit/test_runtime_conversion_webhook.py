"""The conversion webhook's pure parts: ConversionReview answers and the certificates it serves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509

from kanri.runtime._conversion import Conversions
from kanri.runtime._conversion_webhook import WebhookOptions, review_response
from kanri.runtime._webhook_certs import WebhookCertificates, issue_certificates
from tests.unit.test_runtime_conversion import HUB, PETS, SPOKE, pet_v2

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
CONVERSIONS = Conversions(PETS)


def review(*objects: Any, desired: str = SPOKE) -> dict[str, Any]:
    request = {"uid": "705ab4f5", "desiredAPIVersion": desired, "objects": list(objects)}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": request}


def test_every_object_is_converted_in_order_and_the_uid_echoed() -> None:
    answer = review_response(CONVERSIONS, review(pet_v2(name="a"), pet_v2(name="b")))
    assert answer["apiVersion"] == "apiextensions.k8s.io/v1"
    assert answer["kind"] == "ConversionReview"
    response = answer["response"]
    assert (response["uid"], response["result"]) == ("705ab4f5", {"status": "Success"})
    assert [(o["apiVersion"], o["spec"]["petName"]) for o in response["convertedObjects"]] == [
        (SPOKE, "a"),
        (SPOKE, "b"),
    ]


def test_a_failure_is_an_answer_naming_the_object_not_a_crash() -> None:
    broken = pet_v2()
    broken["metadata"] = {"name": "rex", "namespace": "pets"}
    answer = review_response(CONVERSIONS, review(pet_v2(name="a"), broken))["response"]
    assert answer["uid"] == "705ab4f5"
    assert answer["convertedObjects"] == []
    assert answer["result"]["status"] == "Failure"
    assert answer["result"]["message"] == (
        f"converting Pet pets/rex to {SPOKE}: invalid as {HUB}: spec.name: Field required"
    )


def test_garbage_objects_and_unknown_kinds_fail_with_a_message() -> None:
    for junk in ("not an object", {"kind": "Dog", "apiVersion": HUB}, {}):
        answer = review_response(CONVERSIONS, review(junk))["response"]
        assert answer["result"]["status"] == "Failure", junk
        assert answer["result"]["message"].startswith("converting "), answer


def test_an_empty_review_succeeds_with_no_objects() -> None:
    assert review_response(CONVERSIONS, review())["response"]["convertedObjects"] == []


def test_the_serving_certificate_is_signed_by_the_bundles_first_ca_and_names_the_hosts() -> None:
    certs = issue_certificates(("op.ops.svc",), ("127.0.0.1",), now=NOW, valid_for=timedelta(days=90))
    ca = x509.load_pem_x509_certificates(certs.ca_bundle)
    assert len(ca) == 1
    certs.serving.verify_directly_issued_by(ca[0])
    assert certs.covers(("op.ops.svc",), ("127.0.0.1",))
    assert not certs.covers(("other.ops.svc",), ())
    assert certs.serving.not_valid_after_utc == NOW + timedelta(days=90)


def test_renewal_is_due_with_a_third_of_the_lifetime_left() -> None:
    certs = issue_certificates(("op.ops.svc",), now=NOW, valid_for=timedelta(days=90))
    lifetime = timedelta(days=90, minutes=5)  # valid from five minutes before NOW
    assert not certs.due(NOW + lifetime * 2 / 3 - timedelta(days=1))
    assert certs.due(NOW + lifetime * 2 / 3 + timedelta(minutes=1))


def test_a_rotation_keeps_the_previous_ca_trusted_until_it_expires() -> None:
    first = issue_certificates(("op.ops.svc",), now=NOW, valid_for=timedelta(days=90))
    second = issue_certificates(("op.ops.svc",), now=NOW + timedelta(days=61), valid_for=timedelta(days=90),
                                previous=first)  # fmt: skip
    new_ca, old_ca = x509.load_pem_x509_certificates(second.ca_bundle)
    second.serving.verify_directly_issued_by(new_ca)
    first.serving.verify_directly_issued_by(old_ca)  # a replica still serving `first` stays trusted
    third = issue_certificates(("op.ops.svc",), now=NOW + timedelta(days=200), valid_for=timedelta(days=90),
                               previous=first)  # fmt: skip
    assert len(x509.load_pem_x509_certificates(third.ca_bundle)) == 1  # an expired CA is dropped


def test_certificates_round_trip_through_secret_data() -> None:
    certs = issue_certificates(("op.ops.svc",), now=NOW, valid_for=timedelta(days=1))
    assert WebhookCertificates.from_secret({"data": certs.to_secret_data()}) == certs
    assert WebhookCertificates.from_secret({"data": {"ca.crt": "eA=="}}) is None


def test_options_name_the_service_or_the_url_and_the_hosts_the_certificate_needs() -> None:
    service = WebhookOptions(namespace="ops", secret="op-webhook", service="op")
    assert service.client_config() == {"service": {"name": "op", "namespace": "ops", "path": "/convert", "port": 9443}}
    assert service.hosts() == (("op.ops.svc", "op.ops.svc.cluster.local", "op.ops"), ())
    url = WebhookOptions(namespace="ops", secret="op-webhook", url="https://127.0.0.1:9443/convert")
    assert (url.client_config(), url.hosts()) == ({"url": "https://127.0.0.1:9443/convert"}, ((), ("127.0.0.1",)))
    with pytest.raises(ValueError, match="exactly one of service= or url="):
        WebhookOptions(namespace="ops", secret="s")
