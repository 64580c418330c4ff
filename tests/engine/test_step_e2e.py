"""End-to-end step-mode scenarios through ``AgentSystem.step`` with in-memory stores."""

from __future__ import annotations

from stepagent import texts
from stepagent.events import (
    CompletionFinished,
    Info,
    StepFailed,
    SubscriptionEventReceived,
    TextChunk,
    ToolCallStarted,
    TurnCommitted,
    UserInput,
)
from stepagent.history_items import AssistantText, EventItem, ToolCallItem, ToolResultItem, UserItem
from stepagent.ids import child_thread_id
from stepagent.messages import InputMessage, SubscriptionEvent, ToolResult
from stepagent.providers.base import Final, TextDelta
from tests.engine.harness import EchoSyncTool, Harness, RecordingTool, ReplayProvider, call, retryable, text


async def test_user_text_gets_an_answer() -> None:
    provider = ReplayProvider().then(*text("Hello", ", world"))
    h = Harness(provider)
    results = await h.say("t1", "hi", "m1")
    assert results[0].outcome is not None and results[0].outcome.completed
    history = await h.history("t1")
    assert [type(i) for i in history] == [UserItem, AssistantText]
    assert history[1] == AssistantText("Hello, world")
    events = h.observer.of("t1")
    assert UserInput("hi") in events
    assert [e.text for e in events if isinstance(e, TextChunk)] == ["Hello", ", world"]
    finished = [i for i, e in enumerate(events) if isinstance(e, CompletionFinished)]
    committed = [i for i, e in enumerate(events) if isinstance(e, TurnCommitted)]
    assert committed and finished and committed[-1] < finished[0]


async def test_async_tool_round_trip() -> None:
    tool = RecordingTool()
    provider = (
        ReplayProvider()
        .then(TextDelta("let me check"), call("lookup", "tc-1", q="x"), Final())
        .then(*text("it is 42"))
    )
    h = Harness(provider, [tool])
    await h.say("t1", "what is it?", "m1")
    assert tool.dispatches == [("tc-1", {"q": "x"})]
    history = await h.history("t1")
    assert isinstance(history[-1], ToolCallItem) and history[-1].call.id == "tc-1"
    assert await h.state.open_intents("t1") == []  # dispatched and marked done

    await h.send(InputMessage.tool_result("t1", ToolResult.text("tc-1", "42")), "rap-tool-result-tc-1")
    await h.run()
    history = await h.history("t1")
    assert isinstance(history[-2], ToolResultItem) and history[-2].result.first_text() == "42"
    assert history[-1] == AssistantText("it is 42")
    assert "42" in str(provider.requests[-1].history[-1])


async def test_spawn_report_close_parent_sees_both_reports() -> None:
    provider = ReplayProvider()
    h = Harness(provider)
    child = child_thread_id("root", "spawn-1")
    provider.then(call("spawn_thread", "spawn-1", instructions="review a.ts", child_of=["root"]), Final())
    provider.then(*text("Spawned."))
    await h.sender.send(InputMessage.user_text("root", "review a.ts"), "m1")
    # Parent step: spawn (sync tool) + loop back.
    await h.system.step([_queued(q) for q in h.sender.drain()], h.observer)
    parent = await h.history("root")
    assert isinstance(parent[2], ToolResultItem) and child in (parent[2].result.first_text() or "")
    assert parent[-1] == AssistantText("Spawned.")

    # Child: report, then (after the ack) close with a final report; parent answers each report.
    provider.then(call("report_to_parent", "rep-1", report="found bug"), Final())
    await h.system.step([_queued(q) for q in h.sender.drain()], h.observer)
    child_history = await h.history(child)
    assert isinstance(child_history[1], ToolCallItem)  # inherited spawn call
    queued = h.sender.drain()
    assert {q.message.group_id for q in queued} == {"root", child}

    provider.then(*text("noted"))  # parent on the report
    provider.then(call("close_thread", "close-1", thread_id=child, report_to_parent="done"), Final())  # child
    await h.system.step([_queued(q) for q in queued], h.observer)
    provider.then(*text("child finished"))
    await h.run()

    parent = await h.history("root")
    events = [i for i in parent if isinstance(i, EventItem)]
    assert [e.result.first_text() for e in events] == [
        "Report from child thread: found bug",
        f"Child thread with ID {child} has shut down. Report from child thread: done",
    ]
    assert all(e.tool_call_id == "spawn-1" and e.child_thread_id == child for e in events)
    assert (
        events[0].invocation is not None
        and events[0].invocation.arguments["original_tool_name"] == "spawn_thread"
    )
    assert (await h.conversation.get_thread(child)).closed  # type: ignore[union-attr]
    names = [e.name for e in h.observer.of("root") if isinstance(e, SubscriptionEventReceived)]
    assert names == [f"Report from child thread {child}"] * 2


