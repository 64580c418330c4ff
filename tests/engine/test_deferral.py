"""Durable deferral (events don't kill running tools): reports, subscription events and parent messages that arrive while a
non-passive asynchronous tool call is pending wait, durably, and are delivered after its result; user
text still interrupts. Passive tools (``sleep_until_event_or_input``) hold nothing back.

Where the reference runtime's Lambda uses ``NoDeferral`` (the event interrupts the running tool), we
follow its local mode: an event never cancels a tool that is still working.
"""

from __future__ import annotations

from stepagent.events import CompletionStarted, UserChoiceDismissed
from stepagent.history_items import (
    AssistantText,
    EventItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.ids import child_thread_id, derived_id
from stepagent.messages import InputMessage, ParentMessage, SubscriptionEvent, ThreadReport, ToolResult
from stepagent.providers.base import Final, ModelRequest
from stepagent.stores.base import ThreadKind
from tests.engine.harness import (
    Harness,
    RecordingNotifier,
    RecordingTool,
    ReplayProvider,
    ThreadRoutedProvider,
    call,
    step_queued,
    text,
)

INTERRUPTED = "Tool call interrupted by user"


def request_text(request: ModelRequest) -> str:
    return str(request.history)


def report(tool_call_id: str, body: str, child: str = "c-1") -> InputMessage:
    return InputMessage.tool_result(
        "t1",
        ToolResult.text("", body),
        synthetic=ThreadReport(tool_call_id=tool_call_id, child_thread_id=child),
    )


def sub_event(body: str, *, associative: bool = True) -> InputMessage:
    return InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", body),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=associative),
    )


def tool_done(tool_call_id: str = "tc-async", body: str = "tool done") -> InputMessage:
    return InputMessage.tool_result("t1", ToolResult.text(tool_call_id, body))


async def waiting_harness(*, subscribed: bool = False) -> tuple[Harness, ReplayProvider]:
    """``t1`` waits for the async call ``tc-async``; optionally it first subscribed with ``sub-1``."""
    provider = ReplayProvider()
    h = Harness(provider, [RecordingTool(tool_name="async_tool"), RecordingTool(tool_name="subscribe")])
    if subscribed:
        provider.then(call("subscribe", "sub-1", topic="builds"), Final()).then(*text("watching"))
        await h.say("t1", "watch builds", "m0")
        start = InputMessage.tool_result("t1", ToolResult.text("sub-1", "subscribed"), subscription=True)
        await h.step((start, "r0"))
    provider.then(call("async_tool", "tc-async"), Final())
    await h.say("t1", "run the tool", "m1")
    # The reports below come from ``c-1``, which must really be a child spawned with that call (a report
    # from anyone else is refused).
    await h.conversation.spawn_thread(
        "t1", child_id="c-1", spawn_tool_call_id="tc-async", kind=ThreadKind.CHILD
    )
    return h, provider


def inline_texts(history: list[object]) -> list[str | None]:
    return [i.result.first_text() for i in history if isinstance(i, EventItem)]


# ---- reports, events and parent messages during a pending call ------------------------------------------------------


async def test_sy08_thread_report_is_deferred_during_an_async_tool_wait() -> None:
    h, provider = await waiting_harness()
    requests = len(provider.requests)
    results = await h.step((report("tc-async", "progress update"), "rep-1"))
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert len(provider.requests) == requests  # the model is not woken
    assert [d.message_id for d in await h.state.deferred_inputs("t1")] == ["rep-1"]
    history = await h.history("t1")
    assert isinstance(history[-1], ToolCallItem) and history[-1].call.id == "tc-async"

    provider.then(*text("both seen"))
    await h.step((tool_done(), "res-1"))
    assert len(provider.requests) == requests + 1  # one request for the result and the report
    seen = provider.requests[-1].history
    assert isinstance(seen[-2], ToolResultItem) and seen[-2].result.first_text() == "tool done"
    assert isinstance(seen[-1], EventItem) and seen[-1].result.first_text() == "progress update"
    assert INTERRUPTED not in request_text(provider.requests[-1])
    assert await h.state.deferred_inputs("t1") == []
    assert (await h.history("t1"))[-1] == AssistantText("both seen")


