"""Who may read ``/metrics``: a bearer token the API server vouches for, allowed ``get`` on the URL.

controller-runtime's ``filters.WithAuthenticationAndAuthorization`` in Python: the token goes to a TokenReview
(who is this?), the user it names to a SubjectAccessReview on the non-resource URL (may they ``get /metrics``?).
Grant it with a ClusterRole ``{nonResourceURLs: ["/metrics"], verbs: ["get"]}`` bound to the scraper's identity.
Answers are remembered for a short while per token (by its SHA-256, never the token itself), so a scrape every few
seconds costs the API server two requests a minute, and a revoked binding stops working within that while.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from kanri.runtime._client import Client
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import SUBJECT_ACCESS_REVIEW, TOKEN_REVIEW

log = structlog.get_logger("kanri.manager.metrics")

Obj = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: the HTTP status to send (200 to serve it) and why, for the response body."""

    status: int
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


UNAUTHENTICATED = Verdict(401, "a bearer token the API server accepts is required")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when absent or of another scheme."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_review(token: str) -> Obj:
    return {"spec": {"token": token}}


def access_review(user: Obj, path: str, verb: str = "get") -> Obj:
    """A SubjectAccessReview for ``user`` (a TokenReview's ``status.user``) on the non-resource URL ``path``."""
    spec: Obj = {"nonResourceAttributes": {"path": path, "verb": verb}, "user": user.get("username", "")}
    if groups := user.get("groups"):
        spec["groups"] = list(groups)
    if uid := user.get("uid"):
        spec["uid"] = uid
    if extra := user.get("extra"):
        spec["extra"] = dict(extra)
    return {"spec": spec}


def decide(reviewed: Obj, access: Obj | None, path: str) -> Verdict:
    """The verdict from a TokenReview's answer and, when it authenticated, the SubjectAccessReview's (pure)."""
    status = reviewed.get("status") or {}
    if not status.get("authenticated"):
        return UNAUTHENTICATED
    user = (status.get("user") or {}).get("username") or "?"
    if access is None or not (access.get("status") or {}).get("allowed"):
        return Verdict(403, f'{user} may not get {path} (grant nonResourceURLs ["{path}"], verb get)')
    return Verdict(200, f"{user} may get {path}")


class MetricsAuthorizer:
    """Checks ``Authorization`` headers for ``path`` through the API server (see the module's docstring)."""

    def __init__(
        self,
        client: Client,
        *,
        path: str = "/metrics",
        ttl: float = 30.0,
        max_entries: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.path = path
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self._verdicts: dict[bytes, tuple[float, Verdict]] = {}  # SHA-256 of the token → (until, verdict)

    async def check(self, authorization: str | None) -> Verdict:
        """The verdict for a request bearing ``authorization``; an API server that cannot answer is a 503 (and
        nothing is remembered, so the next scrape asks again)."""
        token = bearer_token(authorization)
        if token is None:
            return UNAUTHENTICATED
        key = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        if (known := self._verdicts.get(key)) is not None and known[0] > now:
            return known[1]
        try:
            reviewed = await self.client.create(TOKEN_REVIEW, token_review(token))
            user = (reviewed.get("status") or {}).get("user") or {}
            access = None
            if (reviewed.get("status") or {}).get("authenticated"):
                access = await self.client.create(SUBJECT_ACCESS_REVIEW, access_review(user, self.path))
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("cannot review a metrics request", error=type(exc).__name__)
            return Verdict(503, "the API server could not review the token; try again")
        verdict = decide(reviewed, access, self.path)
        if not verdict.allowed:
            log.info("refused a metrics request", status=verdict.status, reason=verdict.reason)
        self._remember(key, verdict, now)
        return verdict

    def _remember(self, key: bytes, verdict: Verdict, now: float) -> None:
        if len(self._verdicts) >= self.max_entries:  # many different tokens: forget the expired, else everything
            self._verdicts = {k: v for k, v in self._verdicts.items() if v[0] > now}
            if len(self._verdicts) >= self.max_entries:
                self._verdicts.clear()
        self._verdicts[key] = (now + self.ttl, verdict)
