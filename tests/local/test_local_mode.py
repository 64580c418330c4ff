"""Local mode (``LocalAgentSystem``): router, drivers, lifecycle, interruption, replay, shutdown.

Ports the reference runtime's local-mode tests (routing, drivers that idle and respawn, interruption,
deferral, replay, shutdown, automatic compaction) onto our engine, plus lifecycle ordering, retries, the
example and timers. Timing is
controlled with gates (asyncio events the model's stream waits on), never with sleeps: a test opens a gate
when it wants the stream to continue, and a stream whose gate is never opened shows that cancellation
does not wait for the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stepagent.agent_config import AgentConfig
from stepagent.backoff import Backoff
from stepagent.core.completion import RetryPolicy
from stepagent.core.step import StepConfig, StepInput
from stepagent.events import (
    AgentEvent,
    CompactionApplied,
    CompletionFinished,
    EventCollector,
    Info,
    StepFailed,
    TextChunk,
    TurnCommitted,
    UserInput,
)
from stepagent.history_items import (
    AssistantText,
    EventItem,
    HistoryItem,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.ids import child_thread_id
from stepagent.messages import (
    InputMessage,
    SubscriptionEvent,
    TextContent,
    ThreadReport,
    ToolCall,
    ToolResult,
    UserChoiceRequired,
)
from stepagent.modes.local import (
    Idle,
    LifecycleEvent,
    Live,
    LocalAgentSystem,
    LocalSystemClosed,
    ReplaySnapshot,
)
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import (
    Final,
    ModelInfo,
    ModelRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
)
from stepagent.providers.scripted import ScriptedProvider
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.base import Commit, ThreadKind
from stepagent.tools.base import Tool, ToolContext, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import tool
from tests.engine.harness import RecordingTool, call, no_sleep, text
from tests.polling import eventually

TIMEOUT = 5.0  # only ever reached when a test fails
ROOT = Path(__file__).resolve().parents[2]


# ---- test doubles -----------------------------------------------------------------------------------------------


@dataclass
class Gate:
    """A point in a stream where the model waits until the test opens it."""

    opened: asyncio.Event = field(default_factory=asyncio.Event)
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    def open(self) -> None:
        self.opened.set()

    async def wait_reached(self) -> None:
        await asyncio.wait_for(self.reached.wait(), TIMEOUT)


Item = StreamEvent | Gate | Exception


@dataclass
class GatedProvider:
    """Answers each request with the next stream queued for the requesting thread (``"*"``: any thread).
    A ``Gate`` in a stream blocks it until opened; an ``Exception`` is raised there."""

    streams: dict[str, list[list[Item]]] = field(default_factory=dict)
    requests: list[ModelRequest] = field(default_factory=list)
    model: ModelInfo = field(default_factory=lambda: ModelInfo("gated", context_window=100_000))
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def info(self) -> ModelInfo:
        return self.model

    def then(self, *events: Item, thread: str = "*") -> GatedProvider:
        self.streams.setdefault(thread, []).append(list(events))
        return self

    def requests_of(self, thread: str) -> list[ModelRequest]:
        return [r for r in self.requests if r.thread_stack and r.thread_stack[-1] == thread]

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        thread = request.thread_stack[-1] if request.thread_stack else ""
        queue = self.streams.get(thread) or self.streams.get("*")
        if not queue:
            raise AssertionError(f"unexpected model request #{len(self.requests)} for thread {thread!r}")
        for event in queue.pop(0):
            if isinstance(event, Gate):
                event.reached.set()
                await event.opened.wait()
            elif isinstance(event, Exception):
                raise event
            else:
                yield event


@dataclass
class RecordingScripted:
    """A ``ScriptedProvider`` that keeps every request."""

    inner: ScriptedProvider
    requests: list[ModelRequest] = field(default_factory=list)

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        async for event in self.inner.stream(request):
            yield event


class StubCloseThread(Tool):
    """A ``close_thread`` that does nothing (built-ins off)."""

    name = "close_thread"
    description = "Close."

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        return None


# ---- helpers -----------------------------------------------------------------------------------------------------


def make(
    provider: Any, tools: Sequence[Tool] = (), *, collector: EventCollector | None = None, **options: Any
) -> LocalAgentSystem:
    options.setdefault("step_retry", Backoff(attempts=2, base=0.001))
    return LocalAgentSystem.create(
        provider, tools=tools, observer=collector, retry=RetryPolicy(sleep=no_sleep), **options
    )


@contextlib.asynccontextmanager
async def running(system: LocalAgentSystem) -> AsyncIterator[LocalAgentSystem]:
    """``async with system`` whose shutdown cannot hang a failing test."""
    await system.start()
    try:
        yield system
    finally:
        await asyncio.wait_for(system.shutdown(), TIMEOUT)


async def settle() -> None:
    """Let the router and drivers run what is runnable (no time passes)."""
    for _ in range(50):
        await asyncio.sleep(0)


def finished(collector: EventCollector, thread: str, count: int = 1) -> Callable[[], bool]:
    return lambda: sum(isinstance(e, CompletionFinished) for e in collector.of(thread)) >= count


def lifecycle(system: LocalAgentSystem) -> list[LifecycleEvent]:
    events = []
    while (event := system.try_next_lifecycle_event()) is not None:
        events.append(event)
    return events


def result(thread: str, tool_call_id: str, body: str, **kwargs: Any) -> InputMessage:
    return InputMessage.tool_result(thread, ToolResult.text(tool_call_id, body), **kwargs)


def sub_event(thread: str, tool_call_id: str, body: str) -> InputMessage:
    synthetic = SubscriptionEvent(tool_call_id=tool_call_id, associative=True)
    return result(thread, tool_call_id, body, synthetic=synthetic)


def users(history: Sequence[HistoryItem]) -> list[str | None]:
    return [i.text for i in history if isinstance(i, UserItem)]


def no_orphan_results(history: Sequence[HistoryItem]) -> bool:
    """Every tool result answers a call that comes earlier in the same history."""
    seen: set[str] = set()
    for item in history:
        if isinstance(item, ToolCallItem):
            seen.add(item.call.id)
        elif isinstance(item, ToolResultItem) and item.result.id not in seen:
            return False
    return True


async def subscribed(system: LocalAgentSystem, provider: GatedProvider, collector: EventCollector) -> None:
    """``t1`` subscribes with ``tc-sub`` and answers the subscription's start."""
    provider.then(call("subscribe", "tc-sub", topic="builds"), Final()).then(*text("subscribed ok"))
    await system.send_user_text("t1", "watch builds")
    await eventually(finished(collector, "t1"))
    await system.send(result("t1", "tc-sub", "subscribed", subscription=True), "r-sub")
    await eventually(finished(collector, "t1", 2))
    await system.wait_idle(TIMEOUT)


