"""The webhook certificate of an operator whose Service lives in a long namespace (the chart's
<release>-operator-webhook in a 47-character namespace): its DNS names pass X.509's 64-character limit on a common
name, which crashed every replica before it served (found by the chart's e2e)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.x509.oid import NameOID

from kanri.runtime import WebhookOptions
from kanri.runtime._webhook_certs import issue_certificates


def test_a_service_name_longer_than_a_common_name_still_gets_a_certificate_naming_it() -> None:
    namespace = "test-the-chart-serves-v1beta1-through-th-003784"
    options = WebhookOptions(namespace=namespace, secret="s", service="kanri-42472b-operator-webhook")
    dns_names, ips = options.hosts()
    assert len(dns_names[0]) > 64
    certs = issue_certificates(dns_names, ips, now=datetime.now(UTC), valid_for=timedelta(days=90))
    cert = x509.load_pem_x509_certificate(certs.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == list(dns_names)  # what clients verify
    (common_name,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert common_name.value == "kanri-42472b-operator-webhook"
