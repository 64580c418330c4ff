"""The one poll-until helper of the suite: for a condition that no event announces (a queue filling, a
server's task ending, a page changing). The limit only stops a hung test; no outcome depends on timing."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    what: str = "the condition",
    *,
    within: float = 5.0,
    interval: float = 0.01,
) -> T:
    """Call ``check`` (plain or async) until it returns something true, and return that; an
    ``AssertionError`` naming ``what`` (and the last value) after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what} (last: {value!r:.2000})")
        await asyncio.sleep(interval)