# ---- router ----------------------------------------------------------------------------------------------------


async def test_stale_event_to_unknown_thread_wakes_nothing() -> None:
    provider = GatedProvider()
    async with running(make(provider)) as system:
        await system.send(result("ghost", "tc-1", "late result"), "r1")
        report = ThreadReport(tool_call_id="spawn-1", child_thread_id="c-1")
        await system.send(result("ghost", "", "a report", synthetic=report), "e1")
        await system.wait_idle(TIMEOUT)
        assert lifecycle(system) == []
        assert await system.conversation.get_thread("ghost") is None
    assert provider.requests == []


async def test_user_text_still_creates_new_threads() -> None:
    provider = GatedProvider().then(*text("welcome"))
    async with running(make(provider)) as system:
        await system.send_user_text("brand-new", "hello")
        await system.wait_idle(TIMEOUT)
        info = await system.conversation.get_thread("brand-new")
        assert info is not None and info.kind == ThreadKind.ROOT
        assert lifecycle(system) == [Live("brand-new"), Idle("brand-new")]


async def test_event_respawns_idle_existing_thread() -> None:
    provider = GatedProvider().then(*text("hi"))
    async with running(make(provider)) as system:
        await system.send_user_text("t1", "hello")
        await system.wait_idle(TIMEOUT)
        assert lifecycle(system) == [Live("t1"), Idle("t1")]
        await system.send(result("t1", "tc-stale", "stale"), "r-stale")
        assert await system.next_lifecycle_event(TIMEOUT) == Live("t1")
        assert await system.next_lifecycle_event(TIMEOUT) == Idle("t1")
    assert len(provider.requests) == 1  # a stale result does not answer anything: no completion


async def test_shutdown_flushes_in_flight_turn() -> None:
    gate = Gate()
    provider = GatedProvider().then(TextDelta("partial answer"), gate, TextDelta(" never sent"), Final())
    collector = EventCollector()
    system = make(provider, collector=collector)
    await system.start()
    await system.send_user_text("t1", "hi")
    await gate.wait_reached()
    await asyncio.wait_for(system.shutdown(), TIMEOUT)
    assert not gate.opened.is_set()  # cancellation did not wait for the provider
    assert system.live_threads == [] and system.is_idle()
    history = await system.thread("t1").history()
    assert [type(i) for i in history] == [UserItem, AssistantText]
    assert history[1] == AssistantText("partial answer")
    assert lifecycle(system) == [Live("t1"), Idle("t1")]
    assert any(isinstance(e, CompletionFinished) for e in collector.of("t1"))
    with pytest.raises(LocalSystemClosed):
        await system.send_user_text("t1", "too late")


