"""Conformance: the built-in thread and subscription tools, and the exact texts the model and other threads get.

Validation texts are checked exactly, both by calling a tool's ``execute`` directly (what it sends, to
whom, with which dedup id) and end to end (what the model sees). Also ``close_thread`` without its id
(an error result for that call) and the spawned subscription-event child: its seeded history, the seed
message, and the wording of its reports.
"""

from __future__ import annotations

import json
from typing import Any

from stepagent import texts
from stepagent.core.agents import system_prompt
from stepagent.events import SubscriptionEventReceived, ToolCallStarted, ToolResultReceived
from stepagent.history_items import (
    AssistantText,
    EventItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    encode_item,
)
from stepagent.ids import child_thread_id, derived_id
from stepagent.messages import (
    InputMessage,
    ParentMessage,
    SubscriptionEvent,
    ThreadReport,
    ToolCall,
    ToolResult,
)
from stepagent.providers.base import Final, ToolCallComplete
from stepagent.stores.base import ThreadKind
from stepagent.tools.base import Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.sleep import Sleep, SleepUntil
from stepagent.tools.subscriptions import SleepUntilEventOrInput
from stepagent.tools.threads import CloseThread, ReportToParent, SendMessageToChild
from tests.engine.harness import (
    Harness,
    RecordingNotifier,
    RecordingTool,
    ReplayProvider,
    ThreadRoutedProvider,
    call,
    sent_to,
    text,
    tool_context,
)

CHILD = child_thread_id("root", "spawn-1")


def result_text(item: object) -> str | None:
    assert isinstance(item, ToolResultItem), item
    return item.result.first_text()


async def spawned(h: Harness) -> None:
    """Create ``CHILD`` under ``root`` through the stores, as spawn_thread would (no model involved)."""
    await h.conversation.spawn_thread(
        "root", child_id=CHILD, spawn_tool_call_id="spawn-1", kind=ThreadKind.CHILD
    )


def cancel(call_id: str, **arguments: Any) -> ToolCallComplete:
    """A ``cancel_subscription`` call (its own argument is named ``tool_call_id``)."""
    return ToolCallComplete(ToolCall(id=call_id, name="cancel_subscription", arguments=arguments))


def spawn_provider() -> ThreadRoutedProvider:
    """``root`` spawns ``CHILD`` (call ``spawn-1``) and says "spawned"."""
    provider = ThreadRoutedProvider()
    provider.then(
        "root", call("spawn_thread", "spawn-1", instructions="review a.ts", child_of=["root"]), Final()
    )
    provider.then("root", *text("spawned"))
    return provider


# ---- the tool list ------------------------------------------------------------------------------------------------


def test_builtin_tools_in_reference_order_with_their_kinds() -> None:
    tools = builtin_tools()
    assert [(t.name, t.inline, t.passive) for t in tools] == [
        ("spawn_thread", True, False),
        ("report_to_parent", False, False),
        ("close_thread", False, False),
        ("send_message_to_child", False, False),
        ("cancel_subscription", True, False),
        ("sleep_until_event_or_input", False, True),
    ]
    assert SleepUntilEventOrInput().display({}) == "Sleeping until event or input"


# ---- spawn_thread ---------------------------------------------------------------------------------------------------


