"""The kanri provider's mapping between a DatabaseInstance's common fields and a PostgresCluster (pure parts)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kanri.cloud.api import DatabaseClassSpec, DatabaseInstanceSpec, KanriProfile, KanriSize
from kanri.cloud.policy import capability
from kanri.cloud.providers import kanri
from kanri.cloud.providers.base import Desired, UserMustFix
from kanri.cloud.sync import diff

Obj = dict[str, Any]
PROFILE = KanriProfile()


def desired(**changes: Any) -> Desired:
    base: Obj = {
        "identifier": "kanri-shop-orders",
        "owner_uid": "uid-1",
        "namespace": "shop",
        "name": "orders",
        "engine": "postgres",
        "version": 16,
        "size": "small",
        "storage_gib": 20,
        "region": "local",
    }
    return Desired(**{**base, **changes})


def provider(profile: KanriProfile = PROFILE) -> kanri.KanriProvider:
    return kanri.KanriProvider(client=None, profile=profile)  # type: ignore[arg-type]  # pure methods only


def created(want: Desired, **status: Any) -> Obj:
    """The PostgresCluster a create writes, as the API server returns it (generation 1), with ``status``."""
    p = provider()
    namespace, name = p.locate(want)
    body = kanri.manifest(want, name, namespace, p._requests(want), None)
    body["metadata"]["generation"] = 1
    if status:
        body["status"] = status
    return body


# --- names ----------------------------------------------------------------------------------------------------------


def test_a_cluster_takes_the_instance_name_in_its_own_namespace() -> None:
    assert provider().locate(desired()) == ("shop", "orders")


def test_a_shared_namespace_prefixes_the_instance_namespace() -> None:
    shared = provider(KanriProfile(namespace="databases"))
    assert shared.locate(desired()) == ("databases", "shop-orders")


def test_long_or_odd_names_become_distinct_dns_1035_labels_of_40() -> None:
    long_a = kanri.cluster_name("team", "a" * 60 + ".x", shared_namespace=False)
    long_b = kanri.cluster_name("team", "a" * 60 + ".y", shared_namespace=False)
    digit = kanri.cluster_name("team", "1st.db", shared_namespace=False)
    for name in (long_a, long_b, digit):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
        assert len(name) <= 40
    assert long_a != long_b
    assert digit.startswith("db-1st-db")
    assert digit != kanri.cluster_name("team", "1st-db", shared_namespace=False)  # the dot is not lost silently


def test_an_adopted_id_names_its_cluster() -> None:
    assert provider().locate(desired(identifier="other/legacy")) == ("other", "legacy")
    with pytest.raises(UserMustFix) as exc:
        kanri.split_id("legacy")
    assert exc.value.field == "adoptExternalId"


# --- sizes and instances -------------------------------------------------------------------------------------------


def test_size_is_the_profile_requests() -> None:
    assert provider().size_for(desired(size="medium")) == "cpu=2,memory=4Gi"
    custom = provider(KanriProfile(sizes={"tiny": KanriSize(cpu="100m", memory="256Mi")}))
    assert custom.size_for(desired(size="tiny")) == "cpu=100m,memory=256Mi"
    with pytest.raises(UserMustFix) as exc:
        custom.size_for(desired(size="small"))
    assert (exc.value.field, exc.value.reason) == ("size", "UnknownSize")


def test_instances_follow_high_availability_unless_the_extension_names_them() -> None:
    assert kanri.instances_for(desired()) == 1
    assert kanri.instances_for(desired(high_availability=True)) == 2
    assert kanri.instances_for(desired(high_availability=True, extension={"instances": 3})) == 3
    with pytest.raises(UserMustFix) as exc:
        kanri.instances_for(desired(extension={"instances": 3}))
    assert exc.value.field == "providers.kanri.instances"


# --- the cluster written --------------------------------------------------------------------------------------------


def test_the_manifest_carries_the_common_fields_and_the_owner() -> None:
    body = created(desired(storage_gib=50, backup_retention_days=14, extension={"storageClassName": "fast"}))
    spec = body["spec"]
    assert spec["version"] == 16
    assert spec["replicas"] == 1
    assert spec["storage"] == {"size": "50Gi"}  # the extension's class is passed by create(), not here
    assert spec["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}}
    assert spec["backup"] == {"retentionDays": 14}
    assert spec["deletionPolicy"] == "Retain"
    assert body["metadata"]["labels"] == {kanri.OWNER_LABEL: "uid-1"}
    assert body["metadata"]["annotations"] == {kanri.FOR_INSTANCE: "shop/orders"}


def test_zero_retention_means_no_backup_section() -> None:
    assert "backup" not in created(desired(backup_retention_days=0))["spec"]
    assert kanri.modify_patch(desired(backup_retention_days=0), ("backupRetentionDays",), {}) == {
        "spec": {"backup": None}
    }


def test_a_modify_patches_exactly_the_fields_named() -> None:
    want = desired(version=17, storage_gib=40, high_availability=True)
    requests = {"cpu": "2", "memory": "4Gi"}
    assert kanri.modify_patch(want, ("storage",), requests) == {"spec": {"storage": {"size": "40Gi"}}}
    assert kanri.modify_patch(want, ("version",), requests) == {
        "spec": {"version": 17, "upgrade": {"approvedVersion": 17}}
    }
    assert kanri.modify_patch(want, ("size", "highAvailability"), requests) == {
        "spec": {"resources": {"requests": requests}, "replicas": 2}
    }
    with pytest.raises(UserMustFix) as exc:
        kanri.modify_patch(want, ("maintenanceWindow",), requests)
    assert (exc.value.field, exc.value.reason) == ("maintenanceWindow", "Unsupported")


# --- the cluster read -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "state"),
    [
        (None, "creating"),
        ("Pending", "creating"),
        ("Provisioning", "creating"),
        ("Ready", "available"),
        ("Scaling", "modifying"),
        ("Upgrading", "modifying"),
        ("Degraded", "degraded"),
        ("FailingOver", "failing-over"),
        ("SwitchingOver", "modifying"),
        ("Hibernated", "stopped"),
    ],
)
def test_state_follows_the_phase(phase: str | None, state: str) -> None:
    status = {"phase": phase, "observedGeneration": 1} if phase else {}
    assert kanri.state_of(created(desired(), **status), None) == state


def test_a_change_the_operator_has_not_seen_is_modifying() -> None:
    cluster = created(desired(), phase="Ready", observedGeneration=1)
    cluster["metadata"]["generation"] = 2
    assert kanri.state_of(cluster, None) == "modifying"


def test_deletion_and_the_final_backup_show_in_the_state() -> None:
    ready = created(desired(), phase="Ready", observedGeneration=1)
    assert kanri.state_of(ready, "Pending") == "backing-up"
    assert kanri.state_of(ready, "Running") == "backing-up"
    assert kanri.state_of(ready, "Failed") == "available"  # delete is called again and names the failure
    assert kanri.state_of(ready, "Missing") == "available"  # delete is called again and asks for it again
    assert kanri.state_of(ready, "Completed") == "available"  # then the delete is called again and goes on
    ready["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    assert kanri.state_of(ready, "Completed") == "deleting"


def test_observed_reads_the_common_fields() -> None:
    want = desired(high_availability=True, backup_retention_days=3)
    seen = kanri.observed_from(created(want, phase="Ready", observedGeneration=1))
    assert seen.external_id == "shop/orders"
    assert seen.settled
    assert seen.owner_uid == "uid-1"
    assert (seen.host, seen.port) == ("orders-rw.shop.svc", 5432)
    assert (seen.engine, seen.engine_version, seen.storage_gib) == ("postgres", "16", 20)
    assert (seen.size, seen.backup_retention_days, seen.high_availability) == ("cpu=500m,memory=1Gi", 3, True)
    assert seen.public is None
    assert (seen.username, seen.dbname) == ("app", "app")
    assert seen.extension == {"instances": 2}


def test_the_running_major_is_the_old_one_until_the_upgrade_succeeds() -> None:
    cluster = created(desired(version=17), phase="Upgrading", upgrade={"phase": "Upgrading", "from": 16, "to": 17})
    assert kanri.running_major(cluster) == 16
    cluster["status"]["upgrade"]["phase"] = "Succeeded"
    assert kanri.running_major(cluster) == 17


def test_storage_is_read_in_whole_gib() -> None:
    cluster = created(desired())
    cluster["spec"]["storage"]["size"] = "1500Mi"
    assert kanri.observed_from(cluster).storage_gib == 2


# --- no endless diff, explicit Unsupported -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "want",
    [
        desired(),
        desired(size="large", storage_gib=100, version=17),
        desired(high_availability=True, backup_retention_days=0),
        desired(high_availability=True, extension={"instances": 3, "storageClassName": "fast"}),
    ],
)
def test_a_cluster_just_written_shows_no_difference(want: Desired) -> None:
    """The anchors' endless-update bug: what the provider writes, read back, must compare equal to what was asked."""
    cluster = created(want, phase="Ready", observedGeneration=1)
    if "storageClassName" in want.extension:
        cluster["spec"]["storage"]["storageClassName"] = want.extension["storageClassName"]
    seen = kanri.observed_from(cluster)
    assert diff.changes(want, seen, provider().size_for(want), "kanri") == ()


