"""Rewind: pair-safe cuts, cleanup of what started past the cut, processed inputs, races (in memory)."""

from __future__ import annotations

from typing import Any

import pytest

from stepagent.core.history import HistoryManager
from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import AssistantText, EventItem, Summary, ToolCallItem, ToolResultItem, UserItem
from stepagent.lifecycle import LifecycleError, rewind_thread
from stepagent.messages import InputMessage, ThreadReport, ToolCall, ToolResult
from stepagent.providers.base import Final
from stepagent.stores.base import Commit, DeferredInput, DispatchIntent, Rewind, ThreadInfo, ThreadKind
from stepagent.stores.memory import InMemoryConversationStore, memory_stores
from tests.engine.harness import Harness, RecordingTool, ReplayProvider, call, text
from tests.lifecycle import build_tree, commit, result, transcript, uid, user
from tests.lifecycle import call as call_item


async def orders(conv: InMemoryConversationStore, thread: str) -> list[str]:
    out = []
    async for row in conv.load_rows(thread):
        item = row.item
        if isinstance(item, ToolCallItem):
            out.append(f"call {item.call.id}")
        elif isinstance(item, ToolResultItem):
            out.append(f"result {item.result.id}")
        elif isinstance(item, UserItem):
            out.append(f"user {item.text}")
        elif isinstance(item, EventItem):
            out.append(f"event {item.result.id}")
        else:
            out.append(type(item).__name__)
    return out


# ---- where the cut lands ---------------------------------------------------------------------------------


async def test_a_cut_inside_a_pair_moves_to_the_pair_start() -> None:
    conv, state = memory_stores()
    thread = uid()
    await commit(
        conv, thread, (user("a"), "m1"), (call_item("c1"), "x1"), (result("c1", "r"), "c1"), (user("b"), "m2")
    )
    outcome = await rewind_thread(conv, state, thread, 2)
    assert (outcome.requested, outcome.effective, outcome.dropped_rows) == (2, 1, 3)
    assert await orders(conv, thread) == ["user a"]
    # At a pair's end nothing moves.
    await commit(conv, thread, (call_item("c2"), "x2"), (result("c2", "r"), "c2"), (user("c"), "m3"))
    outcome = await rewind_thread(conv, state, thread, 3)
    assert outcome.effective == 3 and await orders(conv, thread) == ["user a", "call c2", "result c2"]


async def test_interleaved_pairs_move_the_cut_until_no_pair_is_split() -> None:
    conv, state = memory_stores()
    thread = uid()
    rows = [(user("u"), "m1"), (call_item("A"), "x1"), (call_item("B"), "x2")]
    rows += [(result("A", "ra"), "A"), (result("B", "rb"), "B"), (user("v"), "m2")]
    await commit(conv, thread, *rows)
    outcome = await rewind_thread(conv, state, thread, 4)  # keeps A's result, cuts B's: B then A move it
    assert outcome.effective == 1
    assert await orders(conv, thread) == ["user u"]


async def test_event_pairs_are_one_row_and_events_answering_a_call_are_answers() -> None:
    conv, state = memory_stores()
    thread = uid()
    injected = ToolCall(id="inv-1", name="receive_event__injected")
    self_contained = EventItem(ToolResult.text("inv-1", "news"), tool_call_id="sub", invocation=injected)
    answering = EventItem(ToolResult.text("sleep-1", "woke up"), tool_call_id="sleep-1")
    rows = [
        (user("u"), "m1"),
        (self_contained, "e1"),
        (call_item("sleep-1", "sleep"), "x1"),
        (answering, "e2"),
    ]
    await commit(conv, thread, *rows, (user("v"), "m2"))
    assert (await rewind_thread(conv, state, thread, 4)).effective == 4
    assert (await rewind_thread(conv, state, thread, 3)).effective == 2  # the call's answer would be cut
    assert await orders(conv, thread) == ["user u", "event inv-1"]


async def test_a_child_cannot_drop_the_answer_to_its_inherited_call() -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    with pytest.raises(LifecycleError, match=r"inherited from its parent; the earliest order .* is 1"):
        await rewind_thread(conv, state, ids["child"], 0)
    outcome = await rewind_thread(conv, state, ids["child"], 1)
    assert outcome.effective == 1


