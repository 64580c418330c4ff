"""Timers: sleep / sleep_until through the in-process timer backend, interruption, late wake-ups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from stepagent.errors import ToolError
from stepagent.history_items import AssistantText, EventItem, ToolResultItem, UserItem
from stepagent.providers.base import Final
from stepagent.tools.sleep import InProcessTimers, Sleep, SleepUntil, resolve_local_time
from tests.engine.harness import Harness, ReplayProvider, call, text

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def timed_harness(provider: ReplayProvider) -> tuple[Harness, InProcessTimers]:
    h = Harness(provider, [Sleep(), SleepUntil(clock=lambda: NOW)])
    timers = InProcessTimers(h.sender, clock=lambda: NOW, manual=True)
    h.config.timers = timers
    return h, timers


async def test_sleep_wakes_the_thread_when_due() -> None:
    provider = (
        ReplayProvider().then(call("sleep", "z1", seconds=90, reason="wait"), Final()).then(*text("awake"))
    )
    h, timers = timed_harness(provider)
    await h.say("t1", "nap", "m1")
    assert len(provider.requests) == 1 and len(timers.scheduled) == 1
    assert await timers.deliver_due(NOW + timedelta(seconds=89)) == 0
    assert await timers.deliver_due(NOW + timedelta(seconds=90)) == 1
    await h.run()
    history = await h.history("t1")
    assert (
        isinstance(history[-2], ToolResultItem) and history[-2].result.first_text() == "Slept for 90 seconds"
    )
    assert history[-1] == AssistantText("awake")


async def test_redispatched_timer_is_scheduled_once() -> None:
    _, timers = timed_harness(ReplayProvider())
    from stepagent.messages import InputMessage, ToolResult

    message = InputMessage.tool_result("t1", ToolResult.text("z1", "Slept for 1 seconds"))
    await timers.schedule(message, "z1", 1)
    await timers.schedule(message, "z1", 1)
    assert len(timers.scheduled) == 1


async def test_user_text_interrupts_a_sleep_and_the_late_wake_up_is_still_shown() -> None:
    provider = (
        ReplayProvider()
        .then(call("sleep", "z1", seconds=600), Final())
        .then(*text("answering you now"))
        .then(*text("the timer went off"))
    )
    h, timers = timed_harness(provider)
    await h.say("t1", "remind me in 10 minutes", "m1")
    await h.say("t1", "what's 2+2?", "m2")
    history = await h.history("t1")
    assert isinstance(history[-3], ToolResultItem)
    assert history[-3].result.first_text() == "Tool call interrupted by user"
    assert isinstance(history[-2], UserItem) and history[-1] == AssistantText("answering you now")

    await timers.deliver_due(NOW + timedelta(minutes=10))
    await h.run()
    history = await h.history("t1")
    late = history[-2]
    assert isinstance(late, EventItem) and late.tool_call_id == "z1"
    assert late.result.first_text() == "Slept for 600 seconds"
    assert history[-1] == AssistantText("the timer went off")


async def test_zero_second_sleep_wakes_immediately() -> None:
    provider = ReplayProvider().then(call("sleep", "z1", seconds=0), Final()).then(*text("done"))
    h, timers = timed_harness(provider)
    await h.say("t1", "go", "m1")
    assert not timers.scheduled
    assert (await h.history("t1"))[-1] == AssistantText("done")


async def test_sleep_until_past_and_future() -> None:
    provider = (
        ReplayProvider()
        .then(call("sleep_until", "p1", date="2026-03-01", time="11:00"), Final())
        .then(*text("late already"))
        .then(call("sleep_until", "f1", date="2026-03-01", time="13:30", timezone="Europe/Paris"), Final())
    )
    h, timers = timed_harness(provider)
    await h.say("t1", "go", "m1")
    history = await h.history("t1")
    assert (
        history[-2].result.first_text() == "Target time 2026-03-01 11:00 is in the past. Waking immediately."
    )  # type: ignore[union-attr]
    await h.say("t1", "again", "m2")
    (timer,) = timers.scheduled
    assert timer.due == datetime(2026, 3, 1, 12, 30, tzinfo=UTC)  # 13:30 in Paris (UTC+1)
    assert timer.message.content.first_text() == "Woke up at target time: 2026-03-01 13:30 (Europe/Paris)"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("day", "clock", "zone", "problem"),
    [
        ("2026-3-1", "10:00", "UTC", "YYYY-MM-DD"),
        ("2026-03-01", "10", "UTC", "HH:MM"),
        ("2026-03-01", "10:00", "Mars/Olympus", "unknown timezone"),
        ("2026-02-30", "10:00", "UTC", "invalid date"),
        ("2026-10-25", "02:30", "Europe/Paris", "ambiguous"),
        ("2026-03-29", "02:30", "Europe/Paris", "does not exist"),
    ],
)
def test_sleep_until_rejects_bad_times(day: str, clock: str, zone: str, problem: str) -> None:
    with pytest.raises(ToolError, match=problem):
        resolve_local_time(day, clock, zone)


async def test_bad_sleep_arguments_reach_the_model_as_an_error() -> None:
    provider = (
        ReplayProvider()
        .then(call("sleep_until", "b1", date="tomorrow", time="10:00"), Final())
        .then(*text("oops"))
    )
    h, _ = timed_harness(provider)
    await h.say("t1", "go", "m1")
    history = await h.history("t1")
    assert history[-2].result.first_text() == "Error: date must look like YYYY-MM-DD, got 'tomorrow'"  # type: ignore[union-attr]
