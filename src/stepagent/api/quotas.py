"""What one subject may do through the HTTP API, enforced across every instance of it (the counters live
in the state table: :mod:`stepagent.stores.dynamodb.quotas`).

========================================  ===========  ============================================
setting                                   default      counts
========================================  ===========  ============================================
``STEPAGENT_API_MAX_NEW_THREADS_PER_MINUTE``  20        first messages that create a conversation
``STEPAGENT_API_MAX_MESSAGES_PER_MINUTE``     60        messages and approvals sent (new threads too)
``STEPAGENT_API_MAX_OPEN_STREAMS``            8         event streams open at once
``STEPAGENT_API_MAX_COST_USD_PER_DAY``        none      model dollars of the subject's conversations
                                                        this UTC day (priced models only)
========================================  ===========  ============================================

Over a limit, :class:`QuotaExceeded` carries a message for people and ``retry_after``: the seconds until
the window ends (the minute, the UTC day), or a short pause for streams. Windows are fixed (per minute
of the clock), so up to twice a limit can pass across one window boundary. The daily cost is checked
before a message is sent, from what the worker has added after each step: the turns already running
when the limit is reached still finish, so a subject can overshoot by what they cost.

The limits apply to authenticated callers (``jwt``); without authentication (loopback only) there is one
local user and none apply. A stream holds a lease that it renews every :data:`RENEW_S` seconds while open;
the lease of a stream whose process died runs out after :data:`LEASE_S`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from stepagent.errors import ConfigurationError, TransientError
from stepagent.stores.dynamodb.quotas import Lease, SubjectCounters

log = logging.getLogger(__name__)

#: Seconds a stream's lease lasts without renewal.
LEASE_S = 60.0
#: Seconds between two renewals of an open stream's lease.
RENEW_S = 20.0
#: Seconds a refused stream is told to wait (a slot frees when any of the subject's streams ends).
STREAM_RETRY_S = 5


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """The per-subject limits, read once at start (``None``: no limit)."""

    max_new_threads_per_minute: int | None = 20
    max_messages_per_minute: int | None = 60
    max_open_streams: int | None = 8
    max_cost_usd_per_day: float | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ApiLimits:
        def count(name: str, default: int) -> int:
            raw = (environ.get(name) or "").strip()
            if not raw:
                return default
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigurationError(f"{name}={raw!r} is invalid: expected a whole number of at least 1")
            return int(raw)

        raw_cost = (environ.get("STEPAGENT_API_MAX_COST_USD_PER_DAY") or "").strip().removeprefix("$")
        cost = None
        if raw_cost:
            try:
                cost = float(raw_cost)
            except ValueError:
                cost = math.nan
            if not math.isfinite(cost) or cost <= 0:
                raise ConfigurationError(
                    f"STEPAGENT_API_MAX_COST_USD_PER_DAY={raw_cost!r} is invalid: expected dollars above 0"
                )
        return cls(
            max_new_threads_per_minute=count("STEPAGENT_API_MAX_NEW_THREADS_PER_MINUTE", 20),
            max_messages_per_minute=count("STEPAGENT_API_MAX_MESSAGES_PER_MINUTE", 60),
            max_open_streams=count("STEPAGENT_API_MAX_OPEN_STREAMS", 8),
            max_cost_usd_per_day=cost,
        )


class QuotaExceeded(Exception):
    """A subject is over one of its limits (a 429 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))


class Quotas:
    """The limits applied to subjects over the shared counters; ``clock`` is wall-clock seconds."""

    def __init__(self, counters: SubjectCounters, limits: ApiLimits, clock: Callable[[], float]) -> None:
        self.counters = counters
        self.limits = limits
        self.clock = clock

    async def message(self, subject: str, *, new_thread: bool) -> None:
        """Count one message (and one new conversation when ``new_thread``), or refuse it."""
        limits = self.limits
        now = self.clock()
        if limits.max_cost_usd_per_day is not None:
            spent, day_left = await self.counters.spent_today(subject, now)
            if spent >= limits.max_cost_usd_per_day:
                raise QuotaExceeded(
                    f"this user's conversations have used ${spent:.4f} of model calls today, the daily "
                    f"limit is ${limits.max_cost_usd_per_day:g}; it resets at midnight UTC",
                    day_left,
                )
        if new_thread and limits.max_new_threads_per_minute is not None:
            await self._take(subject, "threads", limits.max_new_threads_per_minute, "new conversations", now)
        if limits.max_messages_per_minute is not None:
            await self._take(subject, "messages", limits.max_messages_per_minute, "messages", now)

    async def _take(self, subject: str, kind: str, limit: int, what: str, now: float) -> None:
        wait = await self.counters.take(subject, kind, limit, 60, now)
        if wait is not None:
            raise QuotaExceeded(f"at most {limit} {what} per minute per user; try again in a moment", wait)

    async def open_stream(self, subject: str) -> Lease | None:
        """A lease for one more event stream (``None`` when streams are not limited), or refuse it."""
        limit = self.limits.max_open_streams
        if limit is None:
            return None
        lease = await self.counters.acquire(subject, limit, self.clock(), LEASE_S)
        if lease is None:
            raise QuotaExceeded(
                f"at most {limit} open event streams per user; close one (or wait for one to end)",
                STREAM_RETRY_S,
            )
        return lease

    async def keep(self, lease: Lease) -> Lease | None:
        """``lease`` renewed if it is due (``RENEW_S`` before it runs out of slack); ``None`` if lost."""
        now = self.clock()
        if lease.expires - now > LEASE_S - RENEW_S:
            return lease
        return await self.counters.renew(lease, now, LEASE_S)

    async def close_stream(self, lease: Lease) -> None:
        """Free the stream's slot (if the store cannot be reached, the lease runs out by itself)."""
        try:
            await self.counters.release(lease)
        except TransientError as error:
            log.warning("could not free an event stream's slot (its lease will run out): %s", error)
