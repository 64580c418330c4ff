"""Timers: the ``sleep`` and ``sleep_until`` tools and the in-process timer backend.

Both tools are asynchronous and passive: the step ends, nothing runs while the thread sleeps, and the
wake-up arrives later as the call's result (dedup id = the tool call id, so a re-dispatched timer wakes
the thread once). Being passive, a pending sleep does not hold back events, and user text interrupts it
at once; a wake-up that arrives after such an interruption is still shown to the model, as an event
attributed to the sleep call (see ``core/prepare.py``).

Where the wake-up comes from is the :class:`~stepagent.tools.base.TimerBackend`'s business:
:class:`InProcessTimers` here (asyncio tasks, or a manual clock for tests); the AWS binding uses the SQS
delay queue up to 15 minutes and a one-time EventBridge Scheduler schedule beyond.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from stepagent.errors import ConfigurationError, ToolError
from stepagent.messages import InputMessage, ToolResult
from stepagent.senders.base import InputSender
from stepagent.tools.base import Tool, ToolContext

TIMER_TOOL_NAMES = frozenset({"sleep", "sleep_until"})
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def _number(value: float) -> str:
    """Seconds as the model wrote them: ``5`` for whole numbers, ``1.5`` otherwise."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


async def _wake(context: ToolContext, text: str, delay_seconds: float) -> None:
    result = ToolResult.text(context.tool_call_id, text, call_id=context.call_id)
    message = InputMessage.tool_result(context.thread_id, result)
    if delay_seconds <= 0:
        await context.sender.send(message, context.tool_call_id)
        return
    if context.timers is None:
        raise ConfigurationError("no timer backend is configured, so sleep tools cannot wake the thread")
    await context.timers.schedule(message, context.tool_call_id, delay_seconds)


class Sleep(Tool):
    """Built-in ``sleep``: the wake-up comes back as the call's result after ``seconds``."""

    name = "sleep"
    builtin = True
    wait = "sleep"
    description = "Sleep for some seconds, then continue; nothing runs meanwhile."
    parameters = {
        "type": "object",
        "properties": {
            "seconds": {"type": "number", "description": "Seconds to sleep."},
            "reason": {"type": "string", "description": "Why (shown to the user)."},
        },
        "required": ["seconds"],
    }
    passive = True

    def display(self, arguments: dict[str, Any]) -> str | None:
        seconds = arguments.get("seconds")
        if not isinstance(seconds, int | float):
            return None
        reason = arguments.get("reason")
        return f"Sleeping {_number(seconds)}s" + (f": {reason}" if isinstance(reason, str) and reason else "")

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        seconds = arguments.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds != seconds:
            raise ToolError("seconds must be a number")
        await _wake(context, f"Slept for {_number(seconds)} seconds", float(seconds))


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIME = re.compile(r"^\d{2}:\d{2}(:\d{2})?$")


def resolve_local_time(day: str, clock_time: str, timezone: str) -> datetime:
    """The aware datetime for a wall-clock time in ``timezone``. Times skipped or repeated by a daylight
    saving change are errors: guessing would wake the agent an hour early or late."""
    if not _DATE.match(day):
        raise ToolError(f"date must look like YYYY-MM-DD, got {day!r}")
    if not _TIME.match(clock_time):
        raise ToolError(f"time must look like HH:MM or HH:MM:SS, got {clock_time!r}")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown timezone {timezone!r}; use an IANA name such as Europe/Paris") from None
    try:
        naive = datetime.combine(date.fromisoformat(day), time.fromisoformat(clock_time))
    except ValueError as exc:
        raise ToolError(f"invalid date or time: {exc}") from None
    early, late = naive.replace(tzinfo=zone, fold=0), naive.replace(tzinfo=zone, fold=1)
    if early.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != naive:
        raise ToolError(f"{day} {clock_time} does not exist in {timezone} (a daylight saving change)")
    if early.utcoffset() != late.utcoffset():
        raise ToolError(f"{day} {clock_time} is ambiguous in {timezone} (a daylight saving change)")
    return early


class SleepUntil(Tool):
    """Built-in ``sleep_until``: the wake-up comes back at a wall-clock time (at once if it is past)."""

    name = "sleep_until"
    builtin = True
    wait = "sleep"
    description = "Sleep until a wall-clock time, then continue; nothing runs meanwhile."
    parameters = {
        "type": "object",
        "properties": {
            "date": {"type": "string", "description": "YYYY-MM-DD"},
            "time": {"type": "string", "description": "HH:MM or HH:MM:SS"},
            "timezone": {"type": "string", "description": "IANA timezone, default UTC"},
        },
        "required": ["date", "time"],
    }
    passive = True

    def __init__(self, clock: Clock = utc_now) -> None:
        self.clock = clock

    def display(self, arguments: dict[str, Any]) -> str | None:
        return f"Sleeping until {arguments.get('date')} {arguments.get('time')}"

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        day, clock_time = arguments.get("date"), arguments.get("time")
        timezone = arguments.get("timezone") or "UTC"
        if not isinstance(day, str) or not isinstance(clock_time, str) or not isinstance(timezone, str):
            raise ToolError("date and time are required strings")
        target = resolve_local_time(day, clock_time, timezone)
        delay = (target - self.clock()).total_seconds()
        if delay <= 0:
            await _wake(context, f"Target time {day} {clock_time} is in the past. Waking immediately.", 0)
        else:
            await _wake(context, f"Woke up at target time: {day} {clock_time} ({timezone})", delay)


@dataclass(frozen=True, slots=True)
class ScheduledTimer:
    """A timer of :class:`InProcessTimers`: the message to send at ``due``, with its dedup id."""

    due: datetime
    message: InputMessage
    dedup_id: str


@dataclass(slots=True)
class InProcessTimers:
    """A ``TimerBackend`` for one process. With ``manual=True`` nothing fires by itself: tests call
    :meth:`deliver_due` with the time they want. Otherwise each timer is an asyncio task."""

    sender: InputSender
    clock: Clock = utc_now
    manual: bool = False
    scheduled: list[ScheduledTimer] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def schedule(self, message: InputMessage, dedup_id: str, delay_seconds: float) -> None:
        if any(t.dedup_id == dedup_id and t.message.group_id == message.group_id for t in self.scheduled):
            return  # a re-dispatched timer: the first one will wake the thread
        timer = ScheduledTimer(self.clock() + timedelta(seconds=delay_seconds), message, dedup_id)
        self.scheduled.append(timer)
        if not self.manual:
            task = asyncio.create_task(self._fire_later(timer, delay_seconds))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fire_later(self, timer: ScheduledTimer, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._deliver(timer)

    async def _deliver(self, timer: ScheduledTimer) -> None:
        if timer in self.scheduled:
            self.scheduled.remove(timer)
            await self.sender.send(timer.message, timer.dedup_id)

    async def deliver_due(self, now: datetime | None = None) -> int:
        """Deliver every timer due at ``now`` (default: the clock). Returns how many fired."""
        now = now or self.clock()
        due = [t for t in self.scheduled if t.due <= now]
        for timer in due:
            await self._deliver(timer)
        return len(due)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
