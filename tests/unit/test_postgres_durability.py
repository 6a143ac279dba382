"""``replication.dataDurability`` (kanri.postgres.ha.durability, issue 29 item 5): how many synchronous standbys a
commit waits for, what the instances' ConfigMap says, what the failover guard counts on, and what the user is told."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kanri.contract.instance_config import ClusterConfig
from kanri.contract.status import Replica
from kanri.instance.conf import synchronous_standby_names
from kanri.postgres.api import v1beta1
from kanri.postgres.api.conversion import PostgresClusterV1Alpha1, cluster_from_v1beta1, cluster_to_v1beta1
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.config import CONFIG_KEY, config_map
from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.ha.durability import decide, guarded_standbys, in_force, problem, streaming_standbys
from kanri.postgres.ha.failover import Candidate, guard

INSTANCES = ("db-1", "db-2", "db-3")


def spec(durability: str | None, sync_standbys: int = 2, mode: str = "Sync") -> PostgresClusterSpec:
    replication: dict[str, Any] = {"mode": mode}
    if mode == "Sync":
        replication["syncStandbys"] = sync_standbys
    if durability is not None:
        replication["dataDurability"] = durability
    return PostgresClusterSpec.model_validate({"version": 16, "replicas": 3, "storage": {"size": "1Gi"},
                                               "replication": replication})  # fmt: skip


def row(name: str, state: str = "streaming") -> Replica:
    return Replica(name=name, state=state, sent_lsn=None, flush_lsn=None, replay_lsn=None, lag_bytes=0,
                   sync_state="quorum")  # fmt: skip


def primary(*rows: Replica, role: str = "primary") -> InstanceReport:
    return InstanceReport(name="db-1", role=role, ready=True, running=True, timeline=1, replicas=rows)


def test_required_keeps_the_spec_number_whoever_streams() -> None:
    for durability in (None, "required"):
        for streaming in ((), ("db-2",), None):
            decided = decide(spec(durability), streaming, in_force=0)
            assert (decided.required, decided.count, decided.reduced) == (2, 2, False)
            assert problem(decided) is None


def test_preferred_lowers_the_number_to_the_replicas_streaming_and_raises_it_again() -> None:
    preferred = spec("preferred")
    assert decide(preferred, ("db-2", "db-3"), in_force=2).count == 2
    one = decide(preferred, ("db-3",), in_force=2)
    assert (one.count, one.reduced) == (1, True)
    none = decide(preferred, (), in_force=1)
    assert (none.count, none.reduced) == (0, True)
    assert decide(preferred, ("db-2", "db-3"), in_force=0).count == 2  # both stream again: back up at once
    # never more than syncStandbys, whatever streams
    assert decide(spec("preferred", sync_standbys=1), ("db-2", "db-3"), in_force=None).count == 1


def test_preferred_without_the_primarys_report_keeps_the_number_in_force_never_above_the_spec() -> None:
    preferred = spec("preferred")
    assert decide(preferred, None, in_force=1).count == 1
    assert decide(preferred, None, in_force=0).count == 0
    assert decide(preferred, None, in_force=5).count == 2
    assert decide(preferred, None, in_force=None).count == 2  # a new cluster: the spec's number


def test_async_has_no_synchronous_standby_whatever_the_durability() -> None:
    decided = decide(spec(None, mode="Async"), (), in_force=None)
    assert (decided.required, decided.count, decided.reduced) == (0, 0, False)


def test_only_other_instances_listed_as_streaming_count() -> None:
    report = primary(row("db-2"), row("db-3", state="catchup"), row("stranger"), row("db-1"))
    assert streaming_standbys(report, "db-1", INSTANCES) == ("db-2",)
    assert streaming_standbys(primary(), "db-1", INSTANCES) == ()  # a primary listing nobody: none streams
    assert streaming_standbys(primary(row("db-2"), role="replica"), "db-1", INSTANCES) is None
    assert streaming_standbys(None, "db-1", INSTANCES) is None


def test_reduced_durability_is_a_problem_naming_the_counts_and_who_streams() -> None:
    found = problem(decide(spec("preferred"), ("db-3",), in_force=2))
    assert found is not None
    assert found.reason == "DurabilityReduced"
    assert "wait for 1 synchronous standby(s), not the 2 of replication.syncStandbys" in found.message
    assert "replicas streaming: db-3" in found.message
    gone = problem(decide(spec("preferred"), (), in_force=2))
    assert gone is not None
    assert "replicas streaming: none" in gone.message


def test_the_configmap_carries_the_lowered_number_and_the_instance_names_that_many() -> None:
    preferred = spec("preferred")
    body = {"apiVersion": "kanri.dev/v1beta1", "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "ns", "uid": "u"}}  # fmt: skip
    lowered = config_map(body, preferred, list(INSTANCES), synchronous=1)
    assert in_force(lowered) == 1
    config = ClusterConfig.parse(lowered["data"][CONFIG_KEY].encode())
    assert synchronous_standby_names("db-1", config) == 'ANY 1 ("db-2", "db-3")'
    none = ClusterConfig.parse(config_map(body, preferred, list(INSTANCES), synchronous=0)["data"][CONFIG_KEY].encode())
    assert synchronous_standby_names("db-1", none) == ""  # commits wait for nobody: writes go on
    assert json.loads(config_map(body, preferred, list(INSTANCES))["data"][CONFIG_KEY])["synchronousStandbys"] == 2
    assert in_force(None) is None
    assert in_force({"data": {CONFIG_KEY: "not json"}}) is None


def test_the_failover_guard_counts_on_the_number_in_force_not_the_spec() -> None:
    assert guarded_standbys(2, None) == 2
    assert guarded_standbys(2, 1) == 1
    assert guarded_standbys(2, 5) == 2
    # ANY 2 of 2 in force: hearing one standby proves it holds every acknowledged commit ...
    heard = [Candidate("db-2", "0/3000000", "0/3000000", 1)]
    common: dict[str, Any] = {"primary_lsn": "0/3000000", "policy": "Automatic", "max_data_loss_bytes": 0,
                              "sync_mode": True, "standbys": 2, "approved": None}  # fmt: skip
    assert guard(heard, sync_standbys=guarded_standbys(2, 2), **common).data_loss_possible is False
    # ... but ANY 1 of 2 in force (lowered while db-3 was gone): db-3 alone may hold a commit, so never "no loss"
    lowered = guard(heard, sync_standbys=guarded_standbys(2, 1), **common)
    assert lowered.blocked == "NoSynchronousStandby"
    assert guard(heard, sync_standbys=guarded_standbys(2, 0), **common).blocked == "NoSynchronousStandby"


@pytest.mark.parametrize("durability", ["required", "preferred"])
def test_both_api_versions_carry_data_durability_through_the_conversion(durability: str) -> None:
    body = {"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster", "metadata": {"name": "db"},
            "spec": {"version": 16, "replicas": 3, "storage": {"size": "1Gi"},
                     "replication": {"mode": "Sync", "syncStandbys": 2, "dataDurability": durability}}}  # fmt: skip
    old = PostgresClusterV1Alpha1.model_validate(body)
    new = cluster_to_v1beta1(old)
    assert isinstance(new, v1beta1.PostgresCluster)
    assert new.spec.replication.durability == durability
    assert cluster_from_v1beta1(new).spec.replication.data_durability == durability
    assert spec(None).replication.durability == "required"  # unset: today's behaviour
