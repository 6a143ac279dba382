"""The platform's priority-class list (kanri.postgres.pods.policy): a class outside it is left out and said."""

from __future__ import annotations

from typing import Any

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.pods.policy import REASON, allowed_spec


def spec(**template: Any) -> PostgresClusterSpec:
    body: dict[str, Any] = {"version": 16, "replicas": 1, "storage": {"size": "1Gi"}}
    if template:
        body["podTemplate"] = template
    return PostgresClusterSpec.model_validate(body)


def test_without_a_list_any_class_the_api_accepted_is_kept() -> None:
    wanted = spec(priorityClassName="tenant-high")
    assert allowed_spec(wanted, ()) == (wanted, None)


def test_a_listed_class_and_no_class_at_all_are_kept() -> None:
    listed = spec(priorityClassName="database-high")
    assert allowed_spec(listed, ("database-high", "database-normal")) == (listed, None)
    plain = spec()
    assert allowed_spec(plain, ("database-high",)) == (plain, None)
    other = spec(nodeSelector={"disk": "ssd"})
    assert allowed_spec(other, ("database-high",)) == (other, None)


def test_a_class_outside_the_list_is_left_out_of_the_pods_and_named_with_the_allowed_ones() -> None:
    wanted = spec(priorityClassName="preempt-everyone", nodeSelector={"disk": "ssd"})
    kept, problem = allowed_spec(wanted, ("database-normal", "database-high"))
    assert problem is not None
    assert problem.reason == REASON == "PriorityClassNotAllowed"
    assert "'preempt-everyone'" in problem.message
    assert "database-high, database-normal" in problem.message
    assert kept.pod_template is not None
    assert kept.pod_template.priority_class_name is None
    assert kept.pod_template.node_selector == {"disk": "ssd"}  # the rest of the template stays
    assert wanted.pod_template is not None
    assert wanted.pod_template.priority_class_name == "preempt-everyone"  # the spec itself is not changed
