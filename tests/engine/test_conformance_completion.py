"""Conformance: the completion round loop and dispatch, in step mode.

Covers one completion's rounds (text, cancellation, unknown, sync and asynchronous tools, images,
thinking, retries after a broken stream), failed dispatches, step mode over a batch, the round cap,
reasoning and the dispatch outbox. The ``epNN``, ``sbN`` and ``st1`` prefixes of test names are the case
numbers of the reference runtime's suite these tests were ported from. Where we deliberately differ from
the reference (deterministic ids, ``Error: Tool call failed: <message>``, no retry after the round's tool
call, a 25-round cap, the outbox) the tests pin *our* behaviour.
"""

from __future__ import annotations

import asyncio
from typing import Any

from stepagent import texts
from stepagent.core.completion import MAX_ROUNDS_PER_STEP
from stepagent.core.step import StepInput
from stepagent.errors import ProviderError
from stepagent.events import (
    AgentEvent,
    CompletionFinished,
    CompletionStarted,
    Info,
    OAuthRequiredEvent,
    StepFailed,
    TextChunk,
    ThinkingChunk,
    ThinkingEnded,
    ThinkingStarted,
    ToolCallStarted,
    ToolResultReceived,
    TurnCommitted,
    UserInput,
)
from stepagent.history_items import AssistantText, Reasoning, ToolCallItem, ToolResultItem, UserItem
from stepagent.messages import ImageBlock, InputMessage, OAuthRequired, TextBlock, ToolCall, ToolResult
from stepagent.providers.base import (
    Final,
    ModelInfo,
    ReasoningComplete,
    ReasoningDelta,
    TextDelta,
    ToolCallComplete,
    ToolCallDelta,
)
from stepagent.tools.base import Tool, ToolContext
from tests.engine.harness import (
    EchoSyncTool,
    Harness,
    HookedReplayProvider,
    RecordingTool,
    ReplayProvider,
    ThreadRoutedProvider,
    call,
    retryable,
    sent_to,
    text,
)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def stream_events(events: list[AgentEvent]) -> list[AgentEvent]:
    """The events a completion emitted while streaming: after ``CompletionStarted``, before the commit."""
    start = next(i for i, e in enumerate(events) if isinstance(e, CompletionStarted))
    end = next(i for i, e in enumerate(events) if isinstance(e, TurnCommitted | CompletionFinished))
    return events[start + 1 : end]


def texts_of(events: list[AgentEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextChunk)]


def result_text(item: object) -> str | None:
    assert isinstance(item, ToolResultItem), item
    return item.result.first_text()


# ---- run_completion: text, cancellation, tools, images, thinking, stream retries ---------------------------


async def test_ep22_basic_text_completion() -> None:
    h = Harness(ReplayProvider().then(*text("Hello ", "world!")))
    results = await h.say("t1", "hi", "m1")
    assert results[0].outcome is not None and results[0].outcome.completed
    events = h.observer.of("t1")
    assert texts_of(events) == ["Hello ", "world!"]
    assert (await h.history("t1"))[1:] == [AssistantText("Hello world!")]
    # The round finished ("Done"): committed, then CompletionFinished, exactly once.
    assert sum(isinstance(e, CompletionFinished) for e in events) == 1


async def test_ep23_cancellation_mid_stream_keeps_partial_text_and_ends_the_round() -> None:
    cancel = asyncio.Event()
    provider = HookedReplayProvider().then(TextDelta("partial"), cancel.set, TextDelta(" more"), Final())
    h = Harness(provider)
    outcome = await h.system.step_thread(
        "t1", [StepInput(InputMessage.user_text("t1", "go"), "m1")], h.observer, cancel=cancel
    )
    assert outcome.completed
    assert texts_of(h.observer.of("t1")) == ["partial"]
    assert (await h.history("t1"))[1:] == [AssistantText("partial")]
    assert len(provider.requests) == 1  # no loop-back, no retry