async def test_spawn_thread_creates_the_child_seeds_it_and_answers_the_parent() -> None:
    provider = spawn_provider()
    provider.then(CHILD, *text("on it"))
    h = Harness(provider)
    await h.say("root", "review a.ts", "m1")

    parent = await h.history("root")
    expected = (
        f"Child thread is successfully spawned and has ID: {CHILD}. You will be notified automatically when "
        "the child has anything to report. Make sure that you **do not** do the task assigned to the child "
        "thread."
    )
    assert result_text(parent[2]) == expected
    assert expected.split("has ID: ")[1].split(".")[0] == CHILD  # how clients extract the id
    assert parent[3] == AssistantText("spawned")

    info = await h.conversation.get_thread(CHILD)
    assert info is not None
    assert (info.parent_id, info.root_id, info.kind, info.spawn_tool_call_id, info.spawn_order) == (
        "root",
        "root",
        ThreadKind.CHILD,
        "spawn-1",
        2,  # the child inherits the user message and the spawn call, not the parent's sync result
    )
    [(dedup, seed)] = sent_to(h, CHILD)
    assert dedup == "spawn-1" and seed.synthetic is None
    assert seed.content == ToolResult.text(
        "spawn-1",
        f"You are now INSIDE the thread that you requested to create. Your thread ID is {CHILD}. Your next "
        "task is to exactly follow these instructions: review a.ts\n. Start by repeating to yourself the "
        "instructions, ignoring thinking from the parent context. Make sure to not be confused by the "
        "parent context. If the parent was planning to spawn more threads, you should not.",
    )
    [child_request] = provider.requests_of(CHILD)
    assert [type(i) for i in child_request.history] == [UserItem, ToolCallItem, ToolResultItem]
    assert child_request.thread_stack == ["root", CHILD]
    # The child sends its parent's system prompt (it learns its id from the seed above), so its first
    # request extends the parent's cached prefix.
    assert child_request.system == provider.requests_of("root")[0].system
    assert child_request.system.endswith(texts.THREAD_SUFFIX.format(root_thread_id="root"))
    assert CHILD not in child_request.system


async def test_spawn_thread_passes_the_provider_call_id_to_the_seed() -> None:
    provider = ThreadRoutedProvider()
    spawn = ToolCall(
        id="spawn-1",
        name="spawn_thread",
        arguments={"instructions": "x", "child_of": ["root"]},
        call_id="p-1",
    )
    provider.then("root", ToolCallComplete(spawn), Final()).then("root", *text("ok"))
    h = Harness(provider)
    await h.step((InputMessage.user_text("root", "go"), "m1"))
    [(_, seed)] = sent_to(h, CHILD)
    assert isinstance(seed.content, ToolResult) and seed.content.call_id == "p-1"
    assert (await h.history("root"))[2] == ToolResultItem(
        result=ToolResult.text("spawn-1", texts.SPAWN_OK.format(child=CHILD), call_id="p-1")
    )


async def test_spawn_thread_child_of_mismatch_is_rejected_with_rust_debug_lists() -> None:
    provider = ReplayProvider()
    provider.then(call("spawn_thread", "s1", instructions="x", child_of=["wrong", 'q"uote']), Final())
    provider.then(call("spawn_thread", "s2", instructions="x"), Final())
    provider.then(*text("ok"))
    h = Harness(provider)
    await h.say("root", "go", "m1")
    history = await h.history("root")
    assert result_text(history[2]) == (
        'Error: child_of ["wrong", "q\\"uote"] does not match the actual thread stack ["root"]. You may be '
        "confused and think you are in the parent thread, but you are not. You are in thread root. Do NOT "
        "spawn threads — focus on your assigned task."
    )
    assert result_text(history[4]) == (
        'Error: child_of [] does not match the actual thread stack ["root"]. You may be confused and think '
        "you are in the parent thread, but you are not. You are in thread root. Do NOT spawn threads — focus "
        "on your assigned task."
    )
    assert [t for t, i in h.conversation.backend.threads.items() if i.parent_id == "root"] == []
    assert [q.message_id for q in h.sender.sent] == ["m1"]  # only the user's own message


async def test_spawn_thread_from_a_child_with_the_parents_stack_is_rejected() -> None:
    provider = spawn_provider()
    provider.then(CHILD, call("spawn_thread", "s2", instructions="more", child_of=["root"]), Final())
    provider.then(CHILD, *text("ok, I will do it myself"))
    h = Harness(provider)
    await h.say("root", "go", "m1")
    child_history = await h.history(CHILD)
    assert result_text(child_history[-2]) == (
        f'Error: child_of ["root"] does not match the actual thread stack ["root", "{CHILD}"]. You may be '
        f"confused and think you are in the parent thread, but you are not. You are in thread {CHILD}. Do "
        "NOT spawn threads — focus on your assigned task."
    )
    assert [t for t, i in h.conversation.backend.threads.items() if i.parent_id == CHILD] == []


