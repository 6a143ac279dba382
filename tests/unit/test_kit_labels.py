"""kanri.kit label sets: an operator's selectors never match another operator's objects of the same name."""

from __future__ import annotations

import pytest

from kanri.kit import APP_NAME, LabelSet
from kanri.runtime import Request

PG = LabelSet("postgres.kanri.dev", "postgresql")
VALKEY = LabelSet("cache.kanri.dev", "valkey")


def test_labels_carry_the_operator_domain_and_app_name() -> None:
    assert PG.labels("orders", instance="orders-1") == {
        "postgres.kanri.dev/cluster": "orders",
        "postgres.kanri.dev/instance": "orders-1",
        APP_NAME: "postgresql",
        "app.kubernetes.io/instance": "orders",
        "app.kubernetes.io/managed-by": "kanri",
    }


def test_a_selector_never_matches_another_operators_child_of_the_same_name() -> None:
    valkey_pod = {"metadata": {"labels": VALKEY.labels("orders")}}
    assert VALKEY.matches(valkey_pod, "orders")
    assert not PG.matches(valkey_pod, "orders")


def test_a_lookalike_with_the_owner_key_but_another_app_name_is_not_selected() -> None:
    # the owner key alone (what kanri.dev/cluster was) is not enough: app.kubernetes.io/name must say postgresql
    lookalike = {"metadata": {"labels": {"postgres.kanri.dev/cluster": "orders", APP_NAME: "valkey"}}}
    assert not PG.matches(lookalike, "orders")


def test_selector_text_is_a_label_selector_query() -> None:
    assert PG.selector_text("db") == "app.kubernetes.io/name=postgresql,postgres.kanri.dev/cluster=db"


@pytest.mark.parametrize(("domain", "app"), [("kanri", "x"), ("Postgres.kanri.dev", "x"), ("a.dev", "no spaces")])
def test_a_bad_domain_or_app_name_is_refused_at_construction(domain: str, app: str) -> None:
    with pytest.raises(ValueError, match="label"):
        LabelSet(domain, app)


def test_a_bad_label_value_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid label"):
        PG.selector("x" * 64)


def test_kept_data_maps_back_to_its_owner_only_when_it_is_this_operators() -> None:
    secret = {"metadata": {"namespace": "ns", "labels": PG.labels("orders")}}
    assert PG.owner_requests(secret) == [Request("ns", "orders")]
    assert VALKEY.owner_requests(secret) == []
    assert PG.owner_requests({"metadata": {"namespace": "ns"}}) == []