async def test_ep23_cancellation_when_the_stream_then_ends_does_not_retry() -> None:
    cancel = asyncio.Event()
    provider = HookedReplayProvider().then(TextDelta("partial"), cancel.set)
    h = Harness(provider)
    await h.system.step_thread(
        "t1", [StepInput(InputMessage.user_text("t1", "go"), "m1")], h.observer, cancel=cancel
    )
    assert len(provider.requests) == 1
    assert (await h.history("t1"))[1:] == [AssistantText("partial")]
    assert not any(isinstance(e, Info) and "retrying" in e.text for e in h.observer.of("t1"))


async def test_ep24_unknown_tool_injects_error_and_loops_back() -> None:
    provider = ReplayProvider().then(call("nonexistent_tool", "tc-1"), Final()).then(*text("ok, done"))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert len(provider.requests) == 2
    last = provider.requests[1].history[-1]
    assert result_text(last) == "Error: tool 'nonexistent_tool' does not exist"
    assert isinstance(last, ToolResultItem) and last.result.id == "tc-1"
    events = h.observer.of("t1")
    assert texts_of(events) == ["ok, done"]
    assert not any(isinstance(e, ToolCallStarted) for e in events)  # no event for an unknown call
    stored = await h.stored("t1")
    assert [message_id for _, message_id, _ in stored] == [
        "m1",
        "t1-m1-completion-0",
        "tc-1-unknown-tool",
        "t1-m1-completion-2",
    ]


async def test_ep25_receive_event_injected_is_rejected_and_loops_back() -> None:
    provider = (
        ReplayProvider()
        .then(call("receive_event__injected", "tc-1", original_tool_call_id="x"), Final())
        .then(*text("sorry"))
    )
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert len(provider.requests) == 2
    assert result_text(provider.requests[1].history[-1]) == texts.FORBIDDEN_TOOL
    assert texts.FORBIDDEN_TOOL == (
        "Error: you cannot directly invoke receive_event__injected, invocations will automatically be "
        "injected when events arrive."
    )
    assert (await h.history("t1"))[-1] == AssistantText("sorry")
    assert not any(isinstance(e, ToolCallStarted) for e in h.observer.of("t1"))


async def test_ep26_sync_tool_loops_back_in_the_same_step() -> None:
    provider = ReplayProvider().then(call("echo_sync", "s1", text="hi"), Final()).then(*text("done"))
    h = Harness(provider, [EchoSyncTool()])
    await h.say("t1", "go", "m1")
    events = stream_events(h.observer.of("t1"))
    calls = [e for e in events if isinstance(e, ToolCallStarted)]
    results = [e for e in events if isinstance(e, ToolResultReceived)]
    assert [(c.name, c.arguments) for c in calls] == [("echo_sync", {"text": "hi"})]
    assert [r.segments for r in results] == [[{"type": "text", "content": "echo: hi"}]]
    assert events.index(calls[0]) < events.index(results[0])
    assert result_text(provider.requests[1].history[-1]) == "echo: hi"
    assert texts_of(events) == ["done"]
    assert await h.state.open_intents("t1") == []


def _image_result_history() -> ToolResult:
    return ToolResult(
        id="tc-1",
        content=[TextBlock(text='Read image file "logo.png"'), ImageBlock(data=PNG, media_type="image/png")],
    )


async def test_ep27_image_tool_result_reaches_an_image_capable_model_unchanged() -> None:
    provider = ReplayProvider(model=ModelInfo("vision", supports_image_input=True))
    provider.then(call("lookup", "tc-1"), Final()).then(*text("a logo"))
    h = Harness(provider, [RecordingTool()])
    await h.say("t1", "read logo", "m1")
    await h.send(InputMessage.tool_result("t1", _image_result_history()), "r1")
    await h.run()
    last = provider.requests[1].history[-1]
    assert isinstance(last, ToolResultItem)
    assert last.result == _image_result_history()