async def test_sy08_report_from_a_real_child_waits_for_the_parents_tool() -> None:
    child = child_thread_id("root", "spawn-1")
    provider = ThreadRoutedProvider()
    provider.then("root", call("spawn_thread", "spawn-1", instructions="dig", child_of=["root"]), Final())
    provider.then("root", call("lookup", "tc-async"), Final())
    provider.then(child, call("report_to_parent", "rep-1", report="halfway"), Final())
    provider.then(child, *text("keep digging"))
    tool = RecordingTool()
    h = Harness(provider, [tool])
    await h.say("root", "go", "m1")  # runs root, then the child, then the report + the child's ack
    assert tool.dispatches == [("tc-async", {})]
    assert len(provider.requests_of("root")) == 2
    assert [d.message.synthetic for d in await h.state.deferred_inputs("root")] == [
        ThreadReport(tool_call_id="spawn-1", child_thread_id=child)
    ]

    provider.then("root", *text("lookup and report handled"))
    await h.send(InputMessage.tool_result("root", ToolResult.text("tc-async", "42")), "res-1")
    await h.run()
    [last] = provider.requests_of("root")[2:]
    assert isinstance(last.history[-2], ToolResultItem) and last.history[-2].result.first_text() == "42"
    assert isinstance(last.history[-1], EventItem)
    assert last.history[-1].result.first_text() == "Report from child thread: halfway"
    assert INTERRUPTED not in request_text(last)


async def test_sy10_subscription_event_is_deferred_during_an_async_tool_wait() -> None:
    h, provider = await waiting_harness(subscribed=True)
    requests = len(provider.requests)
    await h.step((sub_event("sub event data"), "ev-1"))
    assert len(provider.requests) == requests
    assert [d.message_id for d in await h.state.deferred_inputs("t1")] == ["ev-1"]

    provider.then(*text("done"))
    await h.step((tool_done(), "res-1"))
    assert len(provider.requests) == requests + 1
    seen = request_text(provider.requests[-1])
    assert "tool done" in seen and "sub event data" in seen and INTERRUPTED not in seen
    history = await h.history("t1")
    assert isinstance(history[-3], ToolResultItem) and history[-3].result.id == "tc-async"
    assert inline_texts(history) == ["sub event data"]


async def test_sy11_stale_result_does_not_release_deferred_events() -> None:
    h, provider = await waiting_harness(subscribed=True)
    requests = len(provider.requests)
    results = await h.step((sub_event("sub event data"), "ev-1"), (tool_done("tc-stale", "stale"), "stale-1"))
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert len(provider.requests) == requests
    assert [d.message_id for d in await h.state.deferred_inputs("t1")] == ["ev-1"]
    assert await h.state.filter_processed("t1", ["stale-1"]) == set()  # ignored, not recorded

    # The stale result alone, again: still nothing.
    await h.step((tool_done("tc-stale", "stale"), "stale-2"))
    assert len(provider.requests) == requests

    provider.then(*text("done"))
    await h.step((tool_done(), "res-1"))
    seen = request_text(provider.requests[-1])
    assert "tool done" in seen and "sub event data" in seen and INTERRUPTED not in seen
    assert "stale" not in seen


# ---- ordering and durability --------------------------------------------------------------------------------------------


async def test_deferred_events_are_delivered_in_arrival_order_after_the_result() -> None:
    h, provider = await waiting_harness(subscribed=True)
    await h.step((report("tc-async", "first"), "a"))
    await h.step((sub_event("second"), "b"), (report("tc-async", "third"), "c"))
    assert [d.message_id for d in await h.state.deferred_inputs("t1")] == ["a", "b", "c"]
    provider.then(*text("ok"))
    await h.step((tool_done(), "res-1"))
    history = await h.history("t1")
    assert inline_texts(history) == ["first", "second", "third"]
    assert len(history) - 1 - history.index(next(i for i in history if isinstance(i, EventItem))) == 3


async def test_an_event_in_the_same_batch_as_the_result_lands_after_it() -> None:
    h, provider = await waiting_harness(subscribed=True)
    provider.then(*text("ok"))
    await h.step((sub_event("sub event data"), "ev-1"), (tool_done(), "res-1"))
    history = await h.history("t1")
    result = history[-3]
    assert isinstance(result, ToolResultItem) and result.result.first_text() == "tool done"
    assert inline_texts(history) == ["sub event data"]
    assert INTERRUPTED not in request_text(provider.requests[-1])