async def test_bounds_unknown_threads_and_no_op() -> None:
    conv, state = memory_stores()
    thread = uid()
    await commit(conv, thread, (user("a"), "m1"), (user("b"), "m2"))
    with pytest.raises(LifecycleError, match=r"orders 1\.\.2; cannot rewind to 3"):
        await rewind_thread(conv, state, thread, 3)
    with pytest.raises(LifecycleError, match="no thread"):
        await rewind_thread(conv, state, uid(), 0)
    outcome = await rewind_thread(conv, state, thread, 2)
    assert outcome.dropped_rows == 0
    assert (await conv.get_thread(thread)) == ThreadInfo(thread_id=thread, root_id=thread, version=1, tail=2)
    assert (await rewind_thread(conv, state, thread, 0)).effective == 0
    assert await orders(conv, thread) == []


# ---- cleanup ---------------------------------------------------------------------------------------------


async def test_cut_before_a_pending_intent_cancels_it_and_the_next_step_does_not_dispatch_it() -> None:
    tool = RecordingTool()
    provider = ReplayProvider().then(*text("fine"))
    h = Harness(provider, [tool])
    thread = uid()
    # A step committed a call and its dispatch intent, then died before dispatching.
    await commit(
        h.conversation,
        thread,
        (user("do it"), "m1"),
        (call_item("pending-1", "lookup", q=1), "x1"),
        processed_message_ids=["m1"],
        intents_added=[DispatchIntent("pending-1", "lookup", {"q": 1})],
    )
    outcome = await rewind_thread(h.conversation, h.state, thread, 1)
    assert outcome.cleanup.intents == ["pending-1"]
    assert await h.state.open_intents(thread) == []
    await h.say(thread, "never mind", "m2")
    assert tool.dispatches == []
    assert await orders(h.conversation, thread) == ["user do it", "user never mind", "AssistantText"]


async def test_inputs_whose_turns_were_dropped_stay_processed() -> None:
    provider = ReplayProvider().then(*text("hello"))
    h = Harness(provider)
    thread = uid()
    await h.say(thread, "hi", "m1")
    await rewind_thread(h.conversation, h.state, thread, 0)
    assert await h.state.filter_processed(thread, ["m1"]) == {"m1"}
    await h.send(InputMessage.user_text(thread, "hi"), "m1")  # a redelivery
    await h.run()  # the provider has no more replies: a model call would fail the step
    assert await orders(h.conversation, thread) == []


async def test_a_reissued_call_id_is_dispatched_and_answered_again() -> None:
    """Deterministic models re-issue the same call id for the same history; the rewind must not leave
    that id marked answered (the dispatch would be skipped and the thread would wait forever)."""
    tool = RecordingTool()
    provider = ReplayProvider().then(call("lookup", "tc-1", q="x"), Final()).then(*text("42"))
    provider.then(call("lookup", "tc-1", q="x"), Final()).then(*text("43"))
    h = Harness(provider, [tool])
    thread = uid()
    await h.say(thread, "what?", "m1")
    await h.send(InputMessage.tool_result(thread, ToolResult.text("tc-1", "42")), "tc-1")
    await h.run()
    assert await orders(h.conversation, thread) == ["user what?", "call tc-1", "result tc-1", "AssistantText"]
    # A redelivered result for a dropped call brings nothing back. (Steps are driven directly: the
    # in-process queue, like SQS FIFO within its window, would drop a second send of the same dedup id.)
    assert (await rewind_thread(h.conversation, h.state, thread, 1)).effective == 1
    await h.step((InputMessage.tool_result(thread, ToolResult.text("tc-1", "42")), "tc-1"))
    assert await orders(h.conversation, thread) == ["user what?"]
    await h.say(thread, "what?", "m2")
    assert [d[0] for d in tool.dispatches] == ["tc-1", "tc-1"]
    await h.step((InputMessage.tool_result(thread, ToolResult.text("tc-1", "43")), "tc-1"))
    history = await h.history(thread)
    assert history[-1] == AssistantText("43")


async def test_cleanup_of_children_subscriptions_deferred_and_summaries() -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    root = ids["root"]
    assert await state.claim_compaction(root, "claim-1", now=0.0, lease_seconds=1e9)
    compaction = uid("compaction")
    await conv.spawn_thread(root, child_id=compaction, spawn_tool_call_id="cc", kind=ThreadKind.COMPACTION)
    await conv.save_summary(root, Summary("late summary", up_to_order=11))

    outcome = await rewind_thread(conv, state, root, 3)  # inside the spawn pair (3, 4): moves to 2
    assert outcome.effective == 2
    closed = {ids["child"], ids["grandchild"], compaction}  # the event child was closed already
    assert set(outcome.closed_threads) == closed
    for thread in closed:
        info = await conv.get_thread(thread)
        assert info is not None and info.closed
    assert outcome.summaries_removed == [11, 5]
    assert await conv.latest_summary(root) is None
    assert await state.active_subscriptions(root) == set()
    assert await state.open_intents(root) == []
    assert await state.deferred_inputs(root) == []  # the report from the closed child
    assert await state.indexed_call(root, "sp-1") is None
    assert await state.claim_compaction(root, "claim-2", now=1.0, lease_seconds=10)  # released
    assert await state.filter_answered(root, ["sp-1", "big-1"]) == set()
    assert [item for item in await transcript(conv, root) if item["thread_id"] == root] == [
        {"thread_id": root, "order": 1, "kind": "user", "text": "hello"},
        {"thread_id": root, "order": 2, "kind": "assistant", "text": "let me spawn"},
    ]


