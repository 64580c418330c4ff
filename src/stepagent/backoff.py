"""The one backoff rule of every retry loop: exponential delays with jitter, a server's ``Retry-After``
honoured, and a deadline a retry must fit in.

Guarantees: :meth:`Backoff.delay` for attempt ``n`` (1-based: the wait after the ``n``-th failure) is
``min(base * factor ** (n - 1), cap)`` scaled by a random factor in ``[1 - jitter, 1]`` (so concurrent
retries spread apart and never wait longer than the nominal delay), or a non-negative ``retry_after``
capped at ``cap`` when the server gave one. :meth:`Backoff.allows` says whether attempt ``n + 1`` may
happen: at most ``attempts`` in all, and only if the wait leaves more than ``margin`` seconds of the
caller's ``remaining`` time (a Lambda's). :func:`retry` is the loop itself, for callers that only wait
between attempts.

Why not tenacity, stamina or backoff: they own the loop (decorators and their own exception routing),
while the loops here differ in what happens between attempts (the model completion keeps its streaming
state and can be interrupted mid-wait; the RAP client hands back the last 5xx response instead of raising;
the RAP server stops at a 4xx). What they share is this arithmetic, a few lines with no dependency to
ship in the Lambda layer.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """When to retry and how long to wait first (see the module docstring)."""

    attempts: int = 4
    base: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, self.cap)
        nominal = min(self.base * self.factor ** (attempt - 1), self.cap)
        return nominal * random.uniform(1.0 - self.jitter, 1.0)

    def allows(self, attempt: int, delay: float, remaining: float | None = None, margin: float = 0.0) -> bool:
        """Whether another attempt may follow failed attempt ``attempt`` after waiting ``delay`` seconds."""
        if attempt >= self.attempts:
            return False
        return remaining is None or remaining - delay > margin


async def retry(
    operation: Callable[[], Awaitable[T]],
    *,
    when: Callable[[BaseException], bool],
    backoff: Backoff,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run ``operation``; each time it raises an error ``when`` accepts, wait :meth:`Backoff.delay` and run it
    again, ``backoff.attempts`` runs at most. Any other error, and the last accepted one, is raised as is.
    For loops that have nothing to do between attempts but wait (the others compute with :class:`Backoff`
    themselves); ``operation`` must be safe to run again after a failure."""
    attempt = 1
    while True:
        try:
            return await operation()
        except Exception as error:
            if not when(error):
                raise
            delay = backoff.delay(attempt)
            if not backoff.allows(attempt, delay):
                raise
        await sleep(delay)
        attempt += 1
