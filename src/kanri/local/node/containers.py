"""Pure parts of running containers: environment, ``$(VAR)`` expansion, restart back-off and pod status.

Nothing here touches processes or the API, so it is unit-tested directly; :mod:`kanri.local.node.kubelet` does the
doing.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kanri.runtime import get_condition

Obj = dict[str, Any]

Lookup = Callable[[str, str], Awaitable[Mapping[str, str] | None]]
"""``(namespace, name) -> data`` of a Secret (decoded) or ConfigMap; None when it does not exist."""


class EnvError(Exception):
    """An env var could not be resolved (missing, non-optional Secret/ConfigMap key): the container cannot start.
    ``reason`` is the kubelet's (``CreateContainerConfigError``)."""

    reason = "CreateContainerConfigError"


# --- environment --------------------------------------------------------------------------------------------------

_FIELD_PATHS: dict[str, Callable[[Obj], object]] = {
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "metadata.uid": lambda pod: pod["metadata"]["uid"],
    "spec.nodeName": lambda pod: (pod.get("spec") or {}).get("nodeName", ""),
    "spec.serviceAccountName": lambda pod: (pod.get("spec") or {}).get("serviceAccountName", ""),
    "status.podIP": lambda pod: (pod.get("status") or {}).get("podIP", ""),
    "status.podIPs": lambda pod: (pod.get("status") or {}).get("podIP", ""),
    "status.hostIP": lambda pod: (pod.get("status") or {}).get("hostIP", ""),
}
_LABEL_PATH = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Obj, path: str) -> str:
    """The value of a downward-API ``fieldRef.fieldPath``."""
    if path in _FIELD_PATHS:
        return str(_FIELD_PATHS[path](pod))
    match = _LABEL_PATH.match(path)
    if match:
        return str((pod["metadata"].get(match.group(1)) or {}).get(match.group(2), ""))
    raise EnvError(f"unsupported fieldPath {path!r}")


async def resolve_env(pod: Obj, container: Obj, secret: Lookup, config_map: Lookup, base: Mapping[str, str] = {}) -> (
    dict[str, str]
):  # fmt: skip
    """The container's environment: ``base`` (the image's), then ``env`` in order (later ``$(VAR)`` may refer to
    earlier ones, as in Kubernetes). ``envFrom`` is honoured for Secrets and ConfigMaps."""
    namespace = pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, lookup in (("secretRef", secret), ("configMapRef", config_map)):
            ref = source.get(kind)
            if ref is None:
                continue
            data = await lookup(namespace, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f'{"secret" if kind == "secretRef" else "configmap"} "{ref["name"]}" not found')
            env |= {prefix + key: value for key, value in data.items()}
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            is_secret = "secretKeyRef" in source
            ref = source["secretKeyRef" if is_secret else "configMapKeyRef"]
            found = await (secret if is_secret else config_map)(namespace, ref["name"])
            found_value = None if found is None else found.get(ref["key"])
            if found_value is None:
                if ref.get("optional"):
                    continue
                what = "secret" if is_secret else "configmap"
                if found is None:
                    raise EnvError(f'{what} "{ref["name"]}" not found')
                raise EnvError(f"couldn't find key {ref['key']} in {what} {namespace}/{ref['name']}")
            env[name] = found_value
        else:
            raise EnvError(f"env {name}: unsupported valueFrom {sorted(source)}")
    return env


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known vars are replaced, unknown ones stay as written, ``$$`` is ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(replace, text)


# --- restarts -----------------------------------------------------------------------------------------------------


def should_restart(restart_policy: str, exit_code: int) -> bool:
    """Whether a container that exited with ``exit_code`` is started again under the pod's ``restartPolicy``."""
    return restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)


def backoff_delay(crashes: int, base: float, maximum: float) -> float:
    """The kubelet's crash-loop back-off before the restart after the ``crashes``-th exit (1-based): ``base``,
    doubling, capped at ``maximum`` (10 s → 300 s in the kubelet)."""
    return float(min(base * 2 ** max(crashes - 1, 0), maximum))


# --- status ---------------------------------------------------------------------------------------------------------

StateKind = Literal["waiting", "running", "terminated"]


@dataclass
class ContainerState:
    """What the node knows of one container; ``status()`` is its ``containerStatuses`` entry."""

    name: str
    image: str
    kind: StateKind = "waiting"
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    restart_count: int = 0
    last_terminated: Obj | None = None
    final: bool = False
    """Terminated and not going to be started again (per restartPolicy)."""
    ever_started: bool = False
    probe_ready: bool = True
    """The readiness verdict of its probes for the running instance (True when it has no readiness probe)."""
    probe_started: bool = True
    """Whether its startup probe has succeeded for the running instance (True when it has none)."""

    @property
    def ready(self) -> bool:
        return self.kind == "running" and self.probe_ready and self.probe_started

    def terminated_state(self) -> Obj:
        state: Obj = {"exitCode": self.exit_code, "reason": self.reason}
        if self.message:
            state["message"] = self.message
        state |= {"startedAt": self.started_at, "finishedAt": self.finished_at, "containerID": ""}
        return {k: v for k, v in state.items() if v is not None and v != ""}

    def status(self) -> Obj:
        state: Obj
        if self.kind == "running":
            state = {"running": {"startedAt": self.started_at}}
        elif self.kind == "terminated":
            state = {"terminated": self.terminated_state()}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        return {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "started": self.kind == "running" and self.probe_started,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }


