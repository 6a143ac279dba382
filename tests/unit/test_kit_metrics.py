"""kanri.kit's one metric naming rule."""

from __future__ import annotations

import pytest

from kanri.kit import metric_name


def test_names_follow_operator_subject_quantity_unit() -> None:
    assert metric_name("postgres", "instance", "replication_lag", unit="bytes") == (
        "kanri_postgres_instance_replication_lag_bytes"
    )
    assert metric_name("kafka", "topic", "reconfigurations", counter=True) == "kanri_kafka_topic_reconfigurations_total"
    assert metric_name("cache", "cluster", "creation", unit="timestamp_seconds") == (
        "kanri_cache_cluster_creation_timestamp_seconds"
    )


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("Postgres", "cluster", "ready"), {}),
        (("postgres", "cluster", "lag_ms"), {"unit": "milliseconds"}),
        (("postgres", "cluster", "restarts_total"), {"counter": True}),
        (("postgres", "cluster", "downtime_seconds"), {}),
        (("postgres", "cluster", "creation"), {"unit": "timestamp_seconds", "counter": True}),
    ],
)
def test_names_that_break_the_rule_are_refused(args: tuple[str, str, str], kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"metric|counter"):
        metric_name(*args, **kwargs)  # type: ignore[arg-type]