async def test_held_events_precede_events_that_arrive_with_or_after_the_result() -> None:
    """Released events keep arrival order: those held earlier come before an event that arrived in the
    result's batch (before or after the result), whatever the batch's shape."""
    h, provider = await waiting_harness(subscribed=True)
    await h.step((sub_event("held 1"), "a"), (sub_event("held 2"), "b"))
    provider.then(*text("ok"))
    await h.step((sub_event("early"), "c"), (tool_done(), "res-1"), (sub_event("late"), "d"))
    history = await h.history("t1")
    assert inline_texts(history) == ["held 1", "held 2", "early", "late"]
    result = next(
        i for i in history if isinstance(i, ToolResultItem) and i.result.first_text() == "tool done"
    )
    assert isinstance(history[history.index(result) + 1], EventItem)


async def test_a_redelivered_deferred_event_is_held_once_and_delivered_once() -> None:
    h, provider = await waiting_harness(subscribed=True)
    await h.step((sub_event("sub event data"), "ev-1"))
    await h.step((sub_event("sub event data"), "ev-1"))
    assert [d.message_id for d in await h.state.deferred_inputs("t1")] == ["ev-1"]
    provider.then(*text("ok"))
    await h.step((tool_done(), "res-1"))
    before = await h.stored("t1")
    requests = len(provider.requests)
    await h.step((sub_event("sub event data"), "ev-1"))  # a late redelivery after it was delivered
    assert await h.stored("t1") == before
    assert len(provider.requests) == requests
    assert inline_texts(await h.history("t1")) == ["sub event data"]


async def test_user_text_still_interrupts_and_releases_deferred_events() -> None:
    notifier = RecordingNotifier()
    h, provider = await waiting_harness(subscribed=True)
    h.config.notifier = notifier
    await h.step((sub_event("sub event data"), "ev-1"))
    provider.then(*text("ok, stopping"))
    await h.step((InputMessage.user_text("t1", "cancel that"), "m2"))
    history = await h.history("t1")
    interrupted = history[-4]
    assert isinstance(interrupted, ToolResultItem) and interrupted.result.id == "tc-async"
    assert interrupted.result.first_text() == INTERRUPTED
    assert isinstance(history[-3], UserItem) and history[-3].text == "cancel that"
    assert inline_texts(history) == ["sub event data"]
    assert history[-1] == AssistantText("ok, stopping")
    assert notifier.cancelled == [("t1", "tc-async")]
    assert await h.state.deferred_inputs("t1") == []
    assert sum(isinstance(e, CompletionStarted) for e in h.observer.of("t1")) >= 1

    # The tool's late result is absorbed.
    requests = len(provider.requests)
    await h.step((tool_done(), "res-1"))
    assert len(provider.requests) == requests


async def test_parent_message_waits_for_the_childs_pending_tool() -> None:
    child = child_thread_id("root", "spawn-1")
    provider = ThreadRoutedProvider()
    provider.then("root", call("spawn_thread", "spawn-1", instructions="dig", child_of=["root"]), Final())
    provider.then("root", *text("spawned"))
    provider.then(child, call("lookup", "tc-child"), Final())
    h = Harness(provider, [RecordingTool()])
    await h.say("root", "go", "m1")

    provider.then("root", call("send_message_to_child", "msg-1", thread_id=child, message="hurry"), Final())
    provider.then("root", *text("told it"))
    await h.send(InputMessage.user_text("root", "tell it to hurry"), "m2")
    await h.run()
    assert [d.message.synthetic for d in await h.state.deferred_inputs(child)] == [
        ParentMessage(tool_call_id="spawn-1")
    ]
    assert len(provider.requests_of(child)) == 1

    provider.then(child, *text("found it, hurrying"))
    await h.send(InputMessage.tool_result(child, ToolResult.text("tc-child", "found")), "res-1")
    await h.run()
    history = await h.history(child)
    assert isinstance(history[-3], ToolResultItem) and history[-3].result.first_text() == "found"
    assert inline_texts(history) == ["Message from parent thread: hurry"]


# ---- passive tools hold nothing back ---------------------------------------------------------------------------------------


