"""Conformance: folding inputs into a thread (prepare) and the step around it, in step mode.

Covers user choices (the prompt surfaced and kept out of history, pending choices kept per thread),
interruption side effects, user-choice dismissal, metadata keyed by the root and ``user_id`` propagation,
duplicate and dropped inputs, closed and unknown threads, and ``subscription: true`` tracking with
``final`` removal.
"""

from __future__ import annotations

from stepagent.events import (
    CompletionStarted,
    InputRejected,
    ToolResultReceived,
    UserChoiceDismissed,
    UserChoiceRequiredEvent,
    UserInput,
)
from stepagent.history_items import AssistantText, EventItem, ToolCallItem, ToolResultItem, UserItem
from stepagent.ids import child_thread_id, derived_id
from stepagent.messages import (
    InputMessage,
    SubscriptionEvent,
    ThreadReport,
    ToolResult,
    UserChoiceRequired,
)
from stepagent.providers.base import Final
from tests.engine.harness import (
    ContextRecordingTool,
    Harness,
    RecordingNotifier,
    RecordingTool,
    ReplayProvider,
    ThreadRoutedProvider,
    call,
    text,
)


def choice(choice_id: str, prompt: str = "Pick one") -> UserChoiceRequired:
    return UserChoiceRequired(
        id=choice_id,
        call_id=f"call-{choice_id}",
        prompt=prompt,
        choices=["yes", "no"],
        default=0,
        response_url=f"https://tools.example.com/choices/{choice_id}",
    )


def choice_message(thread: str, choice_id: str) -> InputMessage:
    return InputMessage(content=choice(choice_id), group_id=thread)


async def pending_call_harness(
    *, notifier: RecordingNotifier | None = None
) -> tuple[Harness, ReplayProvider]:
    """Thread ``t1`` whose history ends with an unanswered async call ``tc-1`` (``lookup``)."""
    provider = ReplayProvider().then(call("lookup", "tc-1", q="x"), Final())
    h = Harness(provider, [RecordingTool()])
    h.config.notifier = notifier
    await h.say("t1", "look it up", "m1")
    return h, provider


# ---- user choices ----------------------------------------------------------------------------------------------


async def test_ep41_user_choice_input_surfaces_the_prompt_and_stays_out_of_history() -> None:
    h = Harness(ReplayProvider())
    results = await h.step((choice_message("t1", "tc-7"), "c1"))
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert h.observer.of("t1") == [UserChoiceRequiredEvent(choice=choice("tc-7"))]
    event = h.observer.of("t1")[0]
    assert isinstance(event, UserChoiceRequiredEvent)
    assert (event.choice.id, event.choice.prompt, event.choice.choices, event.choice.default) == (
        "tc-7",
        "Pick one",
        ["yes", "no"],
        0,
    )
    assert event.choice.response_url == "https://tools.example.com/choices/tc-7"
    assert await h.history("t1") == []


async def test_sy01_pending_choices_are_persisted_per_thread() -> None:
    h = Harness(ReplayProvider())
    results = await h.step((choice_message("t1", "choice-1"), "c1"), (choice_message("t2", "choice-2"), "c2"))
    assert [r.thread_id for r in results] == ["t1", "t2"]
    assert all(r.outcome is not None and not r.outcome.completed for r in results)
    assert await h.state.pending_choices("t1") == [choice("choice-1")]
    assert await h.state.pending_choices("t2") == [choice("choice-2")]
    assert h.observer.of("t1") == [UserChoiceRequiredEvent(choice=choice("choice-1"))]
    assert h.observer.of("t2") == [UserChoiceRequiredEvent(choice=choice("choice-2"))]


async def test_a_second_choice_with_the_same_id_replaces_the_first() -> None:
    h = Harness(ReplayProvider())
    await h.step((choice_message("t1", "tc-1"), "c1"))
    replacement = InputMessage(content=choice("tc-1", prompt="Really?"), group_id="t1")
    await h.step((replacement, "c2"))
    assert await h.state.pending_choices("t1") == [choice("tc-1", prompt="Really?")]


async def test_tool_result_dismisses_the_pending_choice_with_its_id() -> None:
    notifier = RecordingNotifier()
    h, provider = await pending_call_harness(notifier=notifier)
    await h.step((choice_message("t1", "tc-1"), "c1"), (choice_message("t1", "tc-other"), "c2"))
    assert [c.id for c in await h.state.pending_choices("t1")] == ["tc-1", "tc-other"]
    h.observer.take()

    provider.then(*text("thanks"))
    await h.step((InputMessage.tool_result("t1", ToolResult.text("tc-1", "chose yes")), "r1"))
    events = h.observer.of("t1")
    assert events[:2] == [
        ToolResultReceived(segments=[{"type": "text", "content": "chose yes"}]),
        UserChoiceDismissed(choice_id="tc-1"),
    ]
    assert [c.id for c in await h.state.pending_choices("t1")] == ["tc-other"]
    assert notifier.cancelled == []  # answered, not interrupted