async def test_ep28_image_tool_result_is_replaced_by_a_placeholder_for_a_text_only_model() -> None:
    provider = ReplayProvider(model=ModelInfo("text-only", supports_image_input=False))
    provider.then(call("lookup", "tc-1"), Final()).then(*text("cannot see it"))
    h = Harness(provider, [RecordingTool()])
    await h.say("t1", "read logo", "m1")
    await h.send(InputMessage.tool_result("t1", _image_result_history()), "r1")
    await h.run()
    last = provider.requests[1].history[-1]
    assert isinstance(last, ToolResultItem)
    assert last.result.content == [
        TextBlock(text='Read image file "logo.png"'),
        TextBlock(text="[image omitted: the current model does not support image inputs]"),
    ]
    # Only the outgoing request changes: the stored result keeps the image.
    stored = (await h.history("t1"))[2]
    assert isinstance(stored, ToolResultItem) and stored.result == _image_result_history()


async def test_ep29_thinking_chunks_are_emitted_in_order() -> None:
    provider = ReplayProvider().then(ReasoningDelta("hmm"), ReasoningDelta("..."), *text("answer"))
    h = Harness(provider)
    await h.say("t1", "think", "m1")
    assert stream_events(h.observer.of("t1")) == [
        ThinkingStarted(),
        ThinkingChunk("hmm"),
        ThinkingChunk("..."),
        ThinkingEnded(),
        TextChunk("answer"),
    ]
    # Reasoning deltas are display-only.
    assert (await h.history("t1"))[1:] == [AssistantText("answer")]


async def test_ep30_async_tool_call_is_dispatched() -> None:
    tool = RecordingTool(tool_name="async_tool")
    h = Harness(ReplayProvider().then(call("async_tool", "tc-1", q=1), Final()), [tool])
    await h.say("t1", "go", "m1")
    events = h.observer.of("t1")
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert started == [ToolCallStarted(name="async_tool", arguments={"q": 1}, tool_call_id="tc-1")]
    assert tool.dispatches == [("tc-1", {"q": 1})]
    # Dispatch follows the commit.
    finished = next(i for i, e in enumerate(events) if isinstance(e, CompletionFinished))
    assert events.index(started[0]) < finished


async def test_ep31_concurrent_tool_calls_suppress_trailing_stream_content() -> None:
    tool = RecordingTool()
    second = ToolCall(id="tc-2", name="lookup", arguments={"q": "b"})
    provider = ReplayProvider().then(
        ReasoningDelta("plan"),
        ReasoningComplete("plan", signature="sig-1"),
        ToolCallDelta(name="lookup"),
        call("lookup", "tc-1", q="a"),
        ToolCallDelta(name="lookup"),
        ToolCallDelta(arguments_delta='{"q": "b"}'),
        ReasoningDelta("more"),
        ReasoningComplete("more", signature="sig-2"),
        ToolCallComplete(second),
        Final(),
    )
    h = Harness(provider, [tool])
    await h.say("t1", "go", "m1")
    events = stream_events(h.observer.of("t1"))
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [e.tool_call_id for e in started] == ["tc-1"]
    assert events[-1] == started[0]  # nothing after the round's tool call reaches observers
    assert events == [
        ThinkingStarted(),
        ThinkingChunk("plan"),
        ThinkingEnded(),
        ThinkingChunk("Invoking tool: lookup"),
        started[0],
    ]
    history = await h.history("t1")
    assert history[1] == Reasoning("plan", "sig-1")
    assert isinstance(history[-1], ToolCallItem) and history[-1].call.id == "tc-1"
    assert len(history) == 3
    assert tool.dispatches == [("tc-1", {"q": "a"})]


