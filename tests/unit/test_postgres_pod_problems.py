"""Why an instance never reported, from its pod and claim: each cause under its own reason, with the underlying
message and a runbook, stable from pass to pass — and nothing for a pod merely on its way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kanri.postgres.cluster.pod_problems import CRASHES, PENDING_GRACE, RESIZE_GRACE, UNSCHEDULABLE_GRACE, pod_problems
from kanri.postgres.cluster.problems import SEVERITY, Problem, ordered, runbook
from kanri.postgres.cluster.status import Observation, compute_status
from kanri.postgres.topology.plan import plan_instances
from kanri.postgres.topology.storage import StoragePlan

Obj = dict[str, Any]
NOW = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]
IMAGE = "kanri.dev/postgres:16"


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str = "db-1-0", *, containers: list[Obj] | None = None, conditions: list[Obj] | None = None,
        node: str | None = "node-a", **meta: Any) -> Obj:  # fmt: skip
    """A pod as the API server returns it (fields the kubelet and the scheduler fill in)."""
    spec: Obj = {"containers": [{"name": "postgres", "image": IMAGE}]}
    if node:
        spec["nodeName"] = node
    status: Obj = {"phase": "Pending", "conditions": conditions or [], "qosClass": "BestEffort"}
    if containers is not None:
        status["containerStatuses"] = containers
    return {"metadata": {"name": name, "namespace": "team", "uid": "u-1", **meta}, "spec": spec, "status": status}


def waiting(reason: str, message: str = "", restarts: int = 0, last: Obj | None = None) -> Obj:
    state: Obj = {"reason": reason, **({"message": message} if message else {})}
    return {"name": "postgres", "image": IMAGE, "imageID": "", "ready": False, "started": False,
            "restartCount": restarts, "state": {"waiting": state},
            "lastState": {"terminated": last} if last else {}}  # fmt: skip


def scheduled(status: str, reason: str = "", message: str = "", since: float = 600) -> Obj:
    condition: Obj = {"type": "PodScheduled", "status": status, "lastProbeTime": None,
                      "lastTransitionTime": ago(since)}  # fmt: skip
    condition |= {k: v for k, v in (("reason", reason), ("message", message)) if v}
    return condition


def claim(name: str = "db-1", *, phase: str = "Bound", created: float = 600, storage_class: str | None = "local",
          conditions: list[Obj] | None = None, **status: Any) -> Obj:  # fmt: skip
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"metadata": {"name": name, "namespace": "team", "creationTimestamp": ago(created)}, "spec": spec,
            "status": {"phase": phase, **({"conditions": conditions} if conditions else {}), **status}}  # fmt: skip


def storage_class(name: str = "local", binding: str = "Immediate") -> Obj:
    return {"metadata": {"name": name}, "provisioner": "kanri.dev/local", "volumeBindingMode": binding}


def reasons(problems: list[Problem]) -> list[str]:
    return [p.reason for p in problems]


# --- images ---------------------------------------------------------------------------------------------------------


def test_an_image_that_cannot_be_pulled_names_the_image_and_the_registry_error() -> None:
    error = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{IMAGE}": failed to resolve '
             f'reference "{IMAGE}": {IMAGE}: not found')  # fmt: skip
    [problem] = pod_problems({"db-1": pod(containers=[waiting("ErrImagePull", error)])}, {}, NOW)
    assert problem.reason == "ImagePullFailed"
    assert problem.message.startswith(f"instance db-1: image {IMAGE} of container postgres cannot be pulled: rpc")
    assert problem.message.endswith(f"(runbook {runbook('ImagePullFailed')})")


def test_the_back_off_and_the_pull_error_give_the_same_message() -> None:
    """A missing image alternates between ErrImagePull and ImagePullBackOff; the condition must not flap."""
    error = "failed to pull and unpack image: not found"
    pulled = pod_problems({"db-1": pod(containers=[waiting("ErrImagePull", error)])}, {}, NOW)
    backoff = f'Back-off pulling image "{IMAGE}": ErrImagePull: {error}'
    backing = pod_problems({"db-1": pod(containers=[waiting("ImagePullBackOff", backoff)])}, {}, NOW)
    assert pulled == backing


def test_the_local_nodes_unmapped_image_is_a_pull_failure_with_its_message() -> None:
    message = f'image "{IMAGE}" is not mapped to a local program in the image map /home/u/.kanri/images.yaml'
    [problem] = pod_problems({"db-1": pod(containers=[waiting("ImageNotMapped", message)])}, {}, NOW)
    assert problem.reason == "ImagePullFailed"
    assert "is not mapped to a local program in the image map /home/u/.kanri/images.yaml" in problem.message


def test_the_same_fault_on_every_instance_is_one_line_naming_them() -> None:
    pods = {f"db-{n}": pod(f"db-{n}-0", containers=[waiting("ImagePullBackOff", "")]) for n in (1, 2, 3)}
    [problem] = pod_problems(pods, {}, NOW)
    assert problem.message.startswith("instances db-1, db-2, db-3: image kanri.dev/postgres:16 of container postgres "
                                      "cannot be pulled (runbook")  # fmt: skip


# --- containers -----------------------------------------------------------------------------------------------------


def test_a_crash_loop_carries_the_exit_and_the_last_lines_of_the_log() -> None:
    log = "\n".join([f"line {n}" for n in range(1, 9)] + ['FATAL:  could not open file "global/pg_control"', ""])
    last = {"exitCode": 1, "reason": "Error", "message": log, "startedAt": ago(30), "finishedAt": ago(29)}
    crashing = waiting("CrashLoopBackOff", "back-off 40s restarting failed container=postgres pod=db-1-0_team(u-1)",
                       restarts=4, last=last)  # fmt: skip
    [problem] = pod_problems({"db-1": pod(containers=[crashing])}, {}, NOW)
    assert problem.reason == "CrashLoopBackOff"
    assert "container postgres keeps exiting (exit code 1, Error); its last log lines: line 5 | line 6 | line 7 | " \
           'line 8 | FATAL:  could not open file "global/pg_control"' in problem.message  # fmt: skip
    assert "back-off 40s" not in problem.message  # changes each crash: the message would never settle
    again = waiting("CrashLoopBackOff", "back-off 1m20s restarting failed container", restarts=5, last=last)
    assert pod_problems({"db-1": pod(containers=[again])}, {}, NOW) == [problem]


def test_a_crash_loop_without_a_termination_message_still_says_how_it_ended() -> None:
    oom = waiting("CrashLoopBackOff", restarts=CRASHES, last={"exitCode": 137, "reason": "OOMKilled"})
    [problem] = pod_problems({"db-1": pod(containers=[oom])}, {}, NOW)
    assert "keeps exiting (exit code 137, OOMKilled) (runbook" in problem.message


def test_one_restart_is_not_a_problem() -> None:
    once = waiting("CrashLoopBackOff", restarts=CRASHES - 1, last={"exitCode": 1, "reason": "Error"})
    assert pod_problems({"db-1": pod(containers=[once])}, {}, NOW) == []


def test_a_container_that_cannot_be_created_says_why() -> None:
    missing = "couldn't find key password in Secret team/db-app"
    [problem] = pod_problems({"db-1": pod(containers=[waiting("CreateContainerConfigError", missing)])}, {}, NOW)
    assert (problem.reason, problem.message.split(" (runbook")[0]) == (
        "ContainerCannotStart",
        f"instance db-1: container postgres cannot start: {missing}",
    )


@pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing"])
def test_a_pod_on_its_way_is_no_problem(reason: str) -> None:
    assert pod_problems({"db-1": pod(containers=[waiting(reason)])}, {"db-1": claim()}, NOW) == []


def test_a_running_pod_and_a_pod_being_deleted_are_no_problem() -> None:
    running = {"name": "postgres", "image": IMAGE, "ready": True, "restartCount": 3,
               "state": {"running": {"startedAt": ago(5)}}, "lastState": {"terminated": {"exitCode": 1}}}  # fmt: skip
    deleting = pod("db-2-0", containers=[waiting("ImagePullBackOff")], deletionTimestamp=ago(1))
    assert pod_problems({"db-1": pod(containers=[running]), "db-2": deleting}, {}, NOW) == []


# --- scheduling -----------------------------------------------------------------------------------------------------

SCHEDULER = ("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes "
             "are available: 3 Preemption is not helpful for scheduling.")  # fmt: skip


def test_an_unschedulable_pod_carries_the_schedulers_message() -> None:
    stuck = pod(node=None, conditions=[scheduled("False", "Unschedulable", SCHEDULER, since=UNSCHEDULABLE_GRACE)])
    [problem] = pod_problems({"db-1": stuck}, {"db-1": claim(phase="Pending")}, NOW,
                             storage_classes={"local": storage_class(binding="WaitForFirstConsumer")})  # fmt: skip
    assert problem.reason == "Unschedulable"
    assert problem.message == (f"instance db-1: its pod cannot be scheduled: {SCHEDULER} "
                               f"(runbook {runbook('Unschedulable')})")  # fmt: skip


def test_a_pod_bound_to_a_node_or_running_is_not_unschedulable_whatever_an_old_condition_says() -> None:
    stale = [scheduled("False", "Unschedulable", SCHEDULER)]
    assert pod_problems({"db-1": pod(node="node-a", conditions=stale)}, {}, NOW) == []
    running = pod(node=None, conditions=stale)
    running["status"]["phase"] = "Running"
    assert pod_problems({"db-1": running}, {}, NOW) == []


def test_a_pod_unschedulable_only_for_a_moment_is_not_reported_yet() -> None:
    moment = pod(node=None, conditions=[scheduled("False", "Unschedulable", SCHEDULER, since=UNSCHEDULABLE_GRACE / 2)])
    assert pod_problems({"db-1": moment}, {}, NOW) == []


# --- volumes --------------------------------------------------------------------------------------------------------


def test_a_claim_that_stays_pending_names_its_class() -> None:
    pending = claim(phase="Pending", created=PENDING_GRACE + 1, storage_class="slow")
    [problem] = pod_problems({}, {"db-1": pending}, NOW, storage_classes={"slow": storage_class("slow")})
    assert problem.reason == "VolumePending"
    assert "PersistentVolumeClaim db-1 (StorageClass slow) is still Pending" in problem.message


def test_a_claim_without_a_class_says_there_was_no_default_one() -> None:
    [problem] = pod_problems({}, {"db-1": claim(phase="Pending", storage_class=None)}, NOW)
    assert "PersistentVolumeClaim db-1 (no StorageClass named and no default one) is still Pending" in problem.message


def test_a_claim_just_created_or_waiting_for_its_pod_is_not_a_problem() -> None:
    classes = {"local": storage_class(binding="WaitForFirstConsumer")}
    unscheduled = pod(node=None, conditions=[scheduled("False", "Unschedulable", SCHEDULER, since=5)])
    old_claim = {"db-1": claim(phase="Pending", created=3600)}
    assert pod_problems({"db-1": unscheduled}, old_claim, NOW, storage_classes=classes) == []
    just = pod(conditions=[scheduled("True", since=PENDING_GRACE / 2)])
    assert pod_problems({"db-1": just}, old_claim, NOW, storage_classes=classes) == []
    fresh = {"db-1": claim(phase="Pending", created=PENDING_GRACE / 2)}
    assert pod_problems({}, fresh, NOW, storage_classes={"local": storage_class()}) == []


def test_a_scheduled_pod_whose_claim_is_never_provisioned_names_the_node() -> None:
    classes = {"local": storage_class(binding="WaitForFirstConsumer")}
    waited = claim(phase="Pending", created=3600)
    waited["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "node-b"}
    placed = pod(conditions=[scheduled("True", since=PENDING_GRACE + 5)])
    [problem] = pod_problems({"db-1": placed}, {"db-1": waited}, NOW, storage_classes=classes)
    assert (problem.reason, "on node node-b" in problem.message) == ("VolumePending", True)


def test_a_missing_storage_class_is_left_to_storage_class_not_found() -> None:
    assert pod_problems({}, {"db-1": claim(phase="Pending", storage_class="gone")}, NOW, storage_classes={}) == []


def test_a_failed_expansion_carries_the_resizers_message() -> None:
    error = {"type": "ControllerResizeError", "status": "True", "lastTransitionTime": ago(10),
             "message": "resize volume pvc-1 failed: quota exceeded"}  # fmt: skip
    [problem] = pod_problems({}, {"db-1": claim(conditions=[error])}, NOW)
    assert problem.reason == "VolumeResizeFailed"
    assert "PersistentVolumeClaim db-1 could not be expanded (ControllerResizeError): resize volume pvc-1 failed: " \
           "quota exceeded" in problem.message  # fmt: skip
    infeasible = claim(allocatedResourceStatuses={"storage": "NodeResizeInfeasible"})
    assert reasons(pod_problems({}, {"db-1": infeasible}, NOW)) == ["VolumeResizeFailed"]


def test_a_file_system_resize_is_reported_only_once_it_waited_long() -> None:
    def resizing(since: float) -> Obj:
        message = "Waiting for user to (re-)start a pod to finish file system resize"
        condition = {"type": "FileSystemResizePending", "status": "True", "lastTransitionTime": ago(since)}
        return claim(conditions=[{**condition, "message": message}])

    assert pod_problems({}, {"db-1": resizing(RESIZE_GRACE / 2)}, NOW) == []
    assert reasons(pod_problems({}, {"db-1": resizing(RESIZE_GRACE + 1)}, NOW)) == ["VolumeResizeFailed"]


# --- how they reach the status --------------------------------------------------------------------------------------


def test_every_reason_has_a_severity_and_a_runbook() -> None:
    for reason in ("ImagePullFailed", "ContainerCannotStart", "CrashLoopBackOff", "Unschedulable", "VolumePending",
                   "VolumeResizeFailed"):  # fmt: skip
        assert reason in SEVERITY
        text = (ROOT / runbook(reason)).read_text()
        assert text.startswith(f"# {reason}\n"), reason


def test_a_cluster_whose_image_is_missing_is_degraded_with_that_reason_not_merely_provisioning() -> None:
    plan = plan_instances("db", 1, ["db-1"], "db-1")
    problems = tuple(pod_problems({"db-1": pod(containers=[waiting("ImagePullBackOff")])}, {}, NOW))
    obs = Observation(plan=plan, hibernated=False, generation=1, reports={}, pods={}, storage=StoragePlan(),
                      problems=problems)  # fmt: skip
    status = compute_status({}, obs, NOW)
    degraded = {c["type"]: c for c in status["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "ImagePullFailed")
    assert IMAGE in degraded["message"]


def test_a_pod_cause_ranks_below_what_the_instances_themselves_report() -> None:
    found = ordered([Problem("CrashLoopBackOff", "a"), Problem("InvalidParameter", "b"), Problem("Unschedulable", "c")])
    assert reasons(found) == ["InvalidParameter", "Unschedulable", "CrashLoopBackOff"]