# ---- interruption side effects -----------------------------------------------------------------------------------


async def test_user_text_interrupts_a_pending_call_with_all_side_effects() -> None:
    notifier = RecordingNotifier()
    h, provider = await pending_call_harness(notifier=notifier)
    await h.step((choice_message("t1", "tc-1"), "c1"))
    h.observer.take()

    provider.then(*text("stopped"))
    await h.step((InputMessage.user_text("t1", "never mind"), "m2"))
    assert notifier.cancelled == [("t1", "tc-1")]
    assert await h.state.pending_choices("t1") == []
    events = h.observer.of("t1")
    dismissed = events.index(UserChoiceDismissed(choice_id="tc-1"))
    assert events.index(UserInput("never mind")) < dismissed
    assert dismissed < next(i for i, e in enumerate(events) if isinstance(e, CompletionStarted))

    stored = await h.stored("t1")
    assert [m for _, m, _ in stored][2:] == ["tc-1-interrupted", "m2", "t1-m2-completion-0"]
    history = await h.history("t1")
    interrupted = history[2]
    assert isinstance(interrupted, ToolResultItem)
    assert interrupted.result == ToolResult.text("tc-1", "Tool call interrupted by user")
    assert isinstance(history[3], UserItem) and history[3].text == "never mind"
    assert history[4] == AssistantText("stopped")

    # The real result, arriving late, is absorbed: no completion, no change.
    before = await h.stored("t1")
    results = await h.step((InputMessage.tool_result("t1", ToolResult.text("tc-1", "late")), "r1"))
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert await h.stored("t1") == before
    assert await h.state.filter_processed("t1", ["r1"]) == {"r1"}


async def test_interruption_dismissal_is_emitted_even_without_a_pending_choice() -> None:
    h, provider = await pending_call_harness()  # no notifier configured: nothing to notify, no error
    h.observer.take()
    provider.then(*text("ok"))
    await h.step((InputMessage.user_text("t1", "stop"), "m2"))
    assert UserChoiceDismissed(choice_id="tc-1") in h.observer.of("t1")


async def test_interruption_keeps_the_provider_call_id() -> None:
    from stepagent.messages import ToolCall
    from stepagent.providers.base import ToolCallComplete

    with_call_id = ToolCall(id="tc-1", name="lookup", arguments={}, call_id="prov-1")
    provider = ReplayProvider().then(ToolCallComplete(with_call_id), Final()).then(*text("ok"))
    h = Harness(provider, [RecordingTool()])
    await h.say("t1", "go", "m1")
    await h.say("t1", "stop", "m2")
    interrupted = (await h.history("t1"))[2]
    assert isinstance(interrupted, ToolResultItem)
    assert interrupted.result == ToolResult.text("tc-1", "Tool call interrupted by user", call_id="prov-1")


# ---- metadata and user_id -------------------------------------------------------------------------------------------


async def test_metadata_is_keyed_by_the_root_and_user_id_reaches_tools() -> None:
    inspect = ContextRecordingTool()
    child = child_thread_id("root", "spawn-1")
    provider = ThreadRoutedProvider()
    provider.then("root", call("spawn_thread", "spawn-1", instructions="work", child_of=["root"]), Final())
    provider.then("root", *text("spawned"))
    provider.then(child, call("inspect", "ins-1"), Final())
    h = Harness(provider, [inspect])
    await h.send(InputMessage.user_text("root", "go", metadata={"user_id": "u-1", "plan": "pro"}), "m1")
    await h.run()
    assert await h.state.get_metadata("root") == {"user_id": "u-1", "plan": "pro"}
    assert [c.user_id for c in inspect.contexts] == ["u-1"]  # the child's tool sees the root's user
    assert inspect.contexts[0].thread_stack == ["root", child]

    # A child's input with metadata replaces the root's metadata, not a child-scoped copy.
    provider.then(child, call("inspect", "ins-2"), Final())
    await h.send(InputMessage.user_text(child, "again", metadata={"user_id": "u-2"}), "m2")
    await h.run()
    assert await h.state.get_metadata("root") == {"user_id": "u-2"}
    assert await h.state.get_metadata(child) is None
    assert [c.user_id for c in inspect.contexts] == ["u-1", "u-2"]

    # Metadata without a string user_id gives tools no user.
    provider.then("root", call("inspect", "ins-3"), Final())
    await h.send(InputMessage.user_text("root", "three", metadata={"user_id": 7}), "m3")
    await h.run()
    assert inspect.contexts[-1].user_id is None