async def test_ep32_stream_drop_triggers_a_retry() -> None:
    provider = ReplayProvider().then(TextDelta("part")).then(*text("recovered"))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert len(provider.requests) == 2
    events = h.observer.of("t1")
    assert texts_of(events)[-1] == "recovered"
    assert Info("Stream error (unexpected end), retrying...") in events
    assert (await h.history("t1"))[1:] == [AssistantText("recovered")]


async def test_ep33_cancellation_during_thinking_ends_thinking() -> None:
    cancel = asyncio.Event()
    provider = HookedReplayProvider().then(ReasoningDelta("deep"), cancel.set, ReasoningDelta("er"), Final())
    h = Harness(provider)
    await h.system.step_thread(
        "t1", [StepInput(InputMessage.user_text("t1", "go"), "m1")], h.observer, cancel=cancel
    )
    events = stream_events(h.observer.of("t1"))
    assert events == [ThinkingStarted(), ThinkingChunk("deep"), ThinkingEnded()]


async def test_ep34_cancellation_after_reasoning_does_not_commit_trailing_reasoning() -> None:
    cancel = asyncio.Event()
    provider = HookedReplayProvider().then(
        TextDelta("here is the answer"),
        ReasoningComplete("second thoughts", signature="sig"),
        cancel.set,
        TextDelta("ignored"),
        Final(),
    )
    h = Harness(provider)
    await h.system.step_thread(
        "t1", [StepInput(InputMessage.user_text("t1", "go"), "m1")], h.observer, cancel=cancel
    )
    assert (await h.history("t1"))[1:] == [AssistantText("here is the answer")]


async def test_ep35_multiple_sync_tool_calls_chain() -> None:
    provider = (
        ReplayProvider()
        .then(call("echo_sync", "s1", text="one"), Final())
        .then(call("echo_sync", "s2", text="two"), Final())
        .then(*text("all done"))
    )
    h = Harness(provider, [EchoSyncTool()])
    await h.say("t1", "go", "m1")
    events = h.observer.of("t1")
    assert [e.tool_call_id for e in events if isinstance(e, ToolCallStarted)] == ["s1", "s2"]
    assert texts_of(events) == ["all done"]
    assert len(provider.requests) == 3
    history = await h.history("t1")
    assert [result_text(i) for i in history if isinstance(i, ToolResultItem)] == ["echo: one", "echo: two"]


async def test_ep36_broken_stream_discards_the_partial_turn_before_retrying() -> None:
    provider = ReplayProvider().then(TextDelta("I'll take a look")).then(*text("done"))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    retry_request = provider.requests[1].history
    assert isinstance(retry_request[-1], UserItem)  # never a half-streamed assistant "prefill"
    assert texts_of(h.observer.of("t1")) == ["I'll take a look", "done"]  # the first went out live
    assert (await h.history("t1"))[1:] == [AssistantText("done")]


async def test_ep37_async_tool_call_flushes_text_and_call_before_the_turn_ends() -> None:
    tool = RecordingTool()
    provider = ReplayProvider().then(TextDelta("let me check"), call("lookup", "tc-1"), Final())
    h = Harness(provider, [tool])
    await h.say("t1", "go", "m1")
    history = await h.history("t1")
    assert history[1] == AssistantText("let me check")
    assert isinstance(history[2], ToolCallItem) and history[2].call.id == "tc-1"
    assert len(history) == 3
    stored = await h.stored("t1")
    assert [m for _, m, _ in stored] == ["m1", "t1-m1-completion-0", "t1-m1-completion-1"]


async def test_ep38_sync_loop_back_request_contains_the_flushed_call_and_its_result() -> None:
    provider = (
        ReplayProvider()
        .then(TextDelta("echoing"), call("echo_sync", "s1", text="hi"), Final())
        .then(*text("done"))
    )
    h = Harness(provider, [EchoSyncTool()])
    await h.say("t1", "go", "m1")
    loop_back = provider.requests[1].history
    assert loop_back[-3] == AssistantText("echoing")
    assert isinstance(loop_back[-2], ToolCallItem) and loop_back[-2].call.id == "s1"
    assert isinstance(loop_back[-1], ToolResultItem) and loop_back[-1].result.id == "s1"


