"""The cloud operator's pure decisions: guardrails, capabilities, the diff and plan, the request budget, error
classes, poll delays, the operation state machine, names and RDS shapes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kanri.cloud import naming
from kanri.cloud.api import DatabaseClassSpec, DatabaseInstanceSpec, OperationRecord
from kanri.cloud.budget.buckets import Budgets, TokenBucket
from kanri.cloud.policy import capability, guardrails
from kanri.cloud.providers import aws_errors, aws_shapes
from kanri.cloud.providers.aws import CAPABILITIES
from kanri.cloud.providers.base import Desired, Observed, Retryable, Throttled, UserMustFix
from kanri.cloud.sync import diff, operation
from kanri.cloud.sync.desired import desired_of, storage_gib
from kanri.cloud.sync.polling import RESYNC, poll_delay
from kanri.runtime import FakeClock

AWS_CLASS: dict[str, Any] = {"provider": "aws", "aws": {"region": "eu-west-1"}}


def spec(**fields: Any) -> DatabaseInstanceSpec:
    return DatabaseInstanceSpec.model_validate({"className": "std", "version": 16, **fields})


def cls(**fields: Any) -> DatabaseClassSpec:
    return DatabaseClassSpec.model_validate({**AWS_CLASS, **fields})


def obj(name: str = "orders", namespace: str = "shop") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": "u-1", "generation": 1}}


# --- guardrails ---------------------------------------------------------------------------------------------------


def test_an_instance_inside_the_guardrails_breaks_no_rule() -> None:
    assert guardrails.check(spec(), cls()) == []


def test_every_broken_guardrail_is_named() -> None:
    rails = {"allowedSizes": ["small"], "allowedRegions": ["eu-west-1"], "minBackupRetentionDays": 7,
             "allowDeletionPolicyDelete": False}  # fmt: skip
    asked = spec(size="large", region="us-east-1", backupRetentionDays=1, network={"access": "Public"},
                 deletionPolicy="Delete")  # fmt: skip
    rules = [v.rule for v in guardrails.check(asked, cls(guardrails=rails))]
    assert rules == ["allowedSizes", "allowedRegions", "minBackupRetentionDays", "allowPublicAccess",
                     "allowDeletionPolicyDelete"]  # fmt: skip


def test_cidrs_must_lie_inside_the_allowed_ranges_or_be_private() -> None:
    inside = cls(guardrails={"allowedCidrs": ["10.0.0.0/8"]})
    assert guardrails.check(spec(network={"allowedCidrs": ["10.1.0.0/16"]}), inside) == []
    outside = guardrails.check(spec(network={"allowedCidrs": ["10.1.0.0/16", "192.168.0.0/24"]}), inside)
    assert [v.rule for v in outside] == ["allowedCidrs"]
    assert "192.168.0.0/24" in outside[0].message
    assert "10.1.0.0/16" not in outside[0].message
    public = guardrails.check(spec(network={"allowedCidrs": ["8.8.8.0/24"]}), cls())
    assert [v.rule for v in public] == ["allowedCidrs"]


def test_sizes_default_to_those_the_profile_maps() -> None:
    assert guardrails.check(spec(size="huge"), cls())[0].rule == "allowedSizes"
    assert guardrails.check(spec(size="huge"), cls(aws={"region": "eu-west-1", "sizes": {"huge": "db.x"}})) == []


# --- capabilities -------------------------------------------------------------------------------------------------


def test_a_field_set_that_the_provider_cannot_honour_is_named() -> None:
    assert capability.unsupported(spec(), "aws", CAPABILITIES) == []
    asked = spec(network={"allowedCidrs": ["10.0.0.0/8"]}, providers={"kanri": {"instances": 2},
                 "aws": {"storageType": "gp3"}})  # fmt: skip
    assert capability.unsupported(asked, "aws", CAPABILITIES) == ["network.allowedCidrs", "providers.kanri"]


def test_a_default_value_is_not_a_field_set() -> None:
    assert "highAvailability" not in capability.set_fields(spec(highAvailability=False))
    assert "highAvailability" in capability.set_fields(spec(highAvailability=True))
    assert "finalSnapshot" in capability.set_fields(spec(deletionPolicy="Delete"))
    assert "finalSnapshot" not in capability.set_fields(spec(deletionPolicy="Retain"))


# --- desired, diff and plan ---------------------------------------------------------------------------------------


def desired(**fields: Any) -> Desired:
    return desired_of(obj(), spec(**fields), cls())


def observed(**fields: Any) -> Observed:
    base: dict[str, Any] = {"external_id": "kanri-shop-orders", "state": "available", "owner_uid": "u-1",
                            "engine_version": "16.3", "size": "db.t3.micro", "storage_gib": 20,
                            "backup_retention_days": 7, "high_availability": False, "public": False}  # fmt: skip
    return Observed(**{**base, **fields})


def test_storage_is_whole_gib_rounded_up() -> None:
    assert [storage_gib(q) for q in ("20Gi", "20G", "1.5Gi", "1Mi")] == [20, 19, 2, 1]


def test_desired_resolves_the_class_region_and_the_deterministic_name() -> None:
    wanted = desired()
    assert (wanted.identifier, wanted.region, wanted.owner_uid) == ("kanri-shop-orders", "eu-west-1", "u-1")
    assert desired(adoptExternalId="legacy-1").identifier == "legacy-1"


def test_a_converged_database_has_no_change_even_with_provider_defaults() -> None:
    # RDS fills in a maintenance window, storage type, parameter group the user never set: not differences
    seen = observed(maintenance_window="wed:06:38-wed:07:08", extension={"storageType": "gp2",
                    "parameterGroup": "default.postgres"})  # fmt: skip
    assert diff.changes(desired(), seen, "db.t3.micro", "aws") == ()
    assert diff.changes(desired(), observed(public=None, high_availability=None), "db.t3.micro", "aws") == ()


def test_only_fields_that_differ_are_changed_and_pending_ones_count_as_asked() -> None:
    wanted = desired(storage="30Gi", backupRetentionDays=14, providers={"aws": {"storageType": "gp3"}})
    seen = observed(extension={"storageType": "gp2"})
    assert diff.changes(wanted, seen, "db.m5.large", "aws") == ("backupRetentionDays", "providers.aws.storageType",
                                                               "size", "storage")  # fmt: skip
    pending = observed(extension={"storageType": "gp2"}, pending=("size", "storage"))
    assert diff.changes(wanted, pending, "db.m5.large", "aws") == ("backupRetentionDays", "providers.aws.storageType")


def test_no_modify_can_shrink_storage_or_go_down_a_major_version() -> None:
    with pytest.raises(UserMustFix) as shrink:
        diff.changes(desired(storage="10Gi"), observed(), "db.t3.micro", "aws")
    assert shrink.value.field == "storage"
    with pytest.raises(UserMustFix) as down:
        diff.changes(desired(version=15), observed(), "db.t3.micro", "aws")
    assert down.value.field == "version"


def test_downtime_changes_wait_for_the_window_or_an_approval() -> None:
    fields = ("backupRetentionDays", "size")
    assert diff.plan(fields, CAPABILITIES, None, approved=False) == diff.Plan(("backupRetentionDays",), (), ("size",))
    assert diff.plan(fields, CAPABILITIES, None, approved=True) == diff.Plan(fields, (), ())
    assert diff.plan(fields, CAPABILITIES, "sun:03:00-sun:04:00", approved=False) == diff.Plan(
        ("backupRetentionDays",), ("size",), ()
    )
    assert diff.plan(("storage",), CAPABILITIES, None, approved=False) == diff.Plan(("storage",), (), ())


# --- request budget -----------------------------------------------------------------------------------------------


def test_the_bucket_lets_a_burst_through_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=2, tokens=2.0, updated=0.0)
    assert [bucket.take(0.0), bucket.take(0.0)] == [0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) == 0.0


def test_a_follow_up_call_borrows_at_most_one_token() -> None:
    bucket = TokenBucket(rate=1.0, burst=1, tokens=1.0, updated=0.0)
    assert bucket.take(0.0) == 0.0
    assert bucket.take(0.0, credit=True) == 0.0  # the same pass's second call
    assert bucket.take(0.0, credit=True) == pytest.approx(2.0)  # in debt: nobody borrows more
    assert bucket.take(1.0) == pytest.approx(1.0)  # the debt is paid back before anyone's first call


def test_throttling_pauses_the_bucket_doubling_until_a_call_succeeds() -> None:
    bucket = TokenBucket(rate=10.0, burst=10, tokens=10.0, updated=0.0)
    assert [bucket.penalise(0.0), bucket.penalise(0.0), bucket.penalise(0.0)] == [1.0, 2.0, 4.0]
    assert bucket.take(3.0) == pytest.approx(1.0)
    bucket.succeeded()
    assert bucket.penalise(10.0) == 1.0


def test_budgets_are_shared_per_key_and_follow_the_class_rate() -> None:
    clock = FakeClock()
    budgets = Budgets(clock)
    assert budgets.take("aws:a@x/eu", 1.0, 1) == 0.0
    assert budgets.take("aws:a@x/eu", 1.0, 1) > 0  # another instance, same account and region
    assert budgets.take("aws:b@x/eu", 1.0, 1) == 0.0  # another account: its own bucket
    budgets.bucket("aws:a@x/eu", 100.0, 5)
    clock.advance(0.1)
    assert budgets.take("aws:a@x/eu", 100.0, 5) == 0.0


# --- errors, polling, operations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "kind", "field"),
    [
        ("ThrottlingException", 400, Throttled, None),
        ("Throttling", 400, Throttled, None),
        ("InternalFailure", 500, Retryable, None),
        ("Whatever", 503, Retryable, None),
        ("InvalidDBInstanceState", 400, Retryable, None),
        ("InvalidParameterCombination", 400, UserMustFix, "storage"),
        ("InvalidParameterValue", 400, UserMustFix, "size"),
    ],
)
def test_rds_errors_say_who_must_act(code: str, status: int, kind: type[Exception], field: str | None) -> None:
    message = {"InvalidParameterCombination": "Invalid storage size for engine name postgres and storage type gp2",
               "InvalidParameterValue": "Invalid DB Instance class: db.nope"}.get(code, "x")  # fmt: skip
    error = aws_errors.classify(code, message, status, "ModifyDBInstance")
    assert type(error) is kind
    if isinstance(error, UserMustFix):
        assert error.field == field


def test_rds_parameter_names_map_to_spec_fields() -> None:
    assert aws_errors.field_of("The AllocatedStorage must be larger") == "storage"
    assert aws_errors.field_of("Cannot upgrade: EngineVersion 14") == "version"
    assert aws_errors.field_of("something else") is None


def test_poll_delays_back_off_per_state_and_settled_waits_for_the_resync() -> None:
    assert [poll_delay("creating", n) for n in range(5)] == [5.0, 10.0, 20.0, 40.0, 60.0]
    assert poll_delay("storage-optimization", 10) == 300.0
    assert poll_delay("available", 0) == RESYNC
    assert poll_delay("something-new", 0) == 15.0


def record(kind: str, outcome: str = "InProgress", fields: tuple[str, ...] = ()) -> OperationRecord:
    return OperationRecord.model_validate({"kind": kind, "id": "op", "targetState": "available",
                                           "started": "2026-01-01T00:00:00Z", "outcome": outcome,
                                           "fields": list(fields)})  # fmt: skip


NOW = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "outcome", "seen", "converged", "action"),
    [
        ("Create", "Pending", None, True, "call"),
        ("Create", "InProgress", None, True, "call"),  # accepted but not visible, or lost: the name finds it
        ("Create", "InProgress", "creating", True, "wait"),
        ("Create", "InProgress", "backing-up", True, "wait"),
        ("Create", "InProgress", "available", True, "succeeded"),
        ("Create", "InProgress", "incompatible-parameters", True, "failed"),
        ("Modify", "Pending", "available", False, "call"),
        ("Modify", "InProgress", "available", False, "wait"),
        ("Modify", "InProgress", "modifying", True, "wait"),
        ("Modify", "InProgress", "available", True, "succeeded"),
        ("Modify", "InProgress", None, True, "failed"),
        ("Delete", "Pending", "available", True, "call"),
        ("Delete", "InProgress", "deleting", True, "wait"),
        ("Delete", "InProgress", None, True, "succeeded"),
    ],
)
def test_an_operation_on_record_is_called_waited_for_or_ended(kind: str, outcome: str, seen: str | None,
                                                               converged: bool, action: str) -> None:  # fmt: skip
    found = observed(state=seen) if seen else None
    assert operation.decide(record(kind, outcome), found, converged=converged, now=NOW).action == action


def test_a_modify_the_provider_never_applies_fails_after_the_timeout() -> None:
    late = NOW + operation.MODIFY_TIMEOUT + timedelta(minutes=1)
    verdict = operation.decide(record("Modify", fields=("size",)), observed(), converged=False, now=late)
    assert verdict.action == "failed"
    assert "size" in verdict.message


# --- names and RDS shapes -----------------------------------------------------------------------------------------


def test_identifiers_are_deterministic_valid_and_distinct_when_cut() -> None:
    assert naming.identifier("Shop", "orders_db") == "kanri-shop-orders-db"
    long_a, long_b = naming.identifier("n" * 60, "a" * 60), naming.identifier("n" * 60, "a" * 59 + "b")
    assert len(long_a) <= 63
    assert long_a != long_b
    assert long_a == naming.identifier("n" * 60, "a" * 60)
    assert "--" not in naming.identifier("a--b", "-c-")


def test_an_rds_answer_reads_as_the_common_fields() -> None:
    seen = aws_shapes.observed_from({"DBInstanceIdentifier": "x", "DBInstanceStatus": "Available",
                                     "TagList": [{"Key": aws_shapes.OWNER_TAG, "Value": "u-1"}],
                                     "Endpoint": {"Address": "h", "Port": 5432}, "EngineVersion": "16.3",
                                     "AllocatedStorage": 20, "PendingModifiedValues": {"DBInstanceClass": "db.m5"},
                                     "DBParameterGroups": [{"DBParameterGroupName": "default.postgres"}]})  # fmt: skip
    assert (seen.state, seen.owner_uid, seen.host, seen.port, seen.pending) == ("available", "u-1", "h", 5432,
                                                                                ("size",))  # fmt: skip
    assert not seen.settled
    assert seen.public is None  # not reported: never a difference


def test_a_modify_sends_exactly_the_changed_fields() -> None:
    sent = aws_shapes.modify_parameters(desired(storage="30Gi", version=17), "db.t3.micro", ("storage", "version"),
                                        immediately=True)  # fmt: skip
    assert sent == {"DBInstanceIdentifier": "kanri-shop-orders", "ApplyImmediately": True, "AllocatedStorage": 30,
                    "EngineVersion": "17", "AllowMajorVersionUpgrade": True}  # fmt: skip


def test_a_create_carries_the_owner_tag_and_no_unset_extension() -> None:
    sent = aws_shapes.create_parameters(desired(), "db.t3.micro", "pw", None)
    assert {"Key": aws_shapes.OWNER_TAG, "Value": "u-1"} in sent["Tags"]
    assert "StorageType" not in sent
    assert "PreferredMaintenanceWindow" not in sent
    assert sent["EngineVersion"] == "16"