async def test_metadata_of_a_duplicate_input_is_not_reapplied() -> None:
    h = Harness(ReplayProvider().then(*text("hi")))
    await h.send(InputMessage.user_text("t1", "hello", metadata={"v": 1}), "m1")
    await h.run()
    await h.state.set_metadata("t1", {"v": 2})
    await h.step((InputMessage.user_text("t1", "hello", metadata={"v": 1}), "m1"))
    assert await h.state.get_metadata("t1") == {"v": 2}


# ---- duplicates, closed and unknown threads ---------------------------------------------------------------------------


async def test_duplicate_message_id_is_a_no_op() -> None:
    provider = ReplayProvider().then(*text("hi"))
    h = Harness(provider)
    await h.say("t1", "hello", "m1")
    before = await h.stored("t1")
    h.observer.take()
    results = await h.step((InputMessage.user_text("t1", "hello"), "m1"))
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert len(provider.requests) == 1  # no second completion
    assert await h.stored("t1") == before
    assert not any(isinstance(e, CompletionStarted | UserInput) for e in h.observer.of("t1"))


async def test_duplicate_message_id_within_one_batch_is_folded_once() -> None:
    provider = ReplayProvider().then(*text("hi"))
    h = Harness(provider)
    message = InputMessage.user_text("t1", "hello")
    await h.step((message, "m1"), (message, "m1"))
    assert [type(i) for i in await h.history("t1")] == [UserItem, AssistantText]
    assert len(provider.requests) == 1


async def test_closed_thread_drops_its_inputs() -> None:
    child = child_thread_id("root", "spawn-1")
    provider = ThreadRoutedProvider()
    provider.then("root", call("spawn_thread", "spawn-1", instructions="work", child_of=["root"]), Final())
    provider.then("root", *text("spawned"))
    provider.then(child, call("close_thread", "close-1", thread_id=child), Final())
    provider.then("root", *text("child is done"))
    h = Harness(provider)
    await h.say("root", "go", "m1")
    info = await h.conversation.get_thread(child)
    assert info is not None and info.closed
    before = await h.stored(child)

    for message, message_id in [
        (InputMessage.user_text(child, "are you there?"), "late-1"),
        (InputMessage.tool_result(child, ToolResult.text("close-1", "closed")), "late-2"),
        (
            InputMessage.tool_result(
                child,
                ToolResult.text("", "hello"),
                synthetic=ThreadReport(tool_call_id="x", child_thread_id="y"),
            ),
            "late-3",
        ),
    ]:
        results = await h.step((message, message_id))
        assert results[0].outcome is not None and not results[0].outcome.completed
    assert await h.stored(child) == before
    assert await h.state.filter_processed(child, ["late-1", "late-2", "late-3"]) == set()
    assert len(provider.requests_of(child)) == 1


async def test_non_user_input_for_an_unknown_thread_creates_no_thread_record() -> None:
    h = Harness(ReplayProvider())
    inputs = [
        (InputMessage.tool_result("ghost", ToolResult.text("tc-1", "stale")), "g1"),
        (
            InputMessage.tool_result(
                "ghost",
                ToolResult.text("sub-1", "event"),
                synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=True),
            ),
            "g2",
        ),
        (
            InputMessage.tool_result(
                "ghost",
                ToolResult.text("", "report"),
                synthetic=ThreadReport(tool_call_id="s", child_thread_id="c"),
            ),
            "g3",
        ),
    ]
    results = await h.step(*inputs)
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert await h.conversation.get_thread("ghost") is None
    assert await h.stored("ghost") == []


async def test_user_text_for_an_unknown_thread_creates_it() -> None:
    h = Harness(ReplayProvider().then(*text("welcome")))
    await h.say("brand-new", "hello", "m1")
    info = await h.conversation.get_thread("brand-new")
    assert info is not None and info.parent_id is None and info.root_id == "brand-new"


async def test_event_for_a_call_not_in_the_thread_is_refused_with_a_reason() -> None:
    h = Harness(ReplayProvider().then(*text("hi")))
    await h.say("t1", "hello", "m1")
    report = InputMessage.tool_result(
        "t1", ToolResult.text("", "report"), synthetic=ThreadReport(tool_call_id="nope", child_thread_id="c")
    )
    results = await h.step((report, "r1"))
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert any(isinstance(e, InputRejected) and "nope" in e.reason for e in h.observer.of("t1"))
    assert len(await h.history("t1")) == 2


