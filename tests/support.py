"""Small helpers shared by the test tiers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from kubernetes_asyncio.client.exceptions import ApiException

from kanri.runtime import ApiError, Client, Kind

T = TypeVar("T")


class NotYet(TimeoutError):
    """``eventually`` gave up; the message shows what the check last returned."""


def _done(value: object) -> bool:
    # An empty list/dict/str means "nothing yet" just as None does: a check listing Events that are not there yet
    # must keep polling, not hand the caller an empty list (CI once failed on exactly that race).
    if value is None or value is False:
        return False
    return not (isinstance(value, (list, tuple, dict, set, str, bytes)) and len(value) == 0)


async def eventually(check: Callable[[], Awaitable[T | None]], *, timeout: float = 60.0, interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something other than None, False or an empty collection; after ``timeout``
    raise :class:`NotYet` (a TimeoutError) naming the last value."""
    last: T | None = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                last = await check()
                if _done(last):
                    return last  # type: ignore[return-value]
                await asyncio.sleep(interval)
    except TimeoutError:
        raise NotYet(f"still not done after {timeout} s; the check last returned {last!r:.2000}") from None


async def is_gone(read: Callable[[], Awaitable[object]]) -> bool:
    """True when ``read`` answers 404."""
    try:
        await read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


async def exists(client: Client, kind: Kind, name: str, namespace: str) -> bool:
    """Whether the object exists (kanri's Client: a 404 is :class:`ApiError` ``not_found``)."""
    try:
        await client.get(kind, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


def status_message(exc: ApiException) -> str:
    """The ``message`` of the Status object the API server sent with an error."""
    body: dict[str, Any] = json.loads(exc.body or b"{}")
    return str(body.get("message", ""))


@asynccontextmanager
async def running_task(coro: Coroutine[Any, Any, T]) -> AsyncIterator[asyncio.Task[T]]:
    """``coro`` as a task for the block; cancelled (a clean stop) and awaited when the block ends. Its exception, if
    any, is retrieved so asyncio does not warn: a test that expected one has looked at it already."""
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()