def resume(states: list[ContainerState], pod_status: Obj | None) -> None:
    """After the node restarted (``kanri local node start``): containers that had run count one more restart,
    with the run the node lost as their last state — exit code 255, reason ``Unknown``, as a kubelet reports the
    containers of a rebooted machine."""
    previous = {s.get("name"): s for s in (pod_status or {}).get("containerStatuses") or []}
    for state in states:
        old = previous.get(state.name)
        if old is None or not ((old.get("state") or {}).keys() & {"running", "terminated"}):
            continue
        started = ((old.get("state") or {}).get("running") or {}).get("startedAt")
        state.restart_count = int(old.get("restartCount") or 0) + 1
        state.last_terminated = {"exitCode": 255, "reason": "Unknown", **({"startedAt": started} if started else {})}
        state.ever_started = True


def phase(states: list[ContainerState]) -> str:
    """The pod phase from its containers: Pending while one has never run, Succeeded/Failed once all are final,
    Running otherwise (a container in back-off keeps the pod Running, as the kubelet does)."""
    if any(not s.ever_started and s.kind == "waiting" for s in states):
        return "Pending"
    if states and all(s.final for s in states):
        return "Succeeded" if all(s.exit_code == 0 for s in states) else "Failed"
    return "Running"


def now_iso(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_status(pod: Obj, states: list[ContainerState], *, host_ip: str, start_time: str, pod_ip: str | None = None,
                 now: datetime | None = None) -> Obj:  # fmt: skip
    """The ``status`` fields the node owns, merged onto the pod's current conditions (``lastTransitionTime`` only
    moves on a flip). Compare with :func:`owned_fields` of the current status to decide whether to write."""
    pod_phase = phase(states)
    conditions = copy.deepcopy((pod.get("status") or {}).get("conditions") or [])
    unready = [s.name for s in states if not s.ready]
    if unready:
        reason = "PodCompleted" if pod_phase in ("Succeeded", "Failed") else "ContainersNotReady"
        message = "" if reason == "PodCompleted" else f"containers with unready status: [{' '.join(unready)}]"
        ready: tuple[str, str, str] = ("False", reason, message)
    else:
        ready = ("True", "", "")
    stamp = now_iso(now)
    for kind, (status, reason, message) in (
        ("Initialized", ("True", "" if pod_phase not in ("Succeeded", "Failed") else "PodCompleted", "")),
        ("ContainersReady", ready),
        ("Ready", ready),
        ("PodScheduled", ("True", "", "")),  # as the kubelet does: it runs here, however it got here
    ):
        _set_condition(conditions, kind, status, reason, message, stamp)
    result: Obj = {
        "phase": pod_phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [s.status() for s in states],
    }
    if pod_ip:
        result |= {"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]}
    return result


def _set_condition(conditions: list[Obj], kind: str, status: str, reason: str, message: str, now: str) -> None:
    """A pod condition as the kubelet writes it: no observedGeneration, empty reason/message omitted,
    ``lastTransitionTime`` moved only when the status flips."""
    existing = get_condition(conditions, kind)
    condition: Obj = {"type": kind, "status": status, "lastProbeTime": None}
    condition["lastTransitionTime"] = (
        existing["lastTransitionTime"] if existing is not None and existing.get("status") == status else now
    )
    condition |= {k: v for k, v in (("reason", reason), ("message", message)) if v}
    if existing is None:
        conditions.append(condition)
    else:
        conditions[conditions.index(existing)] = condition


def owned_fields(status: Obj | None) -> Obj:
    """The part of a pod's status :func:`build_status` produces, to compare against (normalised the same way)."""
    status = status or {}
    conditions = copy.deepcopy(status.get("conditions") or [])
    for condition in conditions:
        condition.setdefault("lastProbeTime", None)
    return {
        "phase": status.get("phase"),
        "conditions": conditions,
        "hostIP": status.get("hostIP"),
        "hostIPs": status.get("hostIPs"),
        "startTime": status.get("startTime"),
        "containerStatuses": status.get("containerStatuses"),
    } | ({"podIP": status["podIP"], "podIPs": status.get("podIPs")} if status.get("podIP") else {})


def ready_condition(status: Obj) -> Obj | None:
    return get_condition(status.get("conditions"), "Ready")