# ---- dispatch failures ---------------------------------------------------------------------------------------


async def test_ep40_failed_dispatch_enqueues_an_error_result_for_the_same_call() -> None:
    tool = RecordingTool(fail_with=RuntimeError("stub"))
    failing = ToolCall(id="tc-1", name="lookup", arguments={}, call_id="call-1")
    provider = ReplayProvider().then(ToolCallComplete(failing), Final())
    h = Harness(provider, [tool])
    await h.step((InputMessage.user_text("t1", "go"), "m1"))
    sent = sent_to(h, "t1")
    assert len(sent) == 1
    dedup, message = sent[0]
    assert dedup == "tc-1"
    assert message.synthetic is None
    assert message.content == ToolResult.text("tc-1", "Error: Tool call failed: stub", call_id="call-1")
    assert Info("Error: stub") in h.observer.of("t1")
    assert await h.state.open_intents("t1") == []  # the fallback answered it: nothing left to re-drive


async def test_st1_failed_tool_dispatch_returns_the_error_to_the_agent() -> None:
    tool = RecordingTool(tool_name="failing_tool", fail_with=RuntimeError("boom"))
    provider = ReplayProvider().then(call("failing_tool", "tc-1"), Final()).then(*text("recovered"))
    h = Harness(provider, [tool])
    await h.step((InputMessage.user_text("t1", "go"), "m1"))
    assert len(provider.requests) == 1
    assert [m for m, _ in sent_to(h, "t1")] == ["tc-1"]
    await h.run()  # the fallback result is the next step's input
    assert len(provider.requests) == 2
    assert result_text(provider.requests[1].history[-1]) == "Error: Tool call failed: boom"
    assert (await h.history("t1"))[-1] == AssistantText("recovered")
    assert h.sender.queue == []  # idle


async def test_tool_error_from_a_sync_tool_is_shown_as_error_message() -> None:
    from stepagent.errors import ToolError

    class Picky(Tool):
        name = "picky"
        inline = True

        async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
            raise ToolError("no such file")

    provider = ReplayProvider().then(call("picky", "p1"), Final()).then(*text("ok"))
    h = Harness(provider, [Picky()])
    await h.say("t1", "go", "m1")
    assert result_text(provider.requests[1].history[-1]) == "Error: no such file"


# ---- step mode: one slice per thread, several threads per batch, OAuth ---------------------------------------


async def test_sb1_step_mode_runs_a_single_slice() -> None:
    h = Harness(ReplayProvider().then(*text("hi there")))
    results = await h.step((InputMessage.user_text("t1", "hello"), "m1"))
    assert [(r.thread_id, r.outcome is not None and r.outcome.completed) for r in results] == [("t1", True)]
    events = h.observer.events
    assert ("t1", UserInput("hello")) in events
    assert ("t1", TextChunk("hi there")) in events
    assert any(t == "t1" and isinstance(e, CompletionFinished) for t, e in events)
    assert h.sender.sent == []  # nothing enqueued on the loopback


async def test_sb2_step_mode_runs_several_threads_from_one_batch() -> None:
    provider = ThreadRoutedProvider().then("t1", *text("one")).then("t2", *text("two"))
    h = Harness(provider)
    results = await h.step(
        (InputMessage.user_text("t1", "first"), "m1"), (InputMessage.user_text("t2", "second"), "m2")
    )
    assert [(r.thread_id, r.outcome is not None and r.outcome.completed) for r in results] == [
        ("t1", True),
        ("t2", True),
    ]
    assert texts_of(h.observer.of("t1")) == ["one"]
    assert texts_of(h.observer.of("t2")) == ["two"]