async def test_spawn_thread_without_instructions_is_an_error_result() -> None:
    provider = ReplayProvider().then(call("spawn_thread", "s1", child_of=["root"]), Final()).then(*text("ok"))
    h = Harness(provider)
    await h.say("root", "go", "m1")
    assert result_text((await h.history("root"))[2]) == "Error: instructions is required"
    assert [t for t, i in h.conversation.backend.threads.items() if i.parent_id == "root"] == []


# ---- report_to_parent ------------------------------------------------------------------------------------------------


async def test_report_to_parent_sends_the_report_and_an_ack() -> None:
    h = Harness(ReplayProvider())
    await spawned(h)
    await ReportToParent().execute({"report": "found bug"}, tool_context(h, CHILD, "rep-1", call_id="p-9"))
    [(dedup, report)] = sent_to(h, "root")
    assert dedup == "rep-1"
    assert report.content == ToolResult.text("", "Report from child thread: found bug")
    assert report.synthetic == ThreadReport(tool_call_id="spawn-1", child_thread_id=CHILD)
    [(ack_dedup, ack)] = sent_to(h, CHILD)
    assert ack_dedup == "rep-1" and ack.synthetic is None
    assert ack.content == ToolResult.text("rep-1", "Report sent to parent thread.", call_id="p-9")


async def test_report_to_parent_validation_errors() -> None:
    h = Harness(ReplayProvider())
    await spawned(h)
    await ReportToParent().execute({}, tool_context(h, CHILD, "rep-1"))
    await ReportToParent().execute({"report": 42}, tool_context(h, CHILD, "rep-2"))
    await ReportToParent().execute({"report": "hi"}, tool_context(h, "root", "rep-3"))
    await ReportToParent().execute({"report": "hi"}, tool_context(h, "lonely", "rep-4"))  # no record at all
    assert [(d, m.content) for d, m in sent_to(h, CHILD)] == [
        ("rep-1", ToolResult.text("rep-1", "Error: report is required")),
        ("rep-2", ToolResult.text("rep-2", "Error: report is required")),
    ]
    assert [(d, m.content) for d, m in sent_to(h, "root")] == [
        ("rep-3", ToolResult.text("rep-3", "Error: No parent thread found — this is a root thread"))
    ]
    assert [(d, m.content) for d, m in sent_to(h, "lonely")] == [
        ("rep-4", ToolResult.text("rep-4", "Error: No parent thread found — this is a root thread"))
    ]


async def test_report_round_trip_parent_sees_an_injected_event() -> None:
    provider = spawn_provider()
    provider.then(CHILD, call("report_to_parent", "rep-1", report="found bug"), Final())
    provider.then("root", *text("noted"))
    provider.then(CHILD, *text("reported"))
    h = Harness(provider)
    await h.say("root", "go", "m1")
    parent = await h.history("root")
    event = parent[-2]
    assert isinstance(event, EventItem)
    assert event.result.first_text() == "Report from child thread: found bug"
    assert (event.tool_call_id, event.child_thread_id) == ("spawn-1", CHILD)
    assert event.invocation is not None and event.invocation.name == "receive_event__injected"
    assert event.invocation.arguments == {
        "original_args": {"instructions": "review a.ts", "child_of": ["root"]},
        "original_tool_call_id": "spawn-1",
        "original_tool_name": "spawn_thread",
    }
    assert parent[-1] == AssistantText("noted")
    assert SubscriptionEventReceived(
        name=f"Report from child thread {CHILD}", text="Report from child thread: found bug"
    ) in h.observer.of("root")
    child = await h.history(CHILD)
    assert result_text(child[-2]) == "Report sent to parent thread."


# ---- close_thread ------------------------------------------------------------------------------------------------------


