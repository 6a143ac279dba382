"""One-shot job pods: a pod that runs once under a fixed name and answers with a JSON verdict in its termination
message. Both sides are here: :func:`write_verdict` in the pod, :func:`read_verdict` and :class:`OneShotPods` in the
operator.

The verdict is one JSON object with at least ``result`` (``Succeeded`` or ``Failed``) and ``message``, written as
the container's termination message (``/dev/termination-log``, of which the kubelet keeps 4096 bytes) and printed
as the last line of stdout. The pod's container sets ``terminationMessagePolicy: FallbackToLogsOnError``
(:func:`one_shot`), so a pod killed before it wrote one still says why in its log's tail.

Anyone who may create pods in the namespace can create one under the fixed name, labels and even an owner reference
included. So a pod is **trusted** only when its uid is the one the operator recorded in ``status.oneShotPods`` (name
-> uid) right after creating it — a state-machine record, committed at once — and its controller is the owner.
Any other pod of the name is **foreign**: never read, never deleted, reported as a ``ForeignPod`` problem; the step
waits until it is gone.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from kanri.kit._pass import PassContext
from kanri.kit._problems import Problem, child_rejected
from kanri.runtime import ApiError, is_controlled_by, parse_time, set_owner
from kanri.runtime.kinds import POD

__all__ = [
    "FIELD",
    "FOREIGN_POD",
    "MESSAGE_LIMIT",
    "OneShotPods",
    "Verdict",
    "one_shot",
    "read_verdict",
    "write_verdict",
]

Obj = dict[str, Any]
FIELD = "oneShotPods"
FOREIGN_POD = "ForeignPod"
MESSAGE_LIMIT = 4096
"""The kubelet keeps at most this many bytes of a termination message."""
TERMINATION_LOG = Path("/dev/termination-log")
Outcome = Literal["Succeeded", "Failed"]


@dataclass(frozen=True)
class Verdict:
    """What a one-shot pod answered (or what the operator concluded when it did not)."""

    result: Outcome
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    """The verdict's other fields, as the pod wrote them."""

    @property
    def succeeded(self) -> bool:
        return self.result == "Succeeded"


# --- the pod's side ----------------------------------------------------------------------------------------------