# ---- drivers -----------------------------------------------------------------------------------------------------


async def test_driver_idles_after_text_response() -> None:
    provider = GatedProvider().then(*text("hello ", "there"))
    collector = EventCollector()
    async with running(make(provider, collector=collector)) as system:
        await system.send_user_text("t1", "hi")
        assert await system.next_lifecycle_event(TIMEOUT) == Live("t1")
        assert await system.next_lifecycle_event(TIMEOUT) == Idle("t1")
        await system.wait_idle(TIMEOUT)
        assert system.is_idle() and system.live_threads == []
        assert (await system.thread("t1").history())[-1] == AssistantText("hello there")
    assert UserInput("hi") in collector.of("t1")


async def test_driver_stays_alive_waiting_for_tool_result() -> None:
    tool = RecordingTool(tool_name="async_tool")
    provider = GatedProvider().then(call("async_tool", "tc-1"), Final()).then(*text("got it"))
    collector = EventCollector()
    async with running(make(provider, [tool], collector=collector)) as system:
        await system.send_user_text("t1", "run it")
        await eventually(finished(collector, "t1"))
        await settle()
        assert tool.dispatches == [("tc-1", {})]
        assert system.live_threads == ["t1"] and not system.is_idle()
        assert lifecycle(system) == [Live("t1")]  # no Idle while the result is awaited
        snapshot = await system.thread("t1").replay()
        assert not snapshot.in_progress
        last = snapshot.history[-1]
        assert isinstance(last, ToolCallItem) and last.call.id == "tc-1"

        await system.send(result("t1", "tc-1", "tool done"), "r1")
        await system.wait_idle(TIMEOUT)
        assert "tool done" in str(provider.requests[1].history)
        assert lifecycle(system) == [Idle("t1")]  # the same driver ran both steps


async def test_user_text_interrupts_active_completion() -> None:
    gate = Gate()
    provider = (
        GatedProvider()
        .then(TextDelta("Let me think"), gate, TextDelta(" more"), Final())
        .then(*text("switching to your new question"))
    )
    collector = EventCollector()
    async with running(make(provider, collector=collector)) as system:
        await system.send_user_text("t1", "first question")
        await gate.wait_reached()
        await system.send_user_text("t1", "second question")
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
    assert not gate.opened.is_set()
    second = provider.requests[1].history
    assert users(second) == ["first question", "<interrupt> second question"]
    assert AssistantText("Let me think") in second  # the partial turn was committed before the new step
    assert history == [*second, AssistantText("switching to your new question")]
    events = collector.of("t1")
    assert [e.text for e in events if isinstance(e, UserInput)] == ["first question", "second question"]
    assert sum(isinstance(e, CompletionFinished) for e in events) == 2
    assert lifecycle(system) == [Live("t1"), Idle("t1")]


async def test_an_interrupting_text_never_overtakes_an_input_that_arrived_before_it() -> None:
    gate = Gate()
    provider = GatedProvider()
    collector = EventCollector()
    async with running(make(provider, [RecordingTool(tool_name="subscribe")], collector=collector)) as system:
        await subscribed(system, provider, collector)
        provider.then(TextDelta("checking"), gate, Final())
        provider.then(*text("answering all of it"))
        await system.send_user_text("t1", "status?")
        await gate.wait_reached()
        await system.send(sub_event("t1", "tc-sub", "early event"), "ev-1")
        await system.send_user_text("t1", "a")
        await system.send(sub_event("t1", "tc-sub", "late event"), "ev-2")
        await system.send_user_text("t1", "b")
        await system.wait_idle(TIMEOUT)
    interrupt = provider.requests[-1].history

    # One step after the interruption, its inputs in arrival order (as step mode keeps a thread's queue
    # order); only the first user text is marked.
    def label(item: HistoryItem) -> str | None:
        if isinstance(item, UserItem):
            return item.text
        return next((e for e in ("early event", "late event") if e in str(item)), repr(item))

    assert [label(item) for item in interrupt[-4:]] == ["early event", "<interrupt> a", "late event", "b"]
    assert users(interrupt)[-2:] == ["<interrupt> a", "b"]


async def test_non_user_input_during_completion_does_not_interrupt() -> None:
    gate = Gate()
    provider = GatedProvider().then(TextDelta("working"), gate, TextDelta(" done"), Final())
    async with running(make(provider)) as system:
        await system.send_user_text("t1", "go")
        await gate.wait_reached()
        await system.send(result("t1", "tc-other", "stale result"), "r-other")
        await settle()
        gate.open()
        await system.wait_idle(TIMEOUT)
        assert (await system.thread("t1").history())[-1] == AssistantText("working done")
    assert len(provider.requests) == 1