async def test_a_cut_after_the_spawn_keeps_children_and_unrelated_state() -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    root = ids["root"]
    report = InputMessage.tool_result(
        root,
        ToolResult.text("", "r"),
        synthetic=ThreadReport(tool_call_id="sp-1", child_thread_id=ids["child"]),
    )
    info = await conv.get_thread(root)
    assert info is not None
    await conv.commit(
        root, Commit(expected_version=info.version, deferred_added=[DeferredInput("rp-3", report)])
    )
    outcome = await rewind_thread(conv, state, root, 11)  # drops the user message and the pending call
    assert outcome.effective == 11 and outcome.closed_threads == []
    assert outcome.cleanup.intents == ["pending-1"]
    assert await state.active_subscriptions(root) == {"sub-1"}
    assert sorted(d.message_id for d in await state.deferred_inputs(root)) == ["rp-2", "rp-3"]
    assert await conv.latest_summary(root) == Summary("the story so far", 5)
    child = await conv.get_thread(ids["child"])
    assert child is not None and not child.closed


# ---- races -----------------------------------------------------------------------------------------------


class RacingStore(InMemoryConversationStore):
    """Lets a "step" commit right before the rewind's write, ``times`` times."""

    def __init__(self, backend: Any, times: int) -> None:
        super().__init__(backend)
        self.times = times

    async def rewind(self, thread_id: str, rewind: Rewind) -> ThreadInfo:
        if self.times > 0:
            self.times -= 1
            info = await self.get_thread(thread_id)
            assert info is not None
            await self.commit(
                thread_id, Commit(expected_version=info.version, rows=[(user("step"), uid("m"))])
            )
        return await super().rewind(thread_id, rewind)


async def test_a_rewind_racing_a_step_replans_from_the_new_head() -> None:
    conv, state = memory_stores()
    thread = uid()
    await commit(conv, thread, (user("a"), "m1"), (user("b"), "m2"))
    racing = RacingStore(conv.backend, times=1)
    outcome = await rewind_thread(racing, state, thread, 1)
    assert outcome.effective == 1 and outcome.dropped_rows == 2  # "b" and the racing step's row
    assert await orders(conv, thread) == ["user a"]


async def test_a_rewind_that_keeps_losing_or_expects_a_version_fails_clearly() -> None:
    conv, state = memory_stores()
    thread = uid()
    await commit(conv, thread, (user("a"), "m1"), (user("b"), "m2"))
    with pytest.raises(ConcurrentWriteError, match="kept changing"):
        await rewind_thread(RacingStore(conv.backend, times=5), state, thread, 1, attempts=3)
    info = await conv.get_thread(thread)
    assert info is not None and info.tail == 5  # three racing steps landed; the rewind did not
    with pytest.raises(ConcurrentWriteError, match="is at version 4, not 1"):
        await rewind_thread(conv, state, thread, 1, expected_version=1)
    with pytest.raises(ConcurrentWriteError):
        await rewind_thread(
            RacingStore(conv.backend, times=1), state, thread, 1, expected_version=info.version
        )
    assert (await rewind_thread(conv, state, thread, 1, expected_version=info.version + 1)).effective == 1


async def test_a_step_that_loses_to_a_rewind_fails_its_commit_and_rebuilds_on_the_rewound_history() -> None:
    conv, state = memory_stores()
    thread = uid()
    await commit(conv, thread, (user("a"), "m1"), (user("b"), "m2"))
    step = await HistoryManager.load(conv, state, thread)  # a step loaded the thread...
    await step.handle_content(user("c"), "m3")
    await rewind_thread(conv, state, thread, 1)  # ...then the rewind landed
    with pytest.raises(ConcurrentWriteError):
        await step.sync()
    assert await orders(conv, thread) == ["user a"]
    retried = await HistoryManager.load(conv, state, thread)  # the redelivered input, from a fresh load
    await retried.handle_content(user("c"), "m3")
    await retried.sync()
    assert await orders(conv, thread) == ["user a", "user c"]