async def test_ep39_close_thread_missing_id_enqueues_an_error_result() -> None:
    h = Harness(ReplayProvider())
    await spawned(h)
    context = tool_context(h, CHILD, "tc-close", call_id="call-close", stack=["root", CHILD])
    assert await CloseThread().execute({}, context) is None
    [(dedup, message)] = [(q.message_id, q.message) for q in h.sender.sent]
    assert dedup == "tc-close" and message.group_id == CHILD and message.synthetic is None
    assert message.content == ToolResult.text(
        "tc-close", "Error: thread_id is required", call_id="call-close"
    )
    info = await h.conversation.get_thread(CHILD)
    assert info is not None and not info.closed


async def test_close_thread_validation_errors() -> None:
    h = Harness(ReplayProvider())
    await spawned(h)
    await CloseThread().execute({"thread_id": "other"}, tool_context(h, CHILD, "c1"))
    await CloseThread().execute({"thread_id": "root"}, tool_context(h, "root", "c2"))
    assert [(d, m.content) for d, m in sent_to(h, CHILD)] == [
        (
            "c1",
            ToolResult.text(
                "c1",
                f"Error: the provided thread ID to close other does not match the current thread ID {CHILD}",
            ),
        )
    ]
    assert [(d, m.content) for d, m in sent_to(h, "root")] == [
        (
            "c2",
            ToolResult.text("c2", "Error: cannot close the root thread. Only child threads can be closed."),
        )
    ]
    assert not any(i.closed for i in h.conversation.backend.threads.values())


async def test_close_thread_with_and_without_a_report() -> None:
    notifier = RecordingNotifier()
    h = Harness(ReplayProvider())
    h.config.notifier = notifier
    other = child_thread_id("root", "spawn-2")
    await spawned(h)
    await h.conversation.spawn_thread(
        "root", child_id=other, spawn_tool_call_id="spawn-2", kind=ThreadKind.CHILD
    )

    await CloseThread().execute(
        {"thread_id": CHILD, "report_to_parent": "done"}, tool_context(h, CHILD, "c1")
    )
    await CloseThread().execute({"thread_id": other}, tool_context(h, other, "c2"))
    reports = sent_to(h, "root")
    assert [(d, m.content, m.synthetic) for d, m in reports] == [
        (
            "c1",
            ToolResult.text(
                "", f"Child thread with ID {CHILD} has shut down. Report from child thread: done"
            ),
            ThreadReport(tool_call_id="spawn-1", child_thread_id=CHILD),
        ),
        (
            "c2",
            ToolResult.text("", f"Child thread with ID {other} has shut down"),
            ThreadReport(tool_call_id="spawn-2", child_thread_id=other),
        ),
    ]
    assert sent_to(h, CHILD) == [] and sent_to(h, other) == []  # no result for close_thread, ever
    for thread in (CHILD, other):
        info = await h.conversation.get_thread(thread)
        assert info is not None and info.closed
    assert notifier.closed == [CHILD, other]


async def test_close_thread_end_to_end_parent_hears_and_child_goes_quiet() -> None:
    provider = spawn_provider()
    provider.then(
        CHILD, call("close_thread", "close-1", thread_id=CHILD, report_to_parent="all fixed"), Final()
    )
    provider.then("root", *text("great"))
    h = Harness(provider)
    await h.say("root", "go", "m1")
    parent = await h.history("root")
    assert isinstance(parent[-2], EventItem)
    assert parent[-2].result.first_text() == (
        f"Child thread with ID {CHILD} has shut down. Report from child thread: all fixed"
    )
    child = await h.history(CHILD)
    assert isinstance(child[-1], ToolCallItem) and child[-1].call.name == "close_thread"
    assert await h.state.open_intents(CHILD) == []


# ---- send_message_to_child ----------------------------------------------------------------------------------------------


async def test_send_message_to_child_sends_a_parent_message_and_an_ack() -> None:
    h = Harness(ReplayProvider())
    await spawned(h)
    await SendMessageToChild().execute(
        {"thread_id": CHILD, "message": "also check b.ts"}, tool_context(h, "root", "msg-1", call_id="p-1")
    )
    [(dedup, message)] = sent_to(h, CHILD)
    assert dedup == "msg-1"
    assert message.content == ToolResult.text("", "Message from parent thread: also check b.ts")
    assert message.synthetic == ParentMessage(tool_call_id="spawn-1")
    [(ack_dedup, ack)] = sent_to(h, "root")
    assert ack_dedup == "msg-1"
    assert ack.content == ToolResult.text("msg-1", "Message sent to child thread.", call_id="p-1")