async def test_sb3_oauth_is_surfaced_and_the_actionable_input_completes() -> None:
    h = Harness(ReplayProvider().then(*text("hi")))
    oauth = InputMessage(content=OAuthRequired(id="tc-9", auth_url="https://example.com/auth"), group_id="t1")
    results = await h.step((oauth, "o1"), (InputMessage.user_text("t1", "hello"), "m1"))
    assert len(results) == 1
    assert results[0].outcome is not None and results[0].outcome.completed
    events = h.observer.of("t1")
    assert OAuthRequiredEvent(auth_url="https://example.com/auth", tool_call_id="tc-9") in events
    assert UserInput("hello") in events
    assert events.index(UserInput("hello")) > next(
        i for i, e in enumerate(events) if isinstance(e, OAuthRequiredEvent)
    )
    assert [type(i) for i in await h.history("t1")] == [UserItem, AssistantText]


# ---- rounds, thinking, reasoning ------------------------------------------------------------------------------


async def test_round_cap_stops_a_model_that_keeps_calling_unknown_tools() -> None:
    provider = ReplayProvider()
    for n in range(MAX_ROUNDS_PER_STEP + 1):
        provider.then(call("no_such_tool", f"tc-{n}"), Final())
    h = Harness(provider)
    results = await h.say("t1", "go", "m1")
    assert MAX_ROUNDS_PER_STEP == 25
    assert len(provider.requests) == 25
    assert results[0].outcome is not None and results[0].outcome.completed
    assert Info("Stopped after 25 model rounds in one step") in h.observer.of("t1")
    history = await h.history("t1")
    assert len(history) == 1 + 2 * 25  # every round's call and its error result are committed
    assert result_text(history[-1]) == "Error: tool 'no_such_tool' does not exist"


async def test_thinking_events_bracket_reasoning_and_end_at_tool_calls_and_final() -> None:
    tool = RecordingTool()
    provider = (
        ReplayProvider()
        .then(ReasoningDelta("a"), ReasoningComplete("a", signature="s"), ReasoningDelta("b"), Final())
        .then(ReasoningDelta("c"), call("lookup", "tc-1"), Final())
    )
    h = Harness(provider, [tool])
    await h.say("t1", "one", "m1")
    assert stream_events(h.observer.of("t1")) == [
        ThinkingStarted(),
        ThinkingChunk("a"),
        ThinkingEnded(),  # a complete reasoning block ends the thinking run
        ThinkingStarted(),
        ThinkingChunk("b"),
        ThinkingEnded(),  # so does Final
    ]
    h.observer.take()
    await h.say("t1", "two", "m2")
    events = stream_events(h.observer.of("t1"))
    assert events[:3] == [ThinkingStarted(), ThinkingChunk("c"), ThinkingEnded()]  # so does a tool call
    assert isinstance(events[3], ToolCallStarted)


async def test_unsigned_reasoning_is_dropped_and_signed_reasoning_is_stored() -> None:
    provider = ReplayProvider().then(
        ReasoningComplete("unsigned thoughts"),
        ReasoningComplete("signed thoughts", signature="sig-a"),
        ReasoningComplete("", redacted="opaque"),
        *text("answer"),
    )
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    history = await h.history("t1")
    assert history[1:] == [
        Reasoning("signed thoughts", "sig-a"),
        Reasoning("", None, "opaque"),
        AssistantText("answer"),
    ]
    # The unsigned block did not consume a completion id.
    stored = await h.stored("t1")
    assert [m for _, m, _ in stored][1:] == [
        "t1-m1-completion-0",
        "t1-m1-completion-1",
        "t1-m1-completion-2",
    ]


