"""Small helpers shared by the test tiers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
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