async def sleeping_harness() -> tuple[Harness, ReplayProvider, RecordingNotifier]:
    notifier = RecordingNotifier()
    provider = ReplayProvider()
    provider.then(call("subscribe", "sub-1", topic="builds"), Final()).then(*text("watching"))
    h = Harness(provider, [RecordingTool(tool_name="subscribe")])
    h.config.notifier = notifier
    await h.say("t1", "watch builds", "m0")
    await h.step(
        (InputMessage.tool_result("t1", ToolResult.text("sub-1", "subscribed"), subscription=True), "r0")
    )
    provider.then(call("sleep_until_event_or_input", "zz-1"), Final())
    await h.say("t1", "wait for builds", "m1")
    history = await h.history("t1")
    assert isinstance(history[-1], ToolCallItem) and history[-1].call.name == "sleep_until_event_or_input"
    assert h.sender.queue == []  # the sleep never answers by itself
    return h, provider, notifier


async def test_sleep_until_event_or_input_is_interrupted_by_an_event_not_deferred() -> None:
    h, provider, notifier = await sleeping_harness()
    provider.then(*text("a build event!"))
    await h.step((sub_event("build 9 ok"), "ev-1"))
    assert await h.state.deferred_inputs("t1") == []
    history = await h.history("t1")
    interrupted = history[-3]
    assert isinstance(interrupted, ToolResultItem) and interrupted.result.id == "zz-1"
    assert interrupted.result.first_text() == INTERRUPTED
    assert inline_texts(history) == ["build 9 ok"]
    assert history[-1] == AssistantText("a build event!")
    assert notifier.cancelled == [("t1", "zz-1")]
    assert UserChoiceDismissed(choice_id="zz-1") in h.observer.of("t1")


async def test_sleep_until_event_or_input_is_interrupted_by_the_next_user_text() -> None:
    h, provider, notifier = await sleeping_harness()
    provider.then(*text("hello again"))
    await h.step((InputMessage.user_text("t1", "wake up"), "m2"))
    history = await h.history("t1")
    assert isinstance(history[-3], ToolResultItem) and history[-3].result.first_text() == INTERRUPTED
    assert isinstance(history[-2], UserItem) and history[-2].text == "wake up"
    assert history[-1] == AssistantText("hello again")
    assert notifier.cancelled == [("t1", "zz-1")]


async def test_non_associative_event_during_sleep_goes_to_a_child_and_the_sleep_continues() -> None:
    h, provider, _ = await sleeping_harness()
    before = await h.stored("t1")
    await h.step((sub_event("build 10 failed", associative=False), "ev-1"))
    assert await h.stored("t1") == before  # the sleeping parent is neither woken nor interrupted
    assert [q.message.group_id for q in h.sender.queue] == [derived_id("event-child", "t1", "ev-1")]
    provider.then(*text("looking into build 10"))
    await step_queued(h)
    assert (await h.history(derived_id("event-child", "t1", "ev-1")))[-1] == AssistantText(
        "looking into build 10"
    )


async def test_a_non_associative_event_is_routed_at_once_while_a_tool_runs() -> None:
    """It runs in its own child thread, so holding it back would only delay it."""
    from stepagent.messages import InputMessage, SubscriptionEvent, ToolResult
    from stepagent.providers.base import Final
    from tests.engine.harness import Harness, RecordingTool, ReplayProvider, call, text

    provider = ReplayProvider().then(call("subscribe", "sub-1"), Final())
    h = Harness(provider, [RecordingTool(tool_name="subscribe"), RecordingTool(tool_name="lookup")])
    await h.say("t1", "watch", "m1")
    provider.then(call("lookup", "tc-1"), Final())
    await h.send(InputMessage.tool_result("t1", ToolResult.text("sub-1", "ok"), subscription=True), "r1")
    await h.run()  # t1 now waits for lookup tc-1
    provider.then(*text("child handles the event"))
    event = InputMessage.tool_result(
        "t1", ToolResult.text("sub-1", "build failed"), synthetic=SubscriptionEvent(tool_call_id="sub-1")
    )
    await h.send(event, "e1")
    await h.run()
    assert await h.state.deferred_inputs("t1") == []
    children = [t for t, i in h.conversation.backend.threads.items() if i.parent_id == "t1"]
    assert len(children) == 1
    assert (await h.history(children[0]))[-1].text == "child handles the event"  # type: ignore[union-attr]