# ---- subscription tracking -------------------------------------------------------------------------------------------


async def subscribed_harness() -> tuple[Harness, ReplayProvider]:
    provider = ReplayProvider().then(call("subscribe", "sub-1", topic="builds"), Final())
    h = Harness(provider, [RecordingTool(tool_name="subscribe")])
    await h.say("t1", "watch builds", "m1")
    provider.then(*text("watching"))
    start = InputMessage.tool_result("t1", ToolResult.text("sub-1", "subscribed"), subscription=True)
    await h.step((start, "r1"))
    return h, provider


async def test_subscription_true_result_tracks_the_call() -> None:
    h, _ = await subscribed_harness()
    assert await h.state.active_subscriptions("t1") == {"sub-1"}
    result = (await h.history("t1"))[2]
    assert isinstance(result, ToolResultItem) and result.result.id == "sub-1"


async def test_result_without_subscription_flag_tracks_nothing() -> None:
    provider = ReplayProvider().then(call("lookup", "tc-1"), Final()).then(*text("ok"))
    h = Harness(provider, [RecordingTool()])
    await h.say("t1", "go", "m1")
    await h.step((InputMessage.tool_result("t1", ToolResult.text("tc-1", "done")), "r1"))
    assert await h.state.active_subscriptions("t1") == set()


async def test_a_dropped_subscription_result_tracks_nothing() -> None:
    provider = ReplayProvider().then(call("lookup", "tc-1"), Final())
    h = Harness(provider, [RecordingTool()])
    await h.say("t1", "go", "m1")
    stale = InputMessage.tool_result("t1", ToolResult.text("tc-other", "x"), subscription=True)
    await h.step((stale, "r1"))
    assert await h.state.active_subscriptions("t1") == set()


async def test_final_associative_event_is_inlined_and_ends_the_subscription() -> None:
    h, provider = await subscribed_harness()
    provider.then(*text("got it"))
    event = InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "build 8 ok"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=True, final=True),
    )
    await h.step((event, "e1"))
    assert await h.state.active_subscriptions("t1") == set()
    item = (await h.history("t1"))[-2]
    assert isinstance(item, EventItem) and item.tool_call_id == "sub-1" and item.child_thread_id is None
    assert item.invocation is not None
    assert item.invocation.arguments == {
        "original_args": {"topic": "builds"},
        "original_tool_call_id": "sub-1",
        "original_tool_name": "subscribe",
    }
    assert item.result.id == item.invocation.id == derived_id("event", "t1", "e1")


async def test_non_final_associative_event_keeps_the_subscription() -> None:
    h, provider = await subscribed_harness()
    provider.then(*text("noted"))
    event = InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "build 8 running"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=True),
    )
    await h.step((event, "e1"))
    assert await h.state.active_subscriptions("t1") == {"sub-1"}


async def test_final_non_associative_event_is_routed_to_a_child_and_ends_the_subscription() -> None:
    h, _ = await subscribed_harness()
    before = await h.stored("t1")
    event = InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "last build"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", final=True),
    )
    results = await h.step((event, "e1"))
    assert results[0].outcome is not None and not results[0].outcome.completed
    assert await h.state.active_subscriptions("t1") == set()
    assert await h.stored("t1") == before  # the parent's history is untouched
    child = derived_id("event-child", "t1", "e1")
    assert [q.message.group_id for q in h.sender.queue] == [child]

    # A later event for the ended subscription is refused, with the reason.
    late = InputMessage.tool_result(
        "t1", ToolResult.text("sub-1", "after the end"), synthetic=SubscriptionEvent(tool_call_id="sub-1")
    )
    h.sender.drain()
    await h.step((late, "e2"))
    assert h.sender.queue == []
    assert any(isinstance(e, InputRejected) and "sub-1" in e.reason for e in h.observer.of("t1"))


async def test_event_for_an_untracked_call_is_dropped_even_if_the_call_is_in_history() -> None:
    provider = ReplayProvider().then(call("subscribe", "sub-1"), Final()).then(*text("ok"))
    h = Harness(provider, [RecordingTool(tool_name="subscribe")])
    await h.say("t1", "watch", "m1")
    await h.step((InputMessage.tool_result("t1", ToolResult.text("sub-1", "subscribed")), "r1"))
    before = await h.stored("t1")
    event = InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "x"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=True),
    )
    await h.step((event, "e1"))
    assert await h.stored("t1") == before
    assert isinstance((await h.history("t1"))[1], ToolCallItem)
