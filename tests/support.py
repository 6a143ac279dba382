"""Small helpers shared by the test tiers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from kubernetes_asyncio.client.exceptions import ApiException

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T | None]], *, timeout: float = 60.0, interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something other than None/False; fail with the last value after ``timeout``."""
    last: T | None = None
    async with asyncio.timeout(timeout):
        while True:
            last = await check()
            if last is not None and last is not False:
                return last
            await asyncio.sleep(interval)


async def is_gone(read: Callable[[], Awaitable[object]]) -> bool:
    """True when ``read`` answers 404."""
    try:
        await read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


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
