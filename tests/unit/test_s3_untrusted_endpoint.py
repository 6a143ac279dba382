"""The operator's S3 client against a hostile server on 127.0.0.1 (tests/hostile_s3.py, a real aiohttp server):
a listing that pages forever stops at the page limit or the deadline, a body without end is refused at the size
limit, a server that never answers is given up at the request deadline — each an S3Error naming the limit."""

from __future__ import annotations

import time

import pytest

from kanri.postgres.backup.s3 import S3Client, S3Error, S3Keys
from tests.hostile_s3 import hostile_s3

KEYS = S3Keys("AKIDEXAMPLE", "do-not-leak-this-secret")
pytestmark = pytest.mark.timeout(60)


async def test_a_listing_that_pages_forever_stops_at_the_page_limit() -> None:
    async with hostile_s3("pages") as server, S3Client(server.endpoint, KEYS) as s3:
        with pytest.raises(S3Error) as caught:
            await s3.list_keys("bucket", "orders/", max_pages=25)
    assert "limit of 25 pages" in str(caught.value)
    assert len(server.requests) == 25
    assert "k/" not in str(caught.value)  # names the limit, never a key
    assert KEYS.secret_access_key not in str(caught.value)


async def test_a_listing_that_pages_forever_stops_at_its_deadline() -> None:
    async with hostile_s3("pages") as server, S3Client(server.endpoint, KEYS) as s3:
        started = time.monotonic()
        with pytest.raises(S3Error) as caught:
            await s3.list_keys("bucket", "orders/", max_pages=10**9, deadline=1.0)
        took = time.monotonic() - started
    assert "deadline of 1s" in str(caught.value)
    assert took < 10, took
    assert len(server.requests) > 1  # it did page until the deadline


async def test_a_body_without_end_is_refused_at_the_size_limit() -> None:
    async with hostile_s3("huge") as server, S3Client(server.endpoint, KEYS, max_body=1024 * 1024) as s3:
        with pytest.raises(S3Error) as caught:
            await s3.list_keys("bucket", "orders/")
    assert "exceeds the limit of 1048576 bytes" in str(caught.value)
    assert len(server.requests) == 1


async def test_a_server_that_never_answers_is_given_up_at_the_request_deadline() -> None:
    async with hostile_s3("silent") as server, S3Client(server.endpoint, KEYS, timeout=1.0) as s3:
        started = time.monotonic()
        with pytest.raises(S3Error) as caught:
            await s3.list_keys("bucket", "orders/")
        took = time.monotonic() - started
    assert "ListObjectsV2 on bucket bucket: " in str(caught.value)
    assert "Timeout" in str(caught.value)
    assert took < 10, took
    assert len(server.requests) == 1


async def test_a_deletion_against_a_server_that_never_answers_is_given_up_too() -> None:
    async with hostile_s3("silent") as server, S3Client(server.endpoint, KEYS, timeout=1.0) as s3:
        with pytest.raises(S3Error, match="DeleteObjects"):
            await s3.delete_keys("bucket", ["orders/a"])
    assert server.requests == [("POST", "/bucket")]