async def test_subscription_event_queued_during_completion_processed_after() -> None:
    gate = Gate()
    provider = GatedProvider()
    collector = EventCollector()
    async with running(make(provider, [RecordingTool(tool_name="subscribe")], collector=collector)) as system:
        await subscribed(system, provider, collector)
        provider.then(TextDelta("all"), gate, TextDelta(" good"), Final()).then(*text("noted"))
        await system.send_user_text("t1", "how is it going?")
        await gate.wait_reached()
        await system.send(sub_event("t1", "tc-sub", "event payload xyz"), "ev-1")
        await settle()
        gate.open()
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
    assert AssistantText("all good") in history
    assert "event payload xyz" not in str(provider.requests[-2].history)
    assert "event payload xyz" in str(provider.requests[-1].history)


async def test_event_during_async_tool_wait_is_deferred_until_its_result() -> None:
    provider = GatedProvider()
    collector = EventCollector()
    tools = [RecordingTool(tool_name="subscribe"), RecordingTool(tool_name="async_tool")]
    async with running(make(provider, tools, collector=collector)) as system:
        await subscribed(system, provider, collector)
        provider.then(call("async_tool", "tc-async"), Final()).then(*text("both seen"))
        await system.send_user_text("t1", "run the tool")
        await eventually(finished(collector, "t1", 3))
        count = len(provider.requests)
        await system.send(sub_event("t1", "tc-sub", "sub event data"), "ev-1")
        await settle()
        assert len(provider.requests) == count  # held back durably, no completion
        await system.send(result("t1", "tc-async", "tool done"), "r-async")
        await system.wait_idle(TIMEOUT)
    last = str(provider.requests[-1].history)
    assert len(provider.requests) == count + 1
    assert "tool done" in last and "sub event data" in last and "interrupted" not in last


async def test_driver_idles_after_close_thread_tool_call() -> None:
    provider = GatedProvider().then(call("close_thread", "tc-close", thread_id="t1"), Final())
    async with running(
        make(provider, [StubCloseThread()], agent=AgentConfig(builtin_tools="none"))
    ) as system:
        await system.send_user_text("t1", "bye")
        assert await system.next_lifecycle_event(TIMEOUT) == Live("t1")
        assert await system.next_lifecycle_event(TIMEOUT) == Idle("t1")
        await system.wait_idle(TIMEOUT)


async def test_shutdown_persists_in_flight_tool_result() -> None:
    tool = RecordingTool(tool_name="async_tool")
    gate = Gate()
    provider = GatedProvider().then(call("async_tool", "tc-1"), Final())
    provider.then(TextDelta("processing"), gate, Final())
    collector = EventCollector()
    system = make(provider, [tool], collector=collector)
    await system.start()
    await system.send_user_text("t1", "run it")
    await eventually(finished(collector, "t1"))
    await system.send(result("t1", "tc-1", "tool execution result"), "r1")
    await gate.wait_reached()
    await asyncio.wait_for(system.shutdown(), TIMEOUT)
    assert system.live_threads == []
    history = await system.thread("t1").history()
    results = [i.result.first_text() for i in history if isinstance(i, ToolResultItem)]
    assert results == ["tool execution result"]
    assert history[-1] == AssistantText("processing")


async def test_routes_to_separate_threads() -> None:
    provider = GatedProvider().then(*text("one"), thread="t1").then(*text("two"), thread="t2")
    async with running(make(provider)) as system:
        await system.send_user_text("t1", "first")
        await system.send_user_text("t2", "second")
        await system.wait_idle(TIMEOUT)
        assert (await system.thread("t1").history())[-1] == AssistantText("one")
        assert (await system.thread("t2").history())[-1] == AssistantText("two")
        events = lifecycle(system)
    assert sorted(map(str, events)) == sorted(map(str, [Live("t1"), Idle("t1"), Live("t2"), Idle("t2")]))
    for thread in ("t1", "t2"):
        assert [e for e in events if e.thread_id == thread] == [Live(thread), Idle(thread)]


async def test_respawns_driver_after_idle_with_state_from_the_stores() -> None:
    provider = GatedProvider().then(*text("hi")).then(*text("hi again"))
    async with running(make(provider)) as system:
        await system.send_user_text("t1", "hello")
        await system.wait_idle(TIMEOUT)
        await system.send_user_text("t1", "again")
        await system.wait_idle(TIMEOUT)
        assert lifecycle(system) == [Live("t1"), Idle("t1"), Live("t1"), Idle("t1")]
    assert users(provider.requests[1].history) == ["hello", "again"]