def test_each_difference_is_named() -> None:
    seen = kanri.observed_from(created(desired(), phase="Ready", observedGeneration=1))
    want = desired(size="medium", storage_gib=30, version=17, backup_retention_days=1, high_availability=True)
    assert diff.changes(want, seen, provider().size_for(want), "kanri") == (
        "backupRetentionDays",
        "highAvailability",
        "size",
        "storage",
        "version",
    )


def test_fields_the_cluster_cannot_honour_are_unsupported() -> None:
    spec = DatabaseInstanceSpec.model_validate(
        {
            "className": "local",
            "version": 16,
            "network": {"access": "Public", "allowedCidrs": ["10.0.0.0/8"]},
            "maintenanceWindow": "sun:03:00-sun:04:00",
            "providers": {"aws": {"instanceClass": "db.t3.micro"}, "kanri": {"instances": 1}},
        }
    )
    assert capability.unsupported(spec, "kanri", kanri.CAPABILITIES) == [
        "maintenanceWindow",
        "network.access",
        "network.allowedCidrs",
        "providers.aws",
    ]


def test_a_plain_instance_is_fully_supported() -> None:
    spec = DatabaseInstanceSpec.model_validate(
        {
            "className": "local",
            "version": 16,
            "highAvailability": True,
            "deletionPolicy": "Delete",
            "providers": {"kanri": {"instances": 2, "storageClassName": "fast"}},
        }
    )
    assert capability.unsupported(spec, "kanri", kanri.CAPABILITIES) == []


def test_the_registry_entry_needs_the_kanri_profile() -> None:
    from kanri.cloud.providers.base import ProviderSetup

    setup = ProviderSetup("local", DatabaseClassSpec(provider="kanri", kanri=KanriProfile()), None, None)  # type: ignore[arg-type]
    assert isinstance(kanri.provider(setup), kanri.KanriProvider)
    with pytest.raises(UserMustFix) as exc:
        kanri.provider(ProviderSetup("x", DatabaseClassSpec.model_construct(provider="kanri", kanri=None), None, None))  # type: ignore[arg-type]
    assert exc.value.reason == "NoProfile"
