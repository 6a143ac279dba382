"""Which instances a cluster has: numbering, scale-down victims, hibernation."""

from __future__ import annotations

from kanri.postgres.topology.plan import plan_instances


def names(*numbers: int) -> list[str]:
    return [f"db-{n}" for n in numbers]


def test_a_new_cluster_starts_at_one_with_the_first_as_primary() -> None:
    plan = plan_instances("db", 3, [], None)
    assert plan.instances == names(1, 2, 3)
    assert plan.added == names(1, 2, 3)
    assert plan.primary == "db-1"
    assert plan.replicas == names(2, 3)
    assert plan.removed == []


def test_scale_up_takes_the_lowest_free_numbers() -> None:
    plan = plan_instances("db", 4, names(1, 3), "db-1")
    assert plan.added == names(2, 4)
    assert plan.instances == names(1, 2, 3, 4)


def test_scale_down_removes_the_highest_replicas_never_the_primary() -> None:
    plan = plan_instances("db", 2, names(1, 2, 3, 4, 5), "db-5")
    assert plan.removed == names(4, 3, 2)
    assert plan.instances == names(1, 5)
    assert plan.primary == "db-5"
    assert plan_instances("db", 1, names(1, 2), "db-2").instances == ["db-2"]


def test_numbers_sort_numerically_not_as_text() -> None:
    plan = plan_instances("db", 2, names(2, 10, 9), "db-2")
    assert plan.removed == ["db-10"]


def test_hibernation_keeps_every_instance() -> None:
    plan = plan_instances("db", 0, names(1, 2, 3), "db-2")
    assert plan.instances == names(1, 2, 3)
    assert plan.removed == []
    assert plan.added == []
    assert plan.primary == "db-2"
    assert plan_instances("db", 0, [], None).primary is None


def test_without_a_known_primary_the_lowest_existing_instance_is_chosen() -> None:
    # A recreated cluster adopting retained volumes: status is empty, the data is on the claims.
    assert plan_instances("db", 2, names(2, 3), None).primary == "db-2"
    assert plan_instances("db", 2, names(2, 3), "db-9").primary == "db-2"  # a primary that no longer exists


def test_names_of_other_clusters_are_ignored() -> None:
    plan = plan_instances("db", 1, ["db-1", "dbx-2", "db-rw", "db-1-extra"], None)
    assert plan.instances == ["db-1"]
    assert plan.added == []