async def test_subscribed_thread_idles_and_event_respawns_it() -> None:
    provider = GatedProvider()
    collector = EventCollector()
    async with running(make(provider, [RecordingTool(tool_name="subscribe")], collector=collector)) as system:
        await subscribed(system, provider, collector)
        assert await system.state.active_subscriptions("t1") == {"tc-sub"}
        assert lifecycle(system) == [Live("t1"), Idle("t1")]  # the subscription does not keep it resident
        provider.then(*text("saw it"))
        await system.send(sub_event("t1", "tc-sub", "late event"), "ev-late")
        await system.wait_idle(TIMEOUT)
        assert lifecycle(system) == [Live("t1"), Idle("t1")]
    assert "late event" in str(provider.requests[-1].history)


async def test_child_outlives_its_roots_activity() -> None:
    child = child_thread_id("root", "spawn-1")
    gate = Gate()
    provider = (
        GatedProvider()
        .then(
            call("spawn_thread", "spawn-1", instructions="research", child_of=["root"]),
            Final(),
            thread="root",
        )
        .then(*text("the child is on it"), thread="root")
        .then(TextDelta("researching"), gate, TextDelta(" done"), Final(), thread=child)
    )
    async with running(make(provider)) as system:
        await system.send_user_text("root", "please research")
        await gate.wait_reached()
        await eventually(lambda: "root" not in system.live_threads)
        assert system.live_threads == [child]
        assert lifecycle(system) == [Live("root"), Live(child), Idle("root")]
        gate.open()
        await system.wait_idle(TIMEOUT)
        assert lifecycle(system) == [Idle(child)]
        assert (await system.thread(child).history())[-1] == AssistantText("researching done")


async def test_step_failure_is_retried_then_dead_lettered() -> None:
    provider = GatedProvider().then(RuntimeError("boom")).then(*text("recovered"))
    collector = EventCollector()
    async with running(
        make(provider, collector=collector, step_retry=Backoff(attempts=2, base=0.001))
    ) as system:
        await system.send_user_text("t1", "hi")
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
        assert users(history) == ["hi"] and history[1:] == [AssistantText("recovered")]
        failures = [e for e in collector.of("t1") if isinstance(e, StepFailed)]
        assert [f.retrying for f in failures] == [True]
        assert system.dead_letters == []

        provider.then(RuntimeError("boom")).then(RuntimeError("boom again"))
        await system.send_user_text("t1", "and now?")
        await system.wait_idle(TIMEOUT)
        failures = [e for e in collector.of("t1") if isinstance(e, StepFailed)]
        assert [f.retrying for f in failures] == [True, True, False]
        assert len(system.dead_letters) == 1
        assert system.dead_letters[0].inputs[0].message.content.text == "and now?"  # type: ignore[union-attr]


@pytest.mark.parametrize("error", [UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), RecursionError("deep")])
async def test_a_failure_the_worker_rejects_is_not_retried_locally_either(error: Exception) -> None:
    provider = GatedProvider().then(error)
    collector = EventCollector()
    async with running(
        make(provider, collector=collector, step_retry=Backoff(attempts=2, base=0.001))
    ) as system:
        await system.send_user_text("t1", "hi")
        await system.wait_idle(TIMEOUT)
        failures = [e for e in collector.of("t1") if isinstance(e, StepFailed)]
        assert [f.retrying for f in failures] == [False]  # errors.classify: "reject", as in the worker
        assert len(system.dead_letters) == 1


