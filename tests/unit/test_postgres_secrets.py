"""Credentials: strong, generated once, and adopted as they are."""

from __future__ import annotations

import base64

from kanri.postgres.credentials.secrets import desired_secrets, secret_value


def test_four_secrets_with_the_contracts_names_types_and_users() -> None:
    specs = {s.name: s for s in desired_secrets("orders", "shopper")}
    assert {name: (s.type, s.username) for name, s in specs.items()} == {
        "orders-superuser": ("kubernetes.io/basic-auth", "postgres"),
        "orders-replication": ("kubernetes.io/basic-auth", "streaming_replica"),
        "orders-app": ("kubernetes.io/basic-auth", "shopper"),
        "orders-api": ("Opaque", None),
    }


def test_built_secrets_are_strong_random_labelled_and_unowned() -> None:
    app = next(s for s in desired_secrets("orders", "app") if s.name == "orders-app")
    first, second = app.build("orders", "shop"), app.build("orders", "shop")
    password = first["stringData"]["password"]
    assert len(password) >= 43
    assert password != second["stringData"]["password"]
    assert first["stringData"]["username"] == "app"
    assert first["metadata"]["labels"]["kanri.dev/cluster"] == "orders"
    assert "ownerReferences" not in first["metadata"]  # survives the cluster (Retain) and is adopted again
    api = next(s for s in desired_secrets("orders", "app") if s.name == "orders-api")
    assert set(api.build("orders", "shop")["stringData"]) == {"token"}


def test_values_are_read_from_api_data() -> None:
    secret = {"data": {"token": base64.b64encode(b"s3cr3t").decode()}}
    assert secret_value(secret, "token") == "s3cr3t"
    assert secret_value(secret, "password") is None
    assert secret_value(None, "token") is None