def _line(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def write_verdict(result: Outcome, message: str, *, path: Path = TERMINATION_LOG, **details: Any) -> str:
    """Write the verdict as the termination message and print it (the last line of stdout); returns the line.

    The message is shortened, never the verdict dropped, when the whole would exceed :data:`MESSAGE_LIMIT`."""
    document = {**details, "result": result, "message": message}
    line = _line(document)
    kept = message
    while len(line.encode()) > MESSAGE_LIMIT and kept:
        over = len(line.encode()) - MESSAGE_LIMIT
        kept = kept[: max(0, len(kept) - over - 1)]
        document["message"] = kept + "…"
        line = _line(document)
    if len(line.encode()) > MESSAGE_LIMIT:  # the details alone are too long: keep the verdict, drop them
        line = _line({"result": result, "message": message[:1000]})
    with contextlib.suppress(OSError):  # outside a pod: stdout is enough
        path.write_text(line)
    print(line, flush=True)
    return line


# --- the operator's side -----------------------------------------------------------------------------------------


def one_shot(pod: Obj) -> Obj:
    """A copy of ``pod`` made to run once and answer: ``restartPolicy: Never`` and every container's
    ``terminationMessagePolicy: FallbackToLogsOnError``."""
    made = copy.deepcopy(pod)
    spec = made.setdefault("spec", {})
    spec["restartPolicy"] = "Never"
    for container in spec.get("containers") or ():
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return made


def _created(pod: Obj, now: datetime) -> datetime:
    try:
        return parse_time(str(pod["metadata"].get("creationTimestamp")))
    except ValueError:
        return now


def read_verdict(pod: Obj, *, timeout: timedelta, now: datetime | None = None) -> Verdict | None:
    """The pod's verdict once it ended, or a ``Failed`` one when it ran past ``timeout`` or ended without one; None
    while it runs."""
    now = now or datetime.now(UTC)
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        if now - _created(pod, now) < timeout:
            return None
        return Verdict("Failed", f"the pod did not finish within {timeout} (phase {phase or 'Pending'})")
    terminated: Obj = {}
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or terminated
    raw = str(terminated.get("message") or "").strip()
    for line in reversed(raw.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("result") in ("Succeeded", "Failed"):
            details = {k: v for k, v in found.items() if k not in ("result", "message")}
            return Verdict(found["result"], str(found.get("message") or ""), details)
    why = terminated.get("reason") or status.get("reason") or phase
    tail = " ".join(raw.splitlines()[-5:])[-1500:]
    message = f"the pod ended without a verdict ({why}, exit code {terminated.get('exitCode')})"
    return Verdict("Failed", message + (f": {tail}" if tail else ""))


class OneShotPods:
    """The one-shot pods of one object, through its pass: start one, read its verdict, clear it."""

    def __init__(self, ctx: PassContext) -> None:
        self._ctx = ctx

    def recorded(self, name: str) -> str | None:
        """The uid recorded for the pod ``name``."""
        value = (self._ctx.ledger.status.get(FIELD) or {}).get(name)
        return str(value) if value else None

    def trusted(self, pod: Obj) -> bool:
        """The operator created ``pod`` for this object: its uid is recorded and its controller is the object."""
        uid = pod["metadata"].get("uid")
        return bool(uid) and uid == self.recorded(pod["metadata"]["name"]) and is_controlled_by(pod, self._ctx.obj)

    def _pod(self, name: str) -> Obj | None:
        return self._ctx.cache.get(POD, name, self._ctx.namespace)

    def foreign(self, name: str, purpose: str) -> bool:
        """Whether a pod the operator did not create holds ``name`` (then a ``ForeignPod`` problem is added)."""
        pod = self._pod(name)
        if pod is None or pod["metadata"].get("deletionTimestamp") or self.trusted(pod):
            return False
        self._ctx.problems.add(Problem(FOREIGN_POD, f"Pod {name} was not created by the operator for this object "
                                       f"(its uid is not the one in status.{FIELD}): it is neither read nor deleted, "
                                       f"and {purpose} waits until it is gone"))  # fmt: skip
        return True

    async def start(self, pod: Obj) -> bool:
        """Create ``pod`` (owned by the object, made :func:`one_shot`) and commit its uid at once; True when created.
        False when a pod of the name exists (ours, not yet in the cache, or a foreign one) or the write was refused
        (a ``ChildRejected`` problem)."""
        made = set_owner(one_shot(pod), self._ctx.obj)
        made["metadata"].setdefault("namespace", self._ctx.namespace)
        name = made["metadata"]["name"]
        try:
            created = await self._ctx.client.create(POD, made)
        except ApiError as exc:
            if exc.conflict:
                return False
            if exc.transient:
                raise
            self._ctx.problems.add(child_rejected("Pod", name, exc))
            return False
        await self._record(name, str(created["metadata"]["uid"]))
        return True

    def verdict(self, name: str, *, timeout: timedelta, now: datetime | None = None) -> Verdict | None:
        """The verdict of our pod ``name`` (None while it runs, or when the pod is not ours or not there)."""
        pod = self._pod(name)
        if pod is None or not self.trusted(pod):
            return None
        return read_verdict(pod, timeout=timeout, now=now)

    async def clear(self, name: str) -> None:
        """Delete our pod ``name`` (a foreign one is never deleted) and drop its record."""
        pod = self._pod(name)
        if pod is not None and self.trusted(pod):
            await self._ctx.client.delete(POD, name, self._ctx.namespace, uid=pod["metadata"]["uid"])
        if self.recorded(name) is not None:
            await self._record(name, None)

    async def _record(self, name: str, uid: str | None) -> None:
        pods = {**(self._ctx.ledger.status.get(FIELD) or {})}
        if uid is None:
            pods.pop(name, None)
        else:
            pods[name] = uid
        await self._ctx.ledger.commit(FIELD, pods or None)