async def test_send_message_to_child_validation_errors() -> None:
    h = Harness(ReplayProvider())
    await spawned(h)
    stranger = child_thread_id("other-root", "spawn-x")
    await h.conversation.spawn_thread(
        "other-root", child_id=stranger, spawn_tool_call_id="spawn-x", kind=ThreadKind.CHILD
    )
    calls: list[tuple[str, dict[str, Any]]] = [
        ("e1", {"message": "hi"}),
        ("e2", {"thread_id": CHILD}),
        ("e3", {"thread_id": "nobody", "message": "hi"}),
        ("e4", {"thread_id": "other-root", "message": "hi"}),
        ("e5", {"thread_id": stranger, "message": "hi"}),
    ]
    for call_id, arguments in calls:
        await SendMessageToChild().execute(arguments, tool_context(h, "root", call_id))
    assert [(d, m.content.first_text()) for d, m in sent_to(h, "root")] == [  # type: ignore[union-attr]
        ("e1", "Error: thread_id is required"),
        ("e2", "Error: message is required"),
        ("e3", "Error: Child thread not found or has no parent"),
        ("e4", "Error: Child thread not found or has no parent"),
        ("e5", f"Error: thread {stranger} is not a child of the current thread root"),
    ]
    assert sent_to(h, CHILD) == [] and sent_to(h, stranger) == []


async def test_parent_message_is_injected_into_the_child_against_its_spawn_call() -> None:
    provider = spawn_provider()
    provider.then(CHILD, *text("working"))
    h = Harness(provider)
    await h.say("root", "go", "m1")
    provider.then("root", call("send_message_to_child", "msg-1", thread_id=CHILD, message="hurry"), Final())
    provider.then(CHILD, *text("hurrying"))
    provider.then("root", *text("told it"))
    await h.say("root", "tell it to hurry", "m2")
    child = await h.history(CHILD)
    event = child[-2]
    assert isinstance(event, EventItem) and event.tool_call_id == "spawn-1" and event.child_thread_id is None
    assert event.result.first_text() == "Message from parent thread: hurry"
    assert event.invocation is not None and event.invocation.arguments["original_tool_name"] == "spawn_thread"
    assert child[-1] == AssistantText("hurrying")
    assert result_text((await h.history("root"))[-2]) == "Message sent to child thread."


# ---- cancel_subscription -----------------------------------------------------------------------------------------------


async def test_cancel_subscription_texts_and_effects() -> None:
    notifier = RecordingNotifier()
    provider = ReplayProvider().then(call("subscribe", "sub-1", topic="builds"), Final())
    h = Harness(provider, [RecordingTool(tool_name="subscribe")])
    h.config.notifier = notifier
    await h.say("t1", "watch", "m1")
    provider.then(*text("watching"))
    await h.step((InputMessage.tool_result("t1", ToolResult.text("sub-1", "ok"), subscription=True), "r1"))
    assert await h.state.active_subscriptions("t1") == {"sub-1"}

    provider.then(cancel("cs-1"), Final())
    provider.then(cancel("cs-2", tool_call_id="sub-404"), Final())
    provider.then(cancel("cs-3", tool_call_id="sub-1"), Final())
    provider.then(cancel("cs-4", tool_call_id="sub-1"), Final())
    provider.then(*text("stopped watching"))
    await h.say("t1", "stop watching", "m2")
    results = [result_text(i) for i in await h.history("t1") if isinstance(i, ToolResultItem)][1:]
    assert results == [
        "Error: tool_call_id is required",
        "Error: no active subscription found for tool call ID 'sub-404'",
        "Subscription 'sub-1' cancelled successfully.",
        "Error: no active subscription found for tool call ID 'sub-1'",
    ]
    assert notifier.cancelled == [("t1", "sub-1")]
    assert await h.state.active_subscriptions("t1") == set()
    started = [e.name for e in h.observer.of("t1") if isinstance(e, ToolCallStarted)]
    assert started.count("cancel_subscription") == 4
    assert ToolResultReceived(
        segments=[{"type": "text", "content": "Subscription 'sub-1' cancelled successfully."}]
    ) in h.observer.of("t1")