async def test_no_input_is_lost_or_duplicated_around_driver_exits() -> None:
    """Inputs sent at every possible moment (mid-stream, between steps, as the driver exits) are each
    folded in exactly once, and every driver's Live is followed by exactly one Idle."""
    provider = RecordingScripted(ScriptedProvider({"rules": [], "default": [{"text": "fine thanks"}]}))
    async with running(make(provider)) as system:
        for index in range(40):
            await system.send_user_text("t1", f"message {index}")
            for _ in range((index * 7) % 61):  # 0 to 60 loop turns: mid-stream, between steps, after exit
                await asyncio.sleep(0)
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
        events = lifecycle(system)
    texts = [(t or "").removeprefix("<interrupt> ") for t in users(history)]
    assert texts == [f"message {index}" for index in range(40)]
    assert [type(e) for e in events] == [Live, Idle] * (len(events) // 2)
    assert len(events) > 2  # the driver exited and was respawned along the way
    assert any((t or "").startswith("<interrupt> ") for t in users(history))


async def test_inputs_left_at_shutdown_become_dead_letters() -> None:
    system = make(GatedProvider())
    await system.send_user_text("t1", "never routed")
    await asyncio.wait_for(system.shutdown(), TIMEOUT)
    (letter,) = system.dead_letters
    assert letter.inputs[0].message.content == TextContent(text="never routed")


async def test_duplicate_sends_are_dropped() -> None:
    provider = GatedProvider().then(*text("once"))
    async with running(make(provider)) as system:
        message = InputMessage.user_text("t1", "hello")
        await system.send(message, "same-id")
        await system.send(message, "same-id")
        await system.wait_idle(TIMEOUT)
    assert len(provider.requests) == 1


async def test_function_tool_runs_in_the_background() -> None:
    @tool
    async def lookup(query: str) -> str:
        """Look something up."""
        return f"answer for {query}"

    provider = GatedProvider().then(call("lookup", "tc-1", query="x"), Final()).then(*text("it is known"))
    async with running(make(provider, [lookup])) as system:
        await system.send_user_text("t1", "look it up")
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
    assert ToolResultItem(result=ToolResult.text("tc-1", "answer for x")) in history
    assert history[-1] == AssistantText("it is known")


# ---- replay and subscriptions ---------------------------------------------------------------------------------


async def test_replay_mid_thinking_and_mid_text() -> None:
    thinking, texting = Gate(), Gate()
    provider = GatedProvider().then(
        ReasoningDelta("deep "),
        ReasoningDelta("thought"),
        thinking,
        TextDelta("The answer"),
        texting,
        TextDelta(" is 42"),
        Final(),
    )
    async with running(make(provider)) as system:
        handle = system.thread("t1")
        await system.send_user_text("t1", "question")
        await thinking.wait_reached()
        snapshot = await handle.replay()
        assert snapshot.in_progress and snapshot.current_thinking == "deep thought"
        assert isinstance(snapshot.history[-1], UserItem)
        thinking.open()
        await texting.wait_reached()
        snapshot = await handle.replay()
        assert snapshot.in_progress and snapshot.current_thinking is None
        assert snapshot.history[-1] == AssistantText("The answer")
        texting.open()
        await system.wait_idle(TIMEOUT)
        snapshot = await handle.replay()
        assert not snapshot.in_progress and snapshot.history[-1] == AssistantText("The answer is 42")


async def test_subscriber_sees_each_event_in_the_snapshot_or_after_it_exactly_once() -> None:
    first, second = Gate(), Gate()
    provider = GatedProvider().then(
        TextDelta("one "), first, TextDelta("two "), second, TextDelta("three"), Final()
    )
    async with running(make(provider)) as system:
        await system.send_user_text("t1", "count")
        await first.wait_reached()
        subscription = system.thread("t1").subscribe()
        snapshot = await anext(subscription)
        assert isinstance(snapshot, ReplaySnapshot) and snapshot.history[-1] == AssistantText("one ")
        first.open()
        second.open()
        events: list[AgentEvent] = []
        while not any(isinstance(e, CompletionFinished) for e in events):
            item = await asyncio.wait_for(anext(subscription), TIMEOUT)
            assert not isinstance(item, ReplaySnapshot)
            events.append(item)
        await subscription.aclose()
    chunks = [e.text for e in events if isinstance(e, TextChunk)]
    assert "one " + "".join(chunks) == "one two three"
    committed = next(e for e in events if isinstance(e, TurnCommitted))
    assert [r.item for r in committed.rows][-1] == AssistantText("one two three")


async def test_subscription_from_the_start_and_its_end_at_shutdown() -> None:
    provider = GatedProvider().then(*text("hello"))
    system = make(provider)
    await system.start()
    subscription = system.thread("t1").subscribe()
    snapshot = await anext(subscription)
    assert snapshot == ReplaySnapshot(
        history=[], current_thinking=None, in_progress=False, pending_choices=[]
    )
    await system.send_user_text("t1", "hi")
    await system.wait_idle(TIMEOUT)
    await asyncio.wait_for(system.shutdown(), TIMEOUT)
    events = [item async for item in subscription]
    assert events[0] == UserInput("hi")
    assert [e.text for e in events if isinstance(e, TextChunk)] == ["hello"]


async def test_pending_choices_are_thread_local_and_replayed() -> None:
    provider = GatedProvider()
    step_sender = InProcessSender()
    local = make(provider)
    stepper = AgentSystem(
        local.conversation,
        local.state,
        StepConfig(provider=provider, toolset=Toolset.of(builtin_tools()), sender=step_sender),
    )

    def choice(thread: str, choice_id: str) -> StepInput:
        content = UserChoiceRequired(id=choice_id, prompt="pick", choices=["a", "b"], response_url="http://x")
        return StepInput(InputMessage(content=content, group_id=thread), f"m-{choice_id}")

    results = await stepper.step([choice("t1", "choice-1"), choice("t2", "choice-2")], EventCollector())
    assert all(r.ok for r in results)
    async with running(local):
        snapshot = await anext(local.thread("t1").subscribe())
        assert isinstance(snapshot, ReplaySnapshot)
        assert [c.id for c in snapshot.pending_choices] == ["choice-1"]


# ---- compaction ----------------------------------------------------------------------------------------------

# ~3,750 tokens as the scripted model counts them: with the system prompt and tools, over half of the
# 8,000-token window — the compaction threshold these tests set (COMPACTING) — yet within it (the request is
# sent).
LONG = "x" * 15_000
COMPACTING = AgentConfig(compaction_threshold=0.5)


def compaction_script(**extra: Any) -> dict[str, Any]:
    return {
        "context_window": 8_000,
        "rules": [
            {
                "when": "INSIDE a compaction thread",
                "reply": [
                    {"text": "summarising"},
                    {
                        "tool_call": {
                            "name": "close_thread",
                            "arguments": {"thread_id": "{thread_id}", "report_to_parent": "SUMMARY"},
                        }
                    },
                ],
            },
            *extra.get("rules", []),
        ],
        "default": [{"text": "ok"}],
    }


def compaction_requests(provider: RecordingScripted) -> list[ModelRequest]:
    return [r for r in provider.requests if "compaction thread" in str(r.history[-1])]


async def test_auto_compaction_triggers_and_applies() -> None:
    provider = RecordingScripted(ScriptedProvider(compaction_script()))
    collector = EventCollector()
    async with running(make(provider, collector=collector, agent=COMPACTING)) as system:
        await system.send_user_text("t1", LONG)
        await system.wait_idle(TIMEOUT)
        assert len(compaction_requests(provider)) == 1
        events = collector.of("t1")
        assert Info("✦ Auto-compaction triggered (context > 50%)") in events
        assert CompactionApplied() in events
        history = await system.thread("t1").history()
        assert history == [Summary(text="SUMMARY", up_to_order=2)]
        await system.send_user_text("t1", "short")
        await system.wait_idle(TIMEOUT)
    assert isinstance(provider.requests[-1].history[0], Summary)
    assert len(compaction_requests(provider)) == 1


def tool_script() -> dict[str, Any]:
    return compaction_script(
        rules=[
            {"when": "run the tool", "on": ["user"], "reply": [{"tool_call": {"name": "async_tool"}}]},
            {"when": "tool result", "on": ["tool_result"], "reply": [{"text": "processed tool result"}]},
        ]
    )


async def test_compaction_during_tool_call_leaves_no_orphan_results() -> None:
    @tool
    async def async_tool() -> str:
        """A tool whose result races the compaction."""
        return "tool result"

    provider = RecordingScripted(ScriptedProvider(tool_script()))
    async with running(make(provider, [async_tool], agent=COMPACTING)) as system:
        await system.send_user_text("t1", f"run the tool {LONG}")
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
    assert len(compaction_requests(provider)) == 1
    assert all(no_orphan_results(r.history) for r in provider.requests)
    assert no_orphan_results(history) and history[-1] == AssistantText("processed tool result")


async def test_compaction_does_not_retrigger_after_applied() -> None:
    tool_ = RecordingTool(tool_name="async_tool")
    provider = RecordingScripted(ScriptedProvider(tool_script()))
    collector = EventCollector()
    async with running(make(provider, [tool_], collector=collector, agent=COMPACTING)) as system:
        await system.send_user_text("t1", f"run the tool {LONG}")
        await eventually(lambda: CompactionApplied() in collector.of("t1"))
        assert tool_.dispatches and len(compaction_requests(provider)) == 1
        await system.send(result("t1", tool_.dispatches[0][0], "tool result"), "r1")
        await system.wait_idle(TIMEOUT)
        count = len(provider.requests)
        assert "compaction thread" not in str(provider.requests[-1].history[-1])
        await settle()
        assert len(provider.requests) == count and system.is_idle()
    assert len(compaction_requests(provider)) == 1
    assert provider.requests[-1].history[0] == Summary(text="SUMMARY", up_to_order=1)


# ---- timers ---------------------------------------------------------------------------------------------------


async def test_sleep_keeps_the_driver_resident_until_user_text_interrupts_it() -> None:
    provider = GatedProvider().then(call("sleep", "z1", seconds=600), Final()).then(*text("4"))
    collector = EventCollector()
    async with running(make(provider, collector=collector)) as system:
        await system.send_user_text("t1", "remind me in 10 minutes")
        await eventually(finished(collector, "t1"))
        await settle()
        assert system.live_threads == ["t1"] and not system.is_idle()
        await system.send_user_text("t1", "what's 2+2?")
        await system.wait_idle(TIMEOUT)  # the timer is not due: it does not keep the system busy
        history = await system.thread("t1").history()
    interrupted = history[-3]
    assert isinstance(interrupted, ToolResultItem)
    assert interrupted.result.first_text() == "Tool call interrupted by user"
    assert users(history)[-1] == "what's 2+2?"  # nothing was streaming: no <interrupt> marker
    assert history[-1] == AssistantText("4")
    assert lifecycle(system) == [Live("t1"), Idle("t1")]


async def test_sleep_until_event_or_input_leaves_no_driver_and_the_next_input_starts_one() -> None:
    """Nothing runs while a thread sleeps until an event: its driver exits (Idle, ``wait_idle`` returns),
    and the event that wakes it gets a fresh driver."""
    provider = (
        GatedProvider()
        .then(call("sleep_until_event_or_input", "s1"), Final())
        .then(*text("an event, at last"))
    )
    collector = EventCollector()
    async with running(make(provider, [RecordingTool(tool_name="subscribe")], collector=collector)) as system:
        await subscribed_to(system, collector)
        await system.send_user_text("t1", "wait for news")
        await system.wait_idle(TIMEOUT)
        assert system.live_threads == [] and lifecycle(system)[-2:] == [Live("t1"), Idle("t1")]
        await system.send(sub_event("t1", "tc-sub", "news!"), "e1")
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
    assert lifecycle(system) == [Live("t1"), Idle("t1")]
    assert history[-1] == AssistantText("an event, at last")


async def subscribed_to(system: LocalAgentSystem, collector: EventCollector) -> None:
    """``t1`` has an active subscription ``tc-sub`` (committed directly, as a started one would be)."""
    await system.state.add_subscription("t1", "tc-sub")
    await system.conversation.commit(
        "t1",
        Commit(
            expected_version=0,
            rows=[
                (ToolCallItem(ToolCall(id="tc-sub", name="subscribe")), "seed-call"),
                (ToolResultItem(ToolResult.text("tc-sub", "subscribed")), "seed-result"),
            ],
            answered_tool_calls=["tc-sub"],
        ),
    )


async def test_short_sleep_wakes_the_thread() -> None:
    provider = GatedProvider().then(call("sleep", "z1", seconds=0.01), Final()).then(*text("awake"))
    async with running(make(provider)) as system:
        await system.send_user_text("t1", "nap briefly")
        await system.wait_idle(TIMEOUT)
        history = await system.thread("t1").history()
    assert isinstance(history[-2], ToolResultItem)
    assert history[-2].result.first_text() == "Slept for 0.01 seconds"
    assert history[-1] == AssistantText("awake")


# ---- multi-thread conversation and the example -------------------------------------------------------------------


async def test_spawn_report_close_with_the_scripted_model() -> None:
    script = ROOT / "examples" / "local_threads_script.json"
    collector = EventCollector()
    async with running(make(ScriptedProvider(script), collector=collector)) as system:
        await system.send_user_text("root", "name my project")
        await system.wait_idle(TIMEOUT)
        events = lifecycle(system)
        root_history = await system.thread("root").history()
        children = {e.thread_id for e in events} - {"root"}
        assert len(children) == 1
        (child,) = children
        info = await system.conversation.get_thread(child)
        assert info is not None and info.closed and info.parent_id == "root"
        await system.send(result(child, "tc-late", "late"), "r-late")  # to a closed thread: dropped
        await system.wait_idle(TIMEOUT)
        assert lifecycle(system) == []
    reports = [i.result.first_text() for i in root_history if isinstance(i, EventItem)]
    assert reports == [
        "Report from child thread: Halfway there: Aurora, Beacon and Cobalt are on the list.",
        f"Child thread with ID {child} has shut down. Report from child thread: Final pick: Aurora.",
    ]
    assert root_history[-1] == AssistantText(
        "Root: the child thread is done. Its final pick for your project is Aurora."
    )
    for thread in ("root", child):  # every driver's Live comes before its Idle, strictly paired
        mine = [type(e) for e in events if e.thread_id == thread]
        assert mine == [Live, Idle] * (len(mine) // 2) and mine
    # Rows committed before spawn_thread ran (user text, text, the call) are reported too.
    committed = [r.item for e in collector.of("root") if isinstance(e, TurnCommitted) for r in e.rows]
    assert committed == root_history


async def test_example_runs() -> None:
    spec = importlib.util.spec_from_file_location(
        "local_threads_example", ROOT / "examples" / "local_threads.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    assert await module.main(out) == 0
    printed = out.getvalue()
    assert "[   root] user: Please find a name for my new project." in printed
    assert "→ spawn_thread(" in printed and "→ report_to_parent(" in printed and "→ close_thread(" in printed
    assert "[   root] assistant: Root: the child thread is done. Its final pick" in printed
    assert printed.endswith("done: 2 threads, all idle\n")