async def test_non_retryable_failure_commits_partial_text_without_trailing_reasoning() -> None:
    provider = ReplayProvider().then(
        TextDelta("here is the answer"),
        ReasoningComplete("but wait", signature="sig"),
        TextDelta("   "),
        ProviderError("context length exceeded", retryable=False, status=400),
    )
    h = Harness(provider)
    results = await h.say("t1", "go", "m1")
    assert results[0].outcome is not None and results[0].outcome.completed
    assert (await h.history("t1"))[1:] == [AssistantText("here is the answer")]
    failures = [e for e in h.observer.of("t1") if isinstance(e, StepFailed)]
    assert len(failures) == 1 and not failures[0].retrying
    assert "context length exceeded" in failures[0].message
    assert len(provider.requests) == 1


async def test_retryable_failure_discards_the_partial_turn_and_retries() -> None:
    provider = (
        ReplayProvider()
        .then(TextDelta("half"), ReasoningComplete("r", signature="s"), retryable())
        .then(*text("whole"))
    )
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert (await h.history("t1"))[1:] == [AssistantText("whole")]
    assert Info("Stream error (overloaded), retrying...") in h.observer.of("t1")


# ---- the dispatch outbox ----------------------------------------------------------------------------------------


class StoreInspectingTool(Tool):
    """Looks at the stores from inside ``execute``: what a remote tool server could observe. (Tools are given
    no raw store, so it reads the harness's stores directly.)"""

    name = "inspect_store"

    def __init__(self) -> None:
        self.seen_rows: list[Any] = []
        self.seen_intents: list[Any] = []
        self.stores: tuple[Any, Any] | None = None

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        assert self.stores is not None
        conversation, state = self.stores
        self.seen_rows = [r async for r in conversation.load_rows(context.thread_id)]
        self.seen_intents = await state.open_intents(context.thread_id)


async def test_async_call_and_its_intent_are_committed_before_dispatch() -> None:
    tool = StoreInspectingTool()
    provider = ReplayProvider().then(TextDelta("checking"), call("inspect_store", "tc-1", a=1), Final())
    h = Harness(provider, [tool])
    tool.stores = (h.conversation, h.state)
    await h.say("t1", "go", "m1")
    assert [r.message_id for r in tool.seen_rows] == ["m1", "t1-m1-completion-0", "t1-m1-completion-1"]
    last = tool.seen_rows[-1].item
    assert isinstance(last, ToolCallItem) and last.call.id == "tc-1"
    assert [(i.tool_call_id, i.tool_name, i.arguments) for i in tool.seen_intents] == [
        ("tc-1", "inspect_store", {"a": 1})
    ]
    assert await h.state.open_intents("t1") == []  # marked done after the dispatch


class Crash(BaseException):
    """The process dying mid-dispatch (not an ``Exception``, so no runtime handler swallows it)."""


class CrashOnceTool(Tool):
    name = "deploy"

    def __init__(self) -> None:
        self.dispatches: list[str] = []

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        self.dispatches.append(context.tool_call_id)
        if len(self.dispatches) == 1:
            raise Crash("killed during dispatch")


async def test_crash_during_dispatch_is_redispatched_once_on_redelivery() -> None:
    tool = CrashOnceTool()
    provider = ReplayProvider().then(call("deploy", "tc-1", env="prod"), Final())
    h = Harness(provider, [tool])
    batch = (InputMessage.user_text("t1", "deploy it"), "m1")
    try:
        await h.step(batch)
    except Crash:
        pass
    else:  # pragma: no cover - the crash must escape the step
        raise AssertionError("the crash was swallowed")
    committed = await h.stored("t1")
    assert [m for _, m, _ in committed] == ["m1", "t1-m1-completion-0"]
    assert [i.tool_call_id for i in await h.state.open_intents("t1")] == ["tc-1"]

    results = await h.step(batch)  # SQS redelivers the same message
    assert results[0].error is None
    assert tool.dispatches == ["tc-1", "tc-1"]
    assert len(provider.requests) == 1  # the model is not asked again
    assert await h.stored("t1") == committed  # history is unchanged
    assert await h.state.open_intents("t1") == []

    await h.step(batch)  # a further redelivery does nothing
    assert tool.dispatches == ["tc-1", "tc-1"]