async def test_subscription_event_spawns_event_child_and_associative_event_is_inlined() -> None:
    tool = RecordingTool(tool_name="subscribe")
    provider = ReplayProvider().then(call("subscribe", "sub-1", topic="builds"), Final())
    h = Harness(provider, [tool])
    await h.say("t1", "watch builds", "m1")
    start = InputMessage.tool_result("t1", ToolResult.text("sub-1", "subscribed"), subscription=True)
    provider.then(*text("watching"))
    await h.send(start, "r1")
    await h.run()
    assert await h.state.active_subscriptions("t1") == {"sub-1"}
    before = await h.stored("t1")

    # Non-associative: a child thread processes it; the parent's history is untouched.
    event = InputMessage.tool_result(
        "t1", ToolResult.text("sub-1", "build 7 failed"), synthetic=SubscriptionEvent(tool_call_id="sub-1")
    )
    provider.then(*text("looking at build 7"))  # the event child's completion
    await h.send(event, "e1")
    await h.run()
    assert await h.stored("t1") == before
    children = [t for t, i in h.conversation.backend.threads.items() if i.parent_id == "t1"]
    assert len(children) == 1
    child_history = await h.history(children[0])
    assert isinstance(child_history[-2], ToolResultItem)
    assert child_history[-2].result.first_text() == "build 7 failed"
    assert child_history[-1] == AssistantText("looking at build 7")

    # Associative + final: inlined in t1 and the subscription ends.
    inline = InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "build 8 ok"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=True, final=True),
    )
    provider.then(*text("all good"))
    await h.send(inline, "e2")
    await h.run()
    history = await h.history("t1")
    assert isinstance(history[-2], EventItem) and history[-2].result.first_text() == "build 8 ok"
    assert await h.state.active_subscriptions("t1") == set()

    # Events for a cancelled/unknown subscription are dropped.
    late = InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "late"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=True),
    )
    await h.send(late, "e3")
    await h.run()
    assert (await h.history("t1"))[-1] == AssistantText("all good")


async def test_hallucinated_tool_gets_error_and_another_round() -> None:
    provider = ReplayProvider().then(call("nonexistent_tool", "tc-x"), Final()).then(*text("ok, done"))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert "does not exist" in str(provider.requests[1].history[-1])
    history = await h.history("t1")
    assert isinstance(history[2], ToolResultItem)
    assert history[2].result.first_text() == "Error: tool 'nonexistent_tool' does not exist"
    assert not any(isinstance(e, ToolCallStarted) for e in h.observer.of("t1"))


async def test_forbidden_injected_tool_is_rejected() -> None:
    provider = ReplayProvider().then(call("receive_event__injected", "tc-x"), Final()).then(*text("sorry"))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    history = await h.history("t1")
    assert isinstance(history[2], ToolResultItem) and history[2].result.first_text() == texts.FORBIDDEN_TOOL


async def test_tool_that_raises_returns_error_result() -> None:
    tool = RecordingTool(fail_with=RuntimeError("boom"))
    provider = ReplayProvider().then(call("lookup", "tc-1"), Final()).then(*text("recovered"))
    h = Harness(provider, [tool])
    await h.say("t1", "go", "m1")
    history = await h.history("t1")
    result = history[-2]
    assert (
        isinstance(result, ToolResultItem) and result.result.first_text() == "Error: Tool call failed: boom"
    )
    assert history[-1] == AssistantText("recovered")
    assert "Error: Tool call failed" in str(provider.requests[1].history[-1])


async def test_provider_error_mid_stream_then_success_discards_partial_turn() -> None:
    provider = ReplayProvider().then(TextDelta("I'll take a look"), retryable()).then(*text("done"))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert isinstance(provider.requests[1].history[-1], UserItem)  # partial turn never resent
    assert (await h.history("t1"))[1:] == [AssistantText("done")]
    assert any(isinstance(e, Info) and "retrying" in e.text for e in h.observer.of("t1"))


async def test_stream_cut_without_final_is_retried() -> None:
    provider = ReplayProvider().then(TextDelta("partial")).then(*text("recovered"))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert (await h.history("t1"))[1:] == [AssistantText("recovered")]


async def test_non_retryable_provider_error_commits_input_and_reports() -> None:
    from stepagent.errors import ProviderError

    provider = ReplayProvider().then(ProviderError("bad request", retryable=False, status=400))
    h = Harness(provider)
    await h.say("t1", "go", "m1")
    assert [type(i) for i in await h.history("t1")] == [UserItem]
    failures = [e for e in h.observer.of("t1") if isinstance(e, StepFailed)]
    assert failures and not failures[0].retrying and "bad request" in failures[0].message


async def test_sync_tool_loops_back_in_same_step() -> None:
    provider = (
        ReplayProvider()
        .then(call("echo_sync", "s1", text="hi"), Final())
        .then(call("echo_sync", "s2", text="again"), Final())
        .then(*text("all done"))
    )
    h = Harness(provider, [EchoSyncTool()])
    await h.say("t1", "go", "m1")
    second = provider.requests[1].history
    assert isinstance(second[-2], ToolCallItem) and isinstance(second[-1], ToolResultItem)
    assert second[-1].result.first_text() == "echo: hi"
    assert len(provider.requests) == 3
    assert await h.state.open_intents("t1") == []


async def test_content_after_the_rounds_tool_call_is_ignored() -> None:
    tool = RecordingTool()
    provider = ReplayProvider().then(
        call("lookup", "tc-1"), TextDelta("trailing"), call("lookup", "tc-2"), Final()
    )
    h = Harness(provider, [tool])
    await h.say("t1", "go", "m1")
    history = await h.history("t1")
    assert isinstance(history[-1], ToolCallItem) and history[-1].call.id == "tc-1"
    assert tool.dispatches == [("tc-1", {})]


async def test_stream_failure_after_tool_call_ends_round_without_retry() -> None:
    tool = RecordingTool()
    provider = ReplayProvider().then(call("lookup", "tc-1"), retryable("cut"))
    h = Harness(provider, [tool])
    await h.say("t1", "go", "m1")
    assert len(provider.requests) == 1
    assert tool.dispatches == [("tc-1", {})]


def _queued(q):  # type: ignore[no-untyped-def]
    from stepagent.core.step import StepInput

    return StepInput(q.message, q.message_id)
