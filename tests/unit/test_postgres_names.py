"""Child names never collide between two clusters of one namespace (the replica budget once did)."""

from __future__ import annotations

from collections.abc import Callable

from kanri.postgres import names

# Every name the operator gives a child, grouped by the kind that must keep them apart.
KINDS: dict[str, list[Callable[[str], str]]] = {
    "StatefulSet/PersistentVolumeClaim": [lambda c: names.instance_name(c, 1), lambda c: names.instance_name(c, 12)],
    "Pod": [lambda c: names.pod_name(names.instance_name(c, 1)), lambda c: names.pod_name(names.instance_name(c, 12))],
    "Service": [names.read_write_service, names.read_only_service, names.read_service],
    "Secret": [
        names.superuser_secret,
        names.replication_secret,
        names.app_secret,
        names.api_secret,
        names.ca_secret,
        names.ca_key_secret,
        names.server_secret,
    ],
    "ConfigMap": [names.config_map],
    "ServiceAccount/Role/RoleBinding": [names.service_account],
    "PodDisruptionBudget": [names.primary_pdb, names.replica_pdb],
}


def suffixes(kind: str) -> list[str]:
    return [make("c")[len("c-") :] for make in KINDS[kind]]


def test_every_child_is_the_cluster_name_and_a_suffix() -> None:
    for kind, makers in KINDS.items():
        for make in makers:
            assert make("c").startswith("c-"), (kind, make("c"))


def test_no_suffix_is_another_with_a_word_in_front() -> None:
    # Cluster c's child c-<s1> equals cluster c-<x>'s child c-<x>-<s2> exactly when s1 == <x>-<s2>.
    for kind in KINDS:
        own = suffixes(kind)
        for s1 in own:
            for s2 in own:
                assert not s1.endswith("-" + s2), (kind, s1, s2)


def test_clusters_named_after_each_others_children_share_no_child_name() -> None:
    clusters = {"c", "c-1", "c-12", "c-1-0"}
    for makers in KINDS.values():
        clusters |= {make("c") for make in makers}
    for kind, makers in KINDS.items():
        owner: dict[str, str] = {}
        for cluster in sorted(clusters):
            for make in makers:
                name = make(cluster)
                assert owner.setdefault(name, cluster) == cluster, f"{kind} {name}: {owner[name]} and {cluster}"


def test_the_old_replica_budget_name_is_the_one_that_collided() -> None:
    assert names.legacy_replica_pdb("c-primary") == names.primary_pdb("c")
    assert names.replica_pdb("c-primary") != names.primary_pdb("c")