async def test_only_the_subscribing_thread_can_cancel_its_subscription() -> None:
    provider = spawn_provider()
    provider.then(CHILD, cancel("cs-1", tool_call_id="sub-1"), Final())
    provider.then(CHILD, *text("cannot"))
    h = Harness(provider)
    await h.state.add_subscription("root", "sub-1")
    await h.say("root", "go", "m1")
    assert result_text((await h.history(CHILD))[-2]) == (
        "Error: no active subscription found for tool call ID 'sub-1'"
    )
    assert await h.state.active_subscriptions("root") == {"sub-1"}


# ---- the spawned subscription-event child -------------------------------------------------------------------------------


async def subscribed(provider: ThreadRoutedProvider) -> Harness:
    """``t1`` subscribed with ``sub-1`` (``subscribe{topic: builds}``), answered "watching"."""
    provider.then("t1", call("subscribe", "sub-1", topic="builds"), Final())
    provider.then("t1", *text("watching"))
    h = Harness(provider, [RecordingTool(tool_name="subscribe")])
    await h.say("t1", "watch builds", "m1")
    await h.send(
        InputMessage.tool_result("t1", ToolResult.text("sub-1", "subscribed"), subscription=True), "r1"
    )
    await h.run()
    return h


def build_event(final: bool = False) -> InputMessage:
    return InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "build 7 failed"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", final=final),
    )


async def test_event_child_has_the_exact_seeded_history_and_seed_message() -> None:
    event_child = derived_id("event-child", "t1", "e1")
    spawn_call = derived_id("event-spawn", "t1", "e1")
    event_call = derived_id("event-call", "t1", "e1")
    provider = ThreadRoutedProvider()
    h = await subscribed(provider)
    parent_before = await h.stored("t1")

    await h.send(build_event(), "e1")
    await h.step(*[(q.message, q.message_id) for q in h.sender.drain()])
    assert await h.stored("t1") == parent_before

    info = await h.conversation.get_thread(event_child)
    assert info is not None
    assert (info.parent_id, info.kind, info.spawn_tool_call_id, info.spawn_order) == (
        "t1",
        ThreadKind.SUBSCRIPTION_EVENT,
        "sub-1",
        4,
    )
    seeded = [
        (
            ToolCallItem(
                call=ToolCall(
                    id=spawn_call,
                    name="spawn_thread",
                    arguments={"instructions": "Spawning thread to process incoming event."},
                )
            ),
            f"{spawn_call}-spawn-call",
        ),
        (
            ToolResultItem(
                result=ToolResult.text(
                    spawn_call,
                    f"You are now INSIDE the thread for processing the single event above. Your thread ID is "
                    f"{event_child}, the parent which is still subscribing is t1. Process the single "
                    "subscription event above, report to the parent if appropriate, then close the thread "
                    "after processing this event. Your outputs are NOT VISIBLE to the user, if you want to "
                    "show them something, send a report to your parent.",
                )
            ),
            f"{spawn_call}-spawn-result",
        ),
        (
            ToolCallItem(
                call=ToolCall(
                    id=event_call,
                    name="receive_event__injected",
                    arguments={
                        "original_tool_name": "subscribe",
                        "original_tool_call_id": "sub-1",
                        "original_args": {"topic": "builds"},
                    },
                )
            ),
            f"{event_call}-event-call",
        ),
    ]
    assert await h.stored(event_child) == [(n + 1, m, encode_item(i)) for n, (i, m) in enumerate(seeded)]

    [(dedup, seed)] = sent_to(h, event_child)
    assert dedup == event_call
    assert seed.content == ToolResult.text(event_call, "build 7 failed")
    assert seed.synthetic is None and not seed.subscription

    # A redelivery of the event neither spawns another child nor re-seeds this one.
    threads = dict(h.conversation.backend.threads)
    await h.step((build_event(), "e1"))
    assert h.conversation.backend.threads == threads
    assert len(sent_to(h, event_child)) == 1

    # The child's first step accepts the event as the answer to its seeded call and runs a completion.
    provider.then(event_child, *text("looking"))
    await h.run()
    [request] = provider.requests_of(event_child)
    assert len(request.history) == 4 + 3 + 1
    assert request.history[-1] == ToolResultItem(result=ToolResult.text(event_call, "build 7 failed"))
    assert (await h.history(event_child))[-1] == AssistantText("looking")


