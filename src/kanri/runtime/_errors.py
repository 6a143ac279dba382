"""Errors: what the API server said, and how a reconcile failure should be treated."""

from __future__ import annotations

import json
from typing import Any

# Statuses worth retrying: throttled, or the server (or something in front of it) briefly unavailable.
_TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# metav1.StatusReason by HTTP status, for answers without a Status body (a path the server does not serve answers
# "404 page not found" as plain text).
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """A non-2xx answer from the API server, with its Status object."""

    def __init__(self, status: int, body: dict[str, Any] | None = None, *, method: str = "", path: str = "") -> None:
        self.status = status
        self.body = body or {}
        self.method = method
        self.path = path
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}")

    @classmethod
    def from_bytes(cls, status: int, raw: bytes, *, method: str = "", path: str = "") -> ApiError:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"message": raw[:500].decode(errors="replace")}
        return cls(status, body if isinstance(body, dict) else {}, method=method, path=path)

    @property
    def reason(self) -> str:
        """The Status object's reason (``NotFound``, ``Invalid``, ...); derived from the HTTP status when the answer
        carried none."""
        return str(self.body.get("reason") or _REASONS.get(self.status, f"HTTP{self.status}"))

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409: a write met a newer resourceVersion (``Conflict``) or a create met an existing name
        (``AlreadyExists``); :attr:`already_exists` tells the second apart."""
        return self.status == 409

    @property
    def already_exists(self) -> bool:
        """A create named an object that exists (409 ``AlreadyExists``; apimachinery's ``IsAlreadyExists``).

        Usually harmless in a reconcile that creates a child the cache has not shown yet: read it and go on."""
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        """410: the requested resourceVersion was compacted away; the caller must relist."""
        return self.status == 410

    @property
    def transient(self) -> bool:
        return self.status in _TRANSIENT_STATUSES


class ReconcileError(Exception):
    """Base of the errors a reconciler raises to say how its failure should be handled."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(f"{reason}: {message}")


class TransientError(ReconcileError):
    """Something that may pass by itself: retried with per-key exponential backoff."""


class PermanentError(ReconcileError):
    """The user must change the object: not retried until its ``metadata.generation`` changes.

    ``reason`` is CamelCase (it becomes a condition reason); ``message`` says what to fix.
    """
