"""The /metrics authorizer: its decisions and its memory (the API server side: integration/test_metrics_auth.py)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kanri.runtime import ApiError, Client
from kanri.runtime._metrics_auth import MetricsAuthorizer, access_review, bearer_token, decide
from kanri.runtime.kinds import SUBJECT_ACCESS_REVIEW, TOKEN_REVIEW

Obj = dict[str, Any]
USER = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u1", "groups": ["system:serviceaccounts"]}


def test_only_a_bearer_header_carries_a_token() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_the_access_review_names_the_user_and_the_url() -> None:
    review = access_review(USER | {"extra": {"k": ["v"]}}, "/metrics")
    assert review["spec"] == {
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        "user": USER["username"], "groups": ["system:serviceaccounts"], "uid": "u1", "extra": {"k": ["v"]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("reviewed", "access", "status"),
    [
        ({"status": {"authenticated": False}}, None, 401),
        ({}, None, 401),
        ({"status": {"authenticated": True, "user": USER}}, {"status": {"allowed": False}}, 403),
        ({"status": {"authenticated": True, "user": USER}}, None, 403),
        ({"status": {"authenticated": True, "user": USER}}, {"status": {"allowed": True}}, 200),
    ],
)
def test_decide(reviewed: Obj, access: Obj | None, status: int) -> None:
    assert decide(reviewed, access, "/metrics").status == status


class FakeReviews:
    """The client boundary: TokenReview and SubjectAccessReview answers, and the requests seen."""

    def __init__(self, *, allowed: bool = True, fail: bool = False) -> None:
        self.allowed = allowed
        self.fail = fail
        self.sent: list[tuple[str, Obj]] = []

    async def create(self, kind: Any, body: Obj) -> Obj:
        self.sent.append((kind.kind, body))
        if self.fail:
            raise ApiError(503, {"message": "unavailable"})
        if kind is TOKEN_REVIEW:
            good = body["spec"]["token"] == "good"
            return {"status": {"authenticated": good, "user": USER if good else {}}}
        assert kind is SUBJECT_ACCESS_REVIEW
        return {"status": {"allowed": self.allowed}}


def authorizer(reviews: FakeReviews, now: list[float]) -> MetricsAuthorizer:
    return MetricsAuthorizer(cast(Client, reviews), ttl=30.0, clock=lambda: now[0])


async def test_a_verdict_is_remembered_for_its_ttl_and_asked_again_after() -> None:
    reviews, now = FakeReviews(), [0.0]
    auth = authorizer(reviews, now)
    async with asyncio.timeout(5):
        assert (await auth.check("Bearer good")).status == 200
        assert (await auth.check("Bearer good")).status == 200
        assert len(reviews.sent) == 2, "one TokenReview + one SubjectAccessReview, then memory"
        reviews.allowed = False
        now[0] = 31.0
        assert (await auth.check("Bearer good")).status == 403, "a revoked grant is seen after the ttl"
        assert (await auth.check("Bearer bad")).status == 401
        assert (await auth.check(None)).status == 401
    assert [kind for kind, _ in reviews.sent] == ["TokenReview", "SubjectAccessReview"] * 2 + ["TokenReview"]


async def test_an_api_server_that_cannot_answer_is_a_503_and_is_not_remembered() -> None:
    reviews, now = FakeReviews(fail=True), [0.0]
    auth = authorizer(reviews, now)
    async with asyncio.timeout(5):
        assert (await auth.check("Bearer good")).status == 503
        reviews.fail = False
        assert (await auth.check("Bearer good")).status == 200


def test_the_token_is_never_kept_in_the_clear() -> None:
    reviews, now = FakeReviews(), [0.0]
    auth = authorizer(reviews, now)
    asyncio.run(auth.check("Bearer good"))
    assert "good" not in repr(auth._verdicts)