async def test_event_child_reports_and_closes_with_subscription_wording() -> None:
    event_child = derived_id("event-child", "t1", "e1")
    provider = ThreadRoutedProvider()
    h = await subscribed(provider)
    provider.then(event_child, call("report_to_parent", "rep-1", report="flaky test"), Final())
    provider.then("t1", *text("noted"))
    provider.then(
        event_child,
        call("close_thread", "close-1", thread_id=event_child, report_to_parent="re-ran, green now"),
        Final(),
    )
    provider.then("t1", *text("good"))
    await h.send(build_event(), "e1")
    await h.run()

    events = [i for i in await h.history("t1") if isinstance(i, EventItem)]
    assert [e.result.first_text() for e in events] == [
        "Report from temporary child thread created to process a subscription event:\nflaky test",
        f"An event from your subscription sub-1 was processed by a child thread {event_child}. The "
        "subscription remains active. Report from the child:\nre-ran, green now",
    ]
    assert all(e.tool_call_id == "sub-1" and e.child_thread_id == event_child for e in events)
    assert events[0].invocation is not None
    assert events[0].invocation.arguments["original_tool_name"] == "subscribe"
    assert await h.state.active_subscriptions("t1") == {"sub-1"}
    info = await h.conversation.get_thread(event_child)
    assert info is not None and info.closed


async def test_event_child_closing_without_a_report_sends_nothing() -> None:
    event_child = derived_id("event-child", "t1", "e1")
    provider = ThreadRoutedProvider()
    h = await subscribed(provider)
    before = await h.stored("t1")
    provider.then(event_child, call("close_thread", "close-1", thread_id=event_child), Final())
    await h.send(build_event(), "e1")
    await h.run()
    assert [d for d, _ in sent_to(h, "t1") if d == "close-1"] == []
    assert await h.stored("t1") == before
    assert len(provider.requests_of("t1")) == 2  # nothing woke the parent
    info = await h.conversation.get_thread(event_child)
    assert info is not None and info.closed


async def test_event_child_close_validation_uses_close_thread_texts() -> None:
    h = Harness(ReplayProvider())
    await h.conversation.spawn_thread(
        "t1", child_id="ev", spawn_tool_call_id="sub-1", kind=ThreadKind.SUBSCRIPTION_EVENT
    )
    await ReportToParent().execute({"report": "r"}, tool_context(h, "ev", "rep-1"))
    await CloseThread().execute({"thread_id": "ev", "report_to_parent": ""}, tool_context(h, "ev", "c1"))
    assert [(d, m.content.first_text(), m.synthetic) for d, m in sent_to(h, "t1")] == [  # type: ignore[union-attr]
        (
            "rep-1",
            "Report from temporary child thread created to process a subscription event:\nr",
            ThreadReport(tool_call_id="sub-1", child_thread_id="ev"),
        )
    ]


def test_the_built_ins_and_their_guidance_stay_cheap() -> None:
    # Every request carries the offered built-ins and the runtime's guidance, so their size is paid on each
    # one. The eight built-ins with the default prompt were ~1,095 tokens (UTF-8 bytes / 4) before their
    # texts were tightened and are ~812 now; the budget keeps them from growing back.
    tools = [*builtin_tools(), Sleep(), SleepUntil()]
    wire = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]
    prompt = system_prompt(None, Toolset.of(tools), root_thread_id="0" * 26)
    size = len(json.dumps(wire, separators=(",", ":")).encode()) + len(prompt.encode())
    assert len(tools) == 8
    assert size / 4 <= 850, size / 4
