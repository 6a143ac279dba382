"""The pure parts of kanri.runtime's CRD upgrade: version order, the spec digest, what a replace keeps.

The decisions against a real API server are tests/integration/test_runtime_crd_upgrade.py."""

from __future__ import annotations

from typing import Any

import pytest

from kanri.runtime._crd_upgrade import (
    DIGEST_ANNOTATION,
    VERSION_ANNOTATION,
    _keep_ca_bundle,
    _stamped,
    crd_digest,
    version_key,
)


def crd(bundle: str | None = None, extra: str = "") -> dict[str, Any]:
    client_config: dict[str, object] = {"url": "https://127.0.0.1:9443/convert"}
    if bundle is not None:
        client_config["caBundle"] = bundle
    conversion = {"strategy": "Webhook", "webhook": {"clientConfig": client_config, "conversionReviewVersions": ["v1"]}}
    return {
        "metadata": {"name": "widgets.example.dev"},
        "spec": {"group": "example.dev" + extra, "conversion": conversion},
    }


@pytest.mark.parametrize(
    ("older", "newer"),
    [("0.1.0", "0.2.0"), ("0.9.9", "0.10.0"), ("v1.2.3", "1.2.4"), ("1.2", "1.2.1"), ("0.2.0-rc.1", "0.3.0")],
)
def test_versions_order_numerically(older: str, newer: str) -> None:
    assert version_key(older) < version_key(newer)


def test_a_pre_release_orders_as_its_release_and_garbage_is_refused() -> None:
    assert version_key("0.2.0-rc.1") == version_key("0.2.0")
    with pytest.raises(ValueError, match="not a version"):
        version_key("latest")


def test_the_digest_ignores_the_ca_bundle_but_not_the_spec() -> None:
    assert crd_digest(crd()) == crd_digest(crd("Q0E="))
    assert crd_digest(crd()) != crd_digest(crd(extra="x"))


def test_a_stamped_copy_leaves_the_input_alone_and_a_replace_keeps_the_installed_bundle() -> None:
    mine = crd()
    body = _stamped(mine, "0.2.0")
    assert body["metadata"]["annotations"] == {VERSION_ANNOTATION: "0.2.0", DIGEST_ANNOTATION: crd_digest(mine)}
    assert "annotations" not in mine["metadata"]
    _keep_ca_bundle(body, crd("T0xE"))
    assert body["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] == "T0xE"
    assert "caBundle" not in mine["spec"]["conversion"]["webhook"]["clientConfig"]
    # A bundle the operator names itself wins.
    named = _stamped(crd("TkVX"), "0.2.0")
    _keep_ca_bundle(named, crd("T0xE"))
    assert named["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] == "TkVX"
