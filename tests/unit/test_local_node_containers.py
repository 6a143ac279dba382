"""Pure parts of the local node's kubelet: image map, command line, env, back-off, status."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kanri.local.node.containers import (
    ContainerState,
    EnvError,
    backoff_delay,
    build_status,
    expand,
    owned_fields,
    phase,
    resolve_env,
    should_restart,
)
from kanri.local.node.images import ImageEntry, ImageMap, command_line
from kanri.local.node.kubelet import exit_code, log_path, user_and_group

Obj = dict[str, Any]

POD: Obj = {
    "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
    "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "img"}]},
}


# --- image map ---------------------------------------------------------------------------------------------------


def test_exact_entries_win_over_globs_and_first_glob_wins(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text("images:\n- image: 'kanri.dev/*'\n  command: [/bin/false]\n")
    images = ImageMap.load(
        path,
        [
            {"image": "kanri.dev/test/*", "command": ["/bin/sh", "-c"]},
            {"image": "kanri.dev/test/sleeper:1", "command": ["/usr/bin/sleep"], "args": ["5"]},
        ],
    )
    assert images.resolve("kanri.dev/test/sleeper:1") == ImageEntry(
        "kanri.dev/test/sleeper:1", ("/usr/bin/sleep",), ("5",)
    )
    entry = images.resolve("kanri.dev/test/sh:1")
    assert entry is not None
    assert entry.command == ("/bin/sh", "-c")
    other = images.resolve("kanri.dev/other:2")
    assert other is not None
    assert other.command == ("/bin/false",)
    assert images.resolve("docker.io/library/nginx:1") is None
    assert str(path) in images.not_mapped_message("docker.io/library/nginx:1")


def test_json_image_map_and_bad_entries(tmp_path: Path) -> None:
    path = tmp_path / "images.json"
    path.write_text(json.dumps([{"image": "a", "command": ["/bin/true"], "workingDir": "/tmp", "env": {"X": 1}}]))
    entry = ImageMap.load(path).resolve("a")
    assert entry is not None
    assert (entry.working_dir, dict(entry.env)) == ("/tmp", {"X": "1"})
    with pytest.raises(ValueError, match="command"):
        ImageMap.load(None, [{"image": "b", "command": "/bin/true"}])
    assert "no image map file" in ImageMap.load(None).not_mapped_message("x")


@pytest.mark.parametrize(
    ("container", "argv"),
    [
        ({}, ["/entry", "default"]),
        ({"args": ["a"]}, ["/entry", "a"]),
        ({"args": []}, ["/entry"]),
        ({"command": ["/other"]}, ["/other"]),
        ({"command": ["/other"], "args": ["x"]}, ["/other", "x"]),
    ],
)
def test_command_and_args_override_like_kubernetes(container: Obj, argv: list[str]) -> None:
    assert command_line(container, ImageEntry("i", ("/entry",), ("default",))) == argv


# --- environment -------------------------------------------------------------------------------------------------


def lookup(objects: Mapping[str, Mapping[str, str]]) -> Any:
    async def read(namespace: str, name: str) -> Mapping[str, str] | None:
        assert namespace == "shop"
        return objects.get(name)

    return read


async def test_env_values_field_refs_secrets_and_config_maps() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}}},
            {"name": "URL", "value": "http://$(NAME):80/$(UNKNOWN)"},
        ],
    }
    env = await resolve_env(
        POD, container, lookup({"creds": {"password": "pw"}}), lookup({"settings": {"mode": "fast"}}), {"BASE": "1"}
    )
    assert env == {
        "BASE": "1",
        "CFG_mode": "fast",
        "NAME": "web-0",
        "NS": "shop",
        "UID": "u-1",
        "NODE": "n1",
        "IP": "",
        "APP": "web",
        "PASSWORD": "pw",
        "MODE": "fast",
        "URL": "http://web-0:80/$(UNKNOWN)",
    }


async def test_missing_secret_or_key_cannot_start_the_container() -> None:
    missing_key = {"env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope"}}}]}
    with pytest.raises(EnvError, match="couldn't find key nope in secret shop/creds"):
        await resolve_env(POD, missing_key, lookup({"creds": {"password": "pw"}}), lookup({}))
    missing = {"env": [{"name": "P", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]}
    with pytest.raises(EnvError, match='configmap "gone" not found'):
        await resolve_env(POD, missing, lookup({}), lookup({}))


def test_expand() -> None:
    assert expand("$(A)-$$(A)-$(B)", {"A": "x"}) == "x-$(A)-$(B)"


# --- restarts, users, paths ----------------------------------------------------------------------------------------


def test_restart_policy_and_backoff() -> None:
    assert should_restart("Always", 0)
    assert should_restart("OnFailure", 1)
    assert not should_restart("OnFailure", 0)
    assert not should_restart("Never", 1)
    assert [backoff_delay(n, 10, 300) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]


def test_exit_codes_users_and_log_paths() -> None:
    assert (exit_code(3), exit_code(-9), exit_code(-15)) == (3, 137, 143)
    pod = {"spec": {"securityContext": {"runAsUser": 65534, "runAsGroup": 100}}}
    assert user_and_group(pod, {}) == (65534, 100)
    assert user_and_group(pod, {"securityContext": {"runAsUser": 0, "runAsGroup": 0}}) == (0, 0)
    assert user_and_group({"spec": {}}, {"securityContext": {"runAsUser": 65534}}) == (65534, 65534)  # nogroup
    assert user_and_group({"spec": {}}, {}) == (None, None)
    assert log_path(Path("/d"), "ns", "p", "u", "c", 2) == Path("/d/pods/ns_p_u/c/2.log")


# --- status ------------------------------------------------------------------------------------------------------

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def running(name: str = "main") -> ContainerState:
    return ContainerState(name, "img", kind="running", started_at="t0", ever_started=True)


def done(code: int, name: str = "main") -> ContainerState:
    return ContainerState(name, "img", kind="terminated", exit_code=code, final=True, ever_started=True)


def test_phase() -> None:
    assert phase([ContainerState("a", "i")]) == "Pending"
    assert phase([running(), ContainerState("b", "i")]) == "Pending"
    assert phase([running()]) == "Running"
    backing_off = ContainerState("a", "i", reason="CrashLoopBackOff", ever_started=True)
    assert phase([backing_off]) == "Running"
    assert phase([done(0), done(0, "b")]) == "Succeeded"
    assert phase([done(0), done(1, "b")]) == "Failed"
    assert phase([done(0), running("b")]) == "Running"


def test_running_pod_status_is_ready_and_stable() -> None:
    status = build_status(POD, [running()], host_ip="10.244.0.1", start_time="t0", now=NOW)
    assert status["phase"] == "Running"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert {k: c["status"] for k, c in conditions.items()} == {
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
        "PodScheduled": "True",
    }
    assert status["containerStatuses"][0]["state"] == {"running": {"startedAt": "t0"}}
    assert status["containerStatuses"][0]["ready"] is True
    # Written once, the same state later builds the same status: nothing to write.
    written = {**POD, "status": status}
    again = build_status(written, [running()], host_ip="10.244.0.1", start_time="t0", now=datetime.now(UTC))
    assert again == owned_fields(status)


def test_crash_loop_and_failed_status() -> None:
    state = ContainerState("main", "img", reason="CrashLoopBackOff", message="back-off 10s", restart_count=1,
                           ever_started=True, last_terminated={"exitCode": 137, "reason": "Error"})  # fmt: skip
    status = build_status(POD, [state], host_ip="h", start_time="t0", now=NOW)
    entry = status["containerStatuses"][0]
    assert entry["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
    assert entry["lastState"] == {"terminated": {"exitCode": 137, "reason": "Error"}}
    assert (entry["restartCount"], entry["ready"]) == (1, False)
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ContainersNotReady",
        "containers with unready status: [main]",
    )
    failed = build_status(POD, [done(3)], host_ip="h", start_time="t0", now=NOW)
    assert failed["phase"] == "Failed"
    assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert {c["type"]: c for c in failed["conditions"]}["Ready"]["reason"] == "PodCompleted"


def test_an_image_entry_lists_the_host_directories_of_its_own_files() -> None:
    entry = ImageEntry.parse({"image": "i", "command": ["/entry"], "paths": ["/opt/pg/18"]})
    assert entry.paths == ("/opt/pg/18",)
    assert ImageEntry.parse({"image": "i", "command": ["/entry"]}).paths == ()
    with pytest.raises(ValueError, match="absolute paths"):
        ImageEntry.parse({"image": "i", "command": ["/entry"], "paths": ["relative/dir"]})
