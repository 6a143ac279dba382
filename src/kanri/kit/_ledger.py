"""The status ledger: one status write per pass, and state-machine records committed before anyone acts on them.

Steps *stage* what they observed — top-level status fields and conditions — on the ledger; :meth:`StatusLedger.flush`
writes all of it with one merge patch at the end of the pass (``kanri.runtime.update_status``: nothing is sent when
the status already says it, so a converged object costs no write; a conflict re-reads the object and tries again,
since staged values are absolute). A state machine's record is different: it must exist in status *before* its
next step acts, so that an operator restarted in between finds the intent and carries on.
:meth:`StatusLedger.commit` writes one such field at once, guarded by the resourceVersion the pass saw: a 409
means someone changed the object since, and the pass must decide again from a fresh read (the error propagates;
the controller retries with backoff).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from kanri.runtime import ApiError, Client, Kind, get_condition, update_status

__all__ = ["PrunedFieldError", "StatusLedger", "field_patches", "merge_patch"]

Obj = dict[str, Any]
M = TypeVar("M", bound=BaseModel)
_FLUSH_ATTEMPTS = 3


class PrunedFieldError(RuntimeError):
    """A committed status field did not survive the write: the CRD's schema lacks it (a programming error)."""


def _now() -> datetime:
    return datetime.now(UTC)


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) turning ``old`` into ``new``: changed keys, removed keys as None (lists and
    scalars are replaced whole). Equal inputs give ``{}`` for objects."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return copy.deepcopy(new)
    patch: Obj = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value) if isinstance(value, Mapping) else copy.deepcopy(value)
    return patch


def field_patches(status: Mapping[str, Any], fields: Mapping[str, Any]) -> Obj:
    """The top-level status fields that differ from ``status``, each as the merge patch from its old value (so a
    record staged without a key it had loses that key, instead of the merge keeping it)."""
    return {name: merge_patch(status.get(name), value) for name, value in fields.items() if status.get(name) != value}


def _plain(record: BaseModel | Mapping[str, Any] | None) -> Any:
    if isinstance(record, BaseModel):
        return record.model_dump(mode="json", by_alias=True, exclude_none=True)
    return None if record is None else dict(record)


class StatusLedger:
    """The status of one object over one pass (``obj`` as read from the cache at the start of the pass)."""

    def __init__(
        self,
        client: Client,
        kind: Kind,
        obj: Obj,
        *,
        field_manager: str | None = None,
        now: Callable[[], datetime] = _now,
    ) -> None:
        self._client = client
        self._kind = kind
        self._obj = obj
        self._before: Obj = copy.deepcopy(obj.get("status") or {})
        self._field_manager = field_manager
        self._now = now
        self._fields: Obj = {}
        self._conditions: dict[str, Obj] = {}
        self.writes = 0
        """Status writes sent so far (a converged pass sends none)."""

    # --- what the pass sees ----------------------------------------------------------------------------------------

    @property
    def obj(self) -> Obj:
        """The object as last read or written by this ledger (a commit returns the new resourceVersion)."""
        return self._obj

    @property
    def status(self) -> Obj:
        """The object's status as last read or written (staged values are not in it until :meth:`flush`)."""
        return dict(self._obj.get("status") or {})

    @property
    def before(self) -> Obj:
        """The status as it was when the pass began (what Events compare against)."""
        return self._before

    def record(self, field: str, model: type[M]) -> M | None:
        """The typed record in ``status.<field>``, or None when there is none."""
        raw = self.status.get(field)
        return None if raw is None else model.model_validate(raw)

    # --- staging: written once, by flush ---------------------------------------------------------------------------

    def stage(self, field: str, value: Any) -> None:
        """Have ``status.<field>`` say ``value`` (None removes it) when the pass is flushed."""
        self._fields[field] = _plain(value) if isinstance(value, BaseModel) else value

    def condition(self, type: str, status: bool | str, reason: str, message: str) -> None:
        """Have the condition ``type`` say this when the pass is flushed (the last word of the pass wins)."""
        self._conditions[type] = {"type": type, "status": status, "reason": reason, "message": message}

    @property
    def staged(self) -> Obj:
        """The fields staged so far (a copy): field -> value."""
        return dict(self._fields)

    def staged_condition(self, type: str) -> Obj | None:
        return self._conditions.get(type)

    def condition_now(self, type: str) -> Obj | None:
        """The condition ``type`` as the object says it now (not what is staged)."""
        return get_condition(self.status.get("conditions") or [], type)

    async def flush(self) -> bool:
        """Write everything staged with one patch, nothing when the status already says it; True when written.

        Conditions of other types stay. A conflict (someone wrote the object meanwhile) re-reads it and tries again;
        an object gone meanwhile is no error (False)."""
        if not self._fields and not self._conditions:
            return False
        for attempt in range(_FLUSH_ATTEMPTS):
            try:
                fields = field_patches(self._obj.get("status") or {}, self._fields)
                written = await update_status(
                    self._client, self._kind, self._obj, fields=fields,
                    conditions=list(self._conditions.values()), field_manager=self._field_manager, now=self._now(),
                )  # fmt: skip
            except ApiError as exc:
                if not exc.conflict or attempt == _FLUSH_ATTEMPTS - 1:
                    raise
                if not await self._reread():
                    return False
                continue
            self.writes += int(written)
            return written
        return False  # unreachable: the last attempt returns or raises

    async def _reread(self) -> bool:
        meta = self._obj["metadata"]
        try:
            self._obj = await self._client.get(self._kind, meta["name"], meta.get("namespace"))
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    # --- commits: written now --------------------------------------------------------------------------------------

    async def commit(self, field: str, record: BaseModel | Mapping[str, Any] | None) -> bool:
        """Write ``status.<field>`` now (None removes it), guarded by the resourceVersion this ledger last saw; True
        when written, False when it already said that.

        For a state machine's record: commit the next phase *before* its handler acts. Raises :class:`ApiError`
        with ``.conflict`` when the object changed since it was read: decide again from a fresh read.
        """
        new = _plain(record)
        old = self.status.get(field)
        if old == new:
            return False
        meta = self._obj["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": {field: merge_patch(old, new)}}
        updated = await self._client.patch_status(
            self._kind, meta["name"], body, meta.get("namespace"), field_manager=self._field_manager
        )
        self._obj = updated
        self.writes += 1
        if new is not None and (updated.get("status") or {}).get(field) is None:
            # the API server prunes what the CRD's schema does not declare: a record that vanishes would be
            # decided again every pass, and the action repeated
            raise PrunedFieldError(
                f"status.{field} of {self._kind.kind} is not in its CRD's schema: the API server pruned it (declare "
                "it in the status model, e.g. by subclassing kanri.kit.KitStatus)"
            )
        return True
