"""HistoryManager behaviour: folding inputs, the turn buffer, tool results and interruption, what lands in
the commit, compaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from stepagent.core.ancestors import load_history_with_ancestors
from stepagent.core.history import INTERRUPTED_TEXT, HistoryManager
from stepagent.errors import ConcurrentWriteError, InvariantViolation
from stepagent.history_items import (
    INJECTED_TOOL_NAME,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import InputMessage, TextContent, ToolCall, ToolResult
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    DeferredInput,
    DispatchIntent,
    StateStore,
    StoredRow,
    ThreadInfo,
    ThreadKind,
)
from stepagent.stores.memory import InMemoryConversationStore, InMemoryStateStore, memory_stores

# ----------------------------------------------------------------------------------------------------------
# Helpers


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def call(
    call_id: str, name: str = "some_tool", call_id2: str | None = None, **arguments: Any
) -> ToolCallItem:
    return ToolCallItem(ToolCall(id=call_id, name=name, arguments=arguments, call_id=call_id2))


def result(call_id: str, text: str = "tool output", call_id2: str | None = None) -> ToolResultItem:
    return ToolResultItem(ToolResult.text(call_id, text, call_id=call_id2))


def interrupted(call_id: str, call_id2: str | None = None) -> ToolResultItem:
    return result(call_id, INTERRUPTED_TEXT, call_id2)


def event(original: str, text: str, *, child: str | None = None) -> EventItem:
    invocation_id = uid("inv")
    invocation = ToolCall(
        id=invocation_id,
        name=INJECTED_TOOL_NAME,
        arguments={
            "original_args": {},
            "original_tool_call_id": original,
            "original_tool_name": "subscribe_tool",
        },
    )
    return EventItem(
        result=ToolResult.text(invocation_id, text),
        tool_call_id=original,
        child_thread_id=child,
        invocation=invocation,
    )


class CountingState:
    """A StateStore wrapper that counts dedup reads."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, list[str]]] = []

    async def filter_processed(self, thread_id: str, message_ids: Sequence[str]) -> set[str]:
        self.calls.append(("filter_processed", list(message_ids)))
        return await self.inner.filter_processed(thread_id, message_ids)

    async def filter_answered(self, thread_id: str, tool_call_ids: Sequence[str]) -> set[str]:
        self.calls.append(("filter_answered", list(tool_call_ids)))
        return await self.inner.filter_answered(thread_id, tool_call_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RecordingConversation:
    """A ConversationStore wrapper that records commits."""

    def __init__(self, inner: ConversationStore) -> None:
        self.inner = inner
        self.commits: list[Commit] = []

    async def commit(self, thread_id: str, commit: Commit) -> ThreadInfo:
        self.commits.append(commit)
        return await self.inner.commit(thread_id, commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


Stores = tuple[InMemoryConversationStore, InMemoryStateStore]


@pytest.fixture
def stores() -> Stores:
    return memory_stores()


async def seed(
    conv: ConversationStore, thread_id: str, *items: HistoryItem, answered: Sequence[str] = ()
) -> None:
    """Commit items straight to the store (message ids ``seed-{n}``)."""
    info = await conv.get_thread(thread_id)
    version = info.version if info else 0
    tail = info.tail if info else 0
    rows = [(item, f"seed-{tail + n}") for n, item in enumerate(items, 1)]
    await conv.commit(
        thread_id, Commit(expected_version=version, rows=rows, answered_tool_calls=list(answered))
    )


async def manager(stores: Stores, thread_id: str) -> HistoryManager:
    return await HistoryManager.load(stores[0], stores[1], thread_id)


async def rows(conv: ConversationStore, thread_id: str) -> list[StoredRow]:
    return [row async for row in conv.load_rows(thread_id)]


def texts(items: Sequence[HistoryItem]) -> list[str]:
    out = []
    for item in items:
        match item:
            case UserItem():
                out.append(f"user:{item.text}")
            case AssistantText(text=text):
                out.append(f"assistant:{text}")
            case Reasoning(text=text):
                out.append(f"reasoning:{text}")
            case ToolCallItem(call=c):
                out.append(f"call:{c.id}")
            case ToolResultItem(result=r):
                out.append(f"result:{r.id}:{r.first_text()}")
            case EventItem(tool_call_id=original, result=r):
                out.append(f"event:{original}:{r.first_text()}")
            case Summary(text=text, up_to_order=up_to):
                out.append(f"summary:{text}@{up_to}")
    return out


# ----------------------------------------------------------------------------------------------------------
# Loading


async def test_load_unknown_thread_is_empty_and_creates_nothing(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    assert hm.history == []
    assert hm.info is None
    assert hm.version == 0
    assert hm.thread_id == thread
    assert hm.root_thread_id == thread
    assert hm.thread_stack == [thread]
    assert hm.ancestors == []
    assert hm.metadata is None
    assert (hm.compacted_up_to, hm.ancestor_prefix_len) == (None, 0)
    assert hm.turn.is_empty
    assert hm.pending.is_empty()
    assert await conv.get_thread(thread) is None
    assert await hm.sync() is False
    assert await conv.get_thread(thread) is None


async def test_load_existing_thread(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("hi"), AssistantText("hello"))
    await state.set_metadata(thread, {"user_id": "u-1"})
    hm = await manager(stores, thread)
    assert texts(hm.history) == ["user:hi", "assistant:hello"]
    assert hm.version == 1
    assert hm.metadata == {"user_id": "u-1"}
    assert hm.own_items() == [(1, user("hi")), (2, AssistantText("hello"))]
    assert hm.rows_read == 2


# ----------------------------------------------------------------------------------------------------------
# Folding user input, duplicates


async def test_ep01_simple_user_message_on_empty_history(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    assert await hm.handle_content(user("hello"), "m-1") is True
    assert hm.history == [user("hello")]
    assert not hm.pending.is_empty()


async def test_ep11_duplicate_message_id_in_one_step(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    assert await hm.handle_content(user("hello"), "m-1") is True
    assert await hm.handle_content(user("hello"), "m-1") is False
    assert hm.history == [user("hello")]


async def test_duplicate_message_id_across_steps(stores: Stores) -> None:
    _, state = stores
    thread = uid("t")
    first = await manager(stores, thread)
    await first.handle_content(user("hello"), "m-1")
    assert await first.sync() is True
    assert await state.filter_processed(thread, ["m-1"]) == {"m-1"}

    second = await manager(stores, thread)
    assert await second.is_processed("m-1")
    assert await second.handle_content(user("hello"), "m-1") is False
    assert await second.handle_content(user("other"), "m-2") is True
    assert texts(second.history) == ["user:hello", "user:other"]


async def test_record_processed_and_is_processed(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    assert not await hm.is_processed("m-x")
    hm.record_processed("m-x")
    assert await hm.is_processed("m-x")
    hm.record_processed("m-x")  # recorded once
    assert await hm.sync() is True
    assert await state.filter_processed(thread, ["m-x"]) == {"m-x"}
    assert [row.message_id for row in await rows(conv, thread)] == []


# ----------------------------------------------------------------------------------------------------------
# The turn buffer


async def test_ep02_consecutive_text_chunks_are_coalesced(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    hm.turn.add(AssistantText("Hello"), "c-1")
    hm.turn.add(AssistantText(", "), "c-2")
    hm.turn.add(AssistantText("world"), "c-3")
    assert hm.history == []
    assert hm.current_turn_view() == [AssistantText("Hello, world")]
    assert not hm.turn.is_empty
    hm.flush_turn()
    assert hm.turn.is_empty
    assert hm.history == [AssistantText("Hello, world")]
    await hm.sync()
    stored = await rows(conv, thread)
    assert [(row.order, row.message_id, row.item) for row in stored] == [
        (1, "c-1", AssistantText("Hello, world"))
    ]


async def test_ep03_text_chunks_not_coalesced_across_non_text_item(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    hm.turn.add(AssistantText("before"), "c-1")
    hm.turn.add(ToolCallItem(ToolCall(id="tc-1", name="t")), "c-2")
    hm.turn.add(AssistantText("after"), "c-3")
    hm.flush_turn()
    assert texts(hm.history) == ["assistant:before", "call:tc-1", "assistant:after"]
    await hm.sync()
    assert [row.message_id for row in await rows(conv, thread)] == ["c-1", "c-2", "c-3"]


async def test_reasoning_is_never_coalesced(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    hm.turn.add(Reasoning("a", signature="s1"), "c-1")
    hm.turn.add(Reasoning("b", signature="s2"), "c-2")
    hm.turn.add(AssistantText("x"), "c-3")
    hm.turn.add(Reasoning("c", signature="s3"), "c-4")
    hm.turn.add(AssistantText("y"), "c-5")
    hm.turn.add(AssistantText("z"), "c-6")
    assert texts(hm.current_turn_view()) == [
        "reasoning:a",
        "reasoning:b",
        "assistant:x",
        "reasoning:c",
        "assistant:yz",
    ]


async def test_handle_completion_rejects_non_assistant_items(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    for item in (user("x"), result("tc"), Summary("s", 1)):
        with pytest.raises(InvariantViolation):
            hm.turn.add(item, "c-1")
    assert hm.turn.is_empty


async def test_ep04_buffered_turn_is_not_committed_until_flush(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    await hm.handle_content(user("question"), "m-1")
    await hm.sync()
    hm.turn.add(Reasoning("thinking", signature="sig"), "c-1")
    hm.turn.add(AssistantText("answer"), "c-2")
    assert len(hm.history) == 1
    assert hm.pending.is_empty()
    assert len(hm.current_turn_view()) == 3
    hm.flush_turn()
    assert len(hm.history) == 3
    assert not hm.pending.is_empty()
    assert hm.turn.is_empty
    await hm.sync()
    assert [row.item for row in await rows(conv, thread)] == [
        user("question"),
        Reasoning("thinking", signature="sig"),
        AssistantText("answer"),
    ]


async def test_ep05_discard_turn_leaves_history_clean(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    await hm.handle_content(user("question"), "m-1")
    hm.turn.add(AssistantText("partial ans"), "c-1")
    hm.turn.discard()
    assert hm.turn.is_empty
    assert hm.history == [user("question")]
    assert hm.current_turn_view() == [user("question")]
    await hm.sync()
    assert [row.item for row in await rows(conv, thread)] == [user("question")]


async def test_ep06_trimming_flush_keeps_text_drops_trailing_reasoning(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    await hm.handle_content(user("q"), "m-1")
    hm.turn.add(AssistantText("here is the answer"), "c-1")
    hm.turn.add(Reasoning("more thoughts", signature="sig"), "c-2")
    hm.flush_turn(trim_reasoning=True)
    assert hm.history == [user("q"), AssistantText("here is the answer")]
    assert hm.turn.is_empty


async def test_ep07_trimming_flush_trims_interleaved_blank_text(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    await hm.handle_content(user("q"), "m-1")
    hm.turn.add(Reasoning("r1", signature="s"), "c-1")
    hm.turn.add(AssistantText("  "), "c-2")
    hm.turn.add(Reasoning("r2", signature="s"), "c-3")
    hm.flush_turn(trim_reasoning=True)
    assert hm.history == [user("q")]
    assert hm.turn.is_empty
    assert hm.own_items() == [(1, user("q"))]  # nothing from the trimmed turn got an order


async def test_trimming_flush_stops_at_a_tool_call_or_text(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    hm.turn.add(Reasoning("r1", signature="s"), "c-1")
    hm.turn.add(AssistantText("visible"), "c-2")
    hm.turn.add(Reasoning("r2", signature="s"), "c-3")
    hm.turn.add(AssistantText("\n\t "), "c-4")
    hm.flush_turn(trim_reasoning=True)
    assert texts(hm.history) == ["reasoning:r1", "assistant:visible"]

    other = await manager(stores, uid("t"))
    other.turn.add(Reasoning("r1", signature="s"), "c-1")
    other.turn.add(ToolCallItem(ToolCall(id="tc-1", name="t")), "c-2")
    other.flush_turn(trim_reasoning=True)
    assert texts(other.history) == ["reasoning:r1", "call:tc-1"]


async def test_ep08_current_turn_view_appends_buffer_to_history(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    await hm.handle_content(user("q"), "m-1")
    assert hm.current_turn_view() == [user("q")]
    hm.turn.add(AssistantText("partial"), "c-1")
    view = hm.current_turn_view()
    assert view == [user("q"), AssistantText("partial")]
    assert hm.history == [user("q")]
    view.append(user("mutating the view"))
    assert hm.current_turn_view() == [user("q"), AssistantText("partial")]


# ----------------------------------------------------------------------------------------------------------
# Buffer discipline


async def test_append_with_non_empty_buffer_raises(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    hm.turn.add(AssistantText("streaming"), "c-1")
    with pytest.raises(InvariantViolation):
        await hm.handle_content(user("interrupting"), "m-1")
    with pytest.raises(InvariantViolation):
        hm.append_generated(result("tc-x", "sync result"), "tc-x-sync-result-0")
    assert hm.history == []


async def test_sync_with_non_empty_buffer_raises(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    await hm.handle_content(user("q"), "m-1")
    hm.turn.add(AssistantText("streaming"), "c-1")
    with pytest.raises(InvariantViolation):
        await hm.sync()
    assert await conv.get_thread(thread) is None
    hm.flush_turn()
    assert await hm.sync() is True
    assert texts([row.item for row in await rows(conv, thread)]) == ["user:q", "assistant:streaming"]


# ----------------------------------------------------------------------------------------------------------
# Tool results, tail matching and interruption


async def test_ep12_user_message_interrupts_pending_tool_call(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1", x=1))
    hm = await manager(stores, thread)
    assert hm.pending_tool_call() == call("tc-1", x=1)
    assert await hm.handle_content(user("never mind"), "m-2") is True
    assert hm.history == [user("do it"), call("tc-1", x=1), interrupted("tc-1"), user("never mind")]
    assert hm.pending_tool_call() is None
    assert hm.is_answered("tc-1")
    assert hm.take_interrupted_tool_calls() == ["tc-1"]
    assert hm.take_interrupted_tool_calls() == []

    await hm.sync()
    stored = await rows(conv, thread)
    assert [(row.order, row.message_id) for row in stored[2:]] == [(3, "tc-1-interrupted"), (4, "m-2")]
    assert await state.filter_answered(thread, ["tc-1"]) == {"tc-1"}
    assert await state.filter_processed(thread, ["m-2"]) == {"m-2"}


async def test_interruption_carries_the_provider_call_id(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1", call_id2="prov-1"))
    hm = await manager(stores, thread)
    await hm.handle_content(user("stop"), "m-2")
    assert hm.history[2] == interrupted("tc-1", call_id2="prov-1")
    assert hm.history[2].result.call_id == "prov-1"  # type: ignore[union-attr]


async def test_ep13_tool_result_appended_to_history(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1"))
    hm = await manager(stores, thread)
    assert await hm.handle_content(result("tc-1", "tool output"), "rap-tool-result-tc-1") is True
    assert hm.history[-1] == result("tc-1", "tool output")
    assert hm.take_interrupted_tool_calls() == []
    await hm.sync()
    assert await state.filter_answered(thread, ["tc-1"]) == {"tc-1"}
    assert (await rows(conv, thread))[-1].message_id == "rap-tool-result-tc-1"


async def test_tool_call_as_input_interrupts_too(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1"))
    hm = await manager(stores, thread)
    assert await hm.handle_content(call("tc-2"), "m-2") is True
    assert texts(hm.history[2:]) == [f"result:tc-1:{INTERRUPTED_TEXT}", "call:tc-2"]


async def test_ep15_ep21_self_contained_event_interrupts_pending_call(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("subscribe"), call("tc-sub", name="subscribe_tool", topic="events"))
    hm = await manager(stores, thread)
    report = event("tc-sub", "Report from child thread: done", child="child-1")
    assert await hm.handle_content(report, "m-report") is True
    assert hm.history[2:] == [interrupted("tc-sub"), report]
    assert hm.take_interrupted_tool_calls() == ["tc-sub"]
    # The event's own invocation counts as answered.
    assert hm.is_answered(report.result.id)


async def test_ep14_ep20_event_after_answered_call_is_appended(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("run"), call("tc-cmd", name="execute_command"), result("tc-cmd", "started"))
    hm = await manager(stores, thread)
    chunk = event("tc-cmd", "build output chunk\n[exit code: 0]")
    assert await hm.handle_content(chunk, "m-evt") is True
    assert hm.history[-1] == chunk
    assert hm.take_interrupted_tool_calls() == []
    assert len(hm.history) == 4


async def test_tool_result_for_non_tail_call_is_ignored_and_not_recorded(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1"), AssistantText("meanwhile"))
    hm = await manager(stores, thread)
    assert hm.pending_tool_call() is None
    assert await hm.handle_content(result("tc-1"), "m-late") is False
    assert await hm.handle_content(result("tc-other"), "m-other") is False
    assert len(hm.history) == 3
    assert hm.pending.is_empty()
    assert await hm.sync() is False
    assert await state.filter_processed(thread, ["m-late", "m-other"]) == set()
    # A later redelivery is evaluated afresh (not absorbed as processed).
    again = await manager(stores, thread)
    assert not await again.is_processed("m-late")


async def test_tool_result_for_wrong_call_is_ignored_and_not_recorded(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1"))
    hm = await manager(stores, thread)
    assert await hm.handle_content(result("tc-2"), "m-wrong") is False
    assert hm.pending_tool_call() == call("tc-1")
    assert hm.take_interrupted_tool_calls() == []
    assert await hm.sync() is False
    assert await state.filter_processed(thread, ["m-wrong"]) == set()
    # The right result still lands afterwards.
    assert await hm.handle_content(result("tc-1"), "m-right") is True


async def test_tool_result_on_empty_history_is_ignored(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    assert await hm.handle_content(result("nonexistent-tc"), "m-1") is False
    assert hm.history == []
    assert hm.pending.is_empty()


async def test_legacy_event_without_invocation_is_matched_like_a_result(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("sub"), call("tc-sub"))
    hm = await manager(stores, thread)
    legacy = EventItem(result=ToolResult.text("tc-other", "e"), tool_call_id="tc-other")
    assert await hm.handle_content(legacy, "m-1") is False
    matching = EventItem(result=ToolResult.text("tc-sub", "e"), tool_call_id="tc-sub")
    assert await hm.handle_content(matching, "m-2") is True
    assert hm.history[-1] == matching
    assert hm.is_answered("tc-sub")


async def test_answered_call_absorption(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1"), result("tc-1"), answered=["tc-1"])
    hm = await manager(stores, thread)
    assert await hm.handle_content(result("tc-1", "again"), "m-dup") is False
    assert len(hm.history) == 3
    assert await hm.is_processed("m-dup")
    assert not hm.pending.is_empty()
    # Not persisted until the next sync, then persisted with it.
    assert await state.filter_processed(thread, ["m-dup"]) == set()
    assert await hm.sync() is True
    assert await state.filter_processed(thread, ["m-dup"]) == {"m-dup"}
    assert len(await rows(conv, thread)) == 3


async def test_late_result_after_interruption_is_absorbed(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1"))
    hm = await manager(stores, thread)
    await hm.handle_content(user("stop"), "m-2")
    assert await hm.handle_content(result("tc-1", "too late"), "m-late") is False
    await hm.sync()
    assert await state.filter_processed(thread, ["m-late"]) == {"m-late"}
    assert texts([row.item for row in await rows(conv, thread)]) == [
        "user:do it",
        "call:tc-1",
        f"result:tc-1:{INTERRUPTED_TEXT}",
        "user:stop",
    ]


async def test_absorption_uses_the_state_store_when_the_result_is_not_visible(stores: Stores) -> None:
    """A call answered before a compaction is known from the state store, not from the visible history."""
    conv, state = stores
    thread = uid("t")
    await seed(
        conv, thread, user("do it"), call("tc-1"), result("tc-1"), AssistantText("done"), answered=["tc-1"]
    )
    await conv.save_summary(thread, Summary("all done", 4))
    hm = await manager(stores, thread)
    assert hm.history == [Summary("all done", 4)]
    assert not hm.is_answered("tc-1")
    assert await hm.handle_content(result("tc-1", "redelivered"), "m-redelivered") is False
    assert hm.is_answered("tc-1")
    await hm.sync()
    assert await state.filter_processed(thread, ["m-redelivered"]) == {"m-redelivered"}


async def test_append_generated(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    await hm.handle_content(user("spawn"), "m-1")
    hm.turn.add(call("tc-s", name="spawn_thread"), "c-1")
    hm.flush_turn()
    hm.append_generated(result("tc-s", "Child thread is successfully spawned"), "tc-s-sync-result-1")
    assert hm.is_answered("tc-s")
    await hm.sync()
    assert [row.message_id for row in await rows(conv, thread)] == ["m-1", "c-1", "tc-s-sync-result-1"]
    assert await state.filter_answered(thread, ["tc-s"]) == {"tc-s"}
    # Generated rows are history, not inputs: their ids are not recorded as processed inputs.
    assert await state.filter_processed(thread, ["tc-s-sync-result-1"]) == set()


# ----------------------------------------------------------------------------------------------------------
# Prefetch: dedup reads are batched


async def test_prefetch_does_at_most_two_reads_for_a_batch(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("do it"), call("tc-1"))
    await state.mark_processed(thread, ["m-old"])
    counting = CountingState(state)
    hm = await HistoryManager.load(conv, counting, thread)  # type: ignore[arg-type]
    counting.calls.clear()

    batch: list[tuple[HistoryItem, str]] = [
        (user("old, redelivered"), "m-old"),
        (result("tc-1", "out"), "m-result"),
        (result("tc-1", "dup"), "m-result-dup"),
        (user("new"), "m-new"),
        (user("new, same batch"), "m-new"),
    ]
    await hm.prefetch(
        [mid for _, mid in batch], [answered for item, _ in batch if (answered := _result_id(item))]
    )
    assert len(counting.calls) <= 2
    outcomes = [await hm.handle_content(item, mid) for item, mid in batch]
    assert outcomes == [False, True, False, True, False]
    assert len(counting.calls) <= 2, counting.calls
    assert {name for name, _ in counting.calls} <= {"filter_processed", "filter_answered"}
    # Only the batch's ids were asked for.
    asked = {mid for _, ids in counting.calls for mid in ids}
    assert asked <= {"m-old", "m-result", "m-result-dup", "m-new", "tc-1"}
    assert texts(hm.history) == ["user:do it", "call:tc-1", "result:tc-1:out", "user:new"]


def _result_id(item: HistoryItem) -> str | None:
    return item.result.id if isinstance(item, ToolResultItem) else None


async def test_prefetch_twice_reads_nothing_new(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("x"), call("tc-1"))
    counting = CountingState(state)
    hm = await HistoryManager.load(conv, counting, thread)  # type: ignore[arg-type]
    counting.calls.clear()
    await hm.prefetch(["m-1", "m-2"], ["tc-1"])
    reads = len(counting.calls)
    assert reads <= 2
    await hm.prefetch(["m-1", "m-2"], ["tc-1"])
    await hm.prefetch(["m-1"])
    assert len(counting.calls) == reads
    await hm.prefetch()
    assert len(counting.calls) == reads


async def test_prefetch_of_nothing_reads_nothing(stores: Stores) -> None:
    conv, state = stores
    counting = CountingState(state)
    hm = await HistoryManager.load(conv, counting, uid("t"))  # type: ignore[arg-type]
    counting.calls.clear()
    await hm.prefetch()
    assert counting.calls == []


async def test_prefetch_learns_answered_calls(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await conv.commit(thread, Commit(expected_version=0, answered_tool_calls=["tc-old"]))
    hm = await manager(stores, thread)
    assert not hm.is_answered("tc-old")
    await hm.prefetch(tool_call_ids=["tc-old", "tc-new"])
    assert hm.is_answered("tc-old")
    assert not hm.is_answered("tc-new")


# ----------------------------------------------------------------------------------------------------------
# Sync: one atomic, version-checked commit


async def test_sync_commits_everything_in_one_commit(stores: Stores) -> None:
    mem_conv, state = stores
    conv = RecordingConversation(mem_conv)
    thread = uid("t")
    hm = await HistoryManager.load(conv, state, thread)  # type: ignore[arg-type]
    await hm.handle_content(user("hello"), "m-1")
    hm.turn.add(AssistantText("calling"), "c-1")
    hm.turn.add(call("tc-1", name="remote"), "c-2")
    hm.flush_turn()
    hm.pending.add_intent(DispatchIntent("tc-1", "remote", {}))
    hm.pending.subscribe("sub-1")
    hm.update_metadata({"user": "u"})
    message = InputMessage.tool_result(thread, ToolResult.text("sub-1", "evt"), synthetic="sub-1")
    hm.pending.defer(DeferredInput("d-1", message))
    assert await hm.sync() is True
    assert len(conv.commits) == 1
    [commit] = conv.commits
    assert commit.expected_version == 0
    assert [mid for _, mid in commit.rows] == ["m-1", "c-1", "c-2"]
    assert list(commit.processed_message_ids) == ["m-1"]
    assert list(commit.intents_added) == [DispatchIntent("tc-1", "remote", {})]
    assert list(commit.subscriptions_added) == ["sub-1"]
    assert list(commit.deferred_added) == [DeferredInput("d-1", message)]
    assert commit.metadata == (thread, {"user": "u"})
    assert hm.version == 1
    assert hm.pending.is_empty()
    # Nothing left: a second sync is a no-op and writes nothing.
    assert await hm.sync() is False
    assert len(conv.commits) == 1


async def test_second_manager_sees_exactly_the_same_history(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    await hm.handle_content(user("hello"), "m-1")
    hm.turn.add(Reasoning("hmm", signature="sig"), "c-1")
    hm.turn.add(AssistantText("let me check"), "c-2")
    hm.turn.add(call("tc-1", q="x"), "c-3")
    hm.flush_turn()
    await hm.sync()
    await hm.handle_content(result("tc-1", "found"), "m-2")
    hm.turn.add(AssistantText("answer"), "c-4")
    hm.flush_turn()
    await hm.handle_content(event("tc-1", "late event"), "m-3")
    await hm.sync()

    other = await manager(stores, thread)
    assert other.history == hm.history
    assert other.own_items() == hm.own_items()
    assert other.version == hm.version == 2
    assert (other.compacted_up_to, other.ancestor_prefix_len) == (hm.compacted_up_to, hm.ancestor_prefix_len)
    assert other.safe_spawn_point() == hm.safe_spawn_point()
    assert [row.order for row in await rows(conv, thread)] == list(range(1, 8))


async def test_sync_loses_to_a_concurrent_writer(stores: Stores) -> None:
    conv, state = stores
    thread = uid("t")
    await seed(conv, thread, user("base"))
    first = await manager(stores, thread)
    second = await manager(stores, thread)
    await first.handle_content(user("from first"), "m-a")
    await second.handle_content(user("from second"), "m-b")
    second.pending.subscribe("sub-b")
    assert await first.sync() is True
    with pytest.raises(ConcurrentWriteError):
        await second.sync()
    assert texts([row.item for row in await rows(conv, thread)]) == ["user:base", "user:from first"]
    assert await state.filter_processed(thread, ["m-a", "m-b"]) == {"m-a"}
    assert await state.active_subscriptions(thread) == set()
    # The loser retries from a fresh load; nothing is lost.
    retry = await manager(stores, thread)
    assert await retry.handle_content(user("from second"), "m-b") is True
    await retry.sync()
    assert texts([row.item for row in await rows(conv, thread)])[-1] == "user:from second"


async def test_sync_after_sync_continues_orders(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    for n in range(1, 4):
        await hm.handle_content(user(f"u{n}"), f"m-{n}")
        await hm.sync()
    assert hm.version == 3
    assert [order for order, _ in hm.own_items()] == [1, 2, 3]
    assert [row.order for row in await rows(conv, thread)] == [1, 2, 3]


# ----------------------------------------------------------------------------------------------------------
# Metadata, subscriptions, intents, deferrals land in the commit


async def test_ep19_metadata_update_lands_in_commit(stores: Stores) -> None:
    _, state = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    hm.update_metadata({"user_id": "u-123"})
    assert hm.metadata == {"user_id": "u-123"}
    assert not hm.pending.is_empty()
    assert await state.get_metadata(thread) is None
    await hm.sync()
    assert await state.get_metadata(thread) == {"user_id": "u-123"}
    assert (await manager(stores, thread)).metadata == {"user_id": "u-123"}


async def test_metadata_of_a_child_is_stored_under_the_root(stores: Stores) -> None:
    conv, state = stores
    root, child = uid("root"), uid("child")
    await seed(conv, root, user("r1"))
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="tc-s", kind=ThreadKind.CHILD)
    await state.set_metadata(root, {"v": 1})
    hm = await manager(stores, child)
    assert hm.metadata == {"v": 1}
    hm.update_metadata({"v": 2})
    await hm.sync()
    assert await state.get_metadata(root) == {"v": 2}
    assert await state.get_metadata(child) is None


async def test_track_and_remove_subscription_land_in_commit(stores: Stores) -> None:
    _, state = stores
    thread = uid("t")
    hm = await manager(stores, thread)
    hm.pending.subscribe("sub-1")
    hm.pending.subscribe("sub-2")
    assert await state.active_subscriptions(thread) == set()
    assert await hm.sync() is True
    assert await state.active_subscriptions(thread) == {"sub-1", "sub-2"}
    hm.pending.unsubscribe("sub-1")
    await hm.sync()
    assert await state.active_subscriptions(thread) == {"sub-2"}
    assert hm.version == 2


async def test_intents_and_deferrals_land_in_commit(stores: Stores) -> None:
    _, state = stores
    thread = uid("t")
    message = InputMessage.tool_result(thread, ToolResult.text("sub", "evt"), synthetic="sub")
    hm = await manager(stores, thread)
    hm.pending.add_intent(DispatchIntent("tc-1", "remote", {"a": 1}))
    hm.pending.defer(DeferredInput("d-1", message))
    await hm.sync()
    assert await state.open_intents(thread) == [DispatchIntent("tc-1", "remote", {"a": 1})]
    assert await state.deferred_inputs(thread) == [DeferredInput("d-1", message)]
    hm.pending.undefer("d-1")
    await hm.sync()
    assert await state.deferred_inputs(thread) == []


# ----------------------------------------------------------------------------------------------------------
# Thread tree: stack, root, find_tool_call


async def build_grandchild(stores: Stores) -> tuple[str, str, str]:
    conv, _ = stores
    root, child, grandchild = uid("R"), uid("C"), uid("G")
    await seed(conv, root, user("r1"), call("tc-c", name="spawn_thread"))
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="tc-c", kind=ThreadKind.CHILD)
    await seed(conv, child, result("tc-c", "seed C"), call("tc-g", name="spawn_thread"))
    await conv.spawn_thread(child, child_id=grandchild, spawn_tool_call_id="tc-g", kind=ThreadKind.CHILD)
    await seed(conv, grandchild, result("tc-g", "seed G"))
    return root, child, grandchild


async def test_thread_stack_and_root_for_a_grandchild(stores: Stores) -> None:
    root, child, grandchild = await build_grandchild(stores)
    hm = await manager(stores, grandchild)
    assert hm.thread_stack == [root, child, grandchild]
    assert hm.root_thread_id == root
    assert hm.ancestors == [root, child]
    assert texts(hm.history) == [
        "user:r1",
        "call:tc-c",
        "result:tc-c:seed C",
        "call:tc-g",
        "result:tc-g:seed G",
    ]
    assert hm.ancestor_prefix_len == 4
    assert [order for order, _ in hm.own_items()] == [None, None, None, None, 1]

    middle = await manager(stores, child)
    assert middle.thread_stack == [root, child]
    assert middle.root_thread_id == root
    top = await manager(stores, root)
    assert top.thread_stack == [root]
    assert top.root_thread_id == root


async def test_find_tool_call(stores: Stores) -> None:
    _, _, grandchild = await build_grandchild(stores)
    hm = await manager(stores, grandchild)
    assert hm.find_tool_call("tc-c") == call("tc-c", name="spawn_thread")  # inherited from the root
    assert hm.find_tool_call("tc-g") == call("tc-g", name="spawn_thread")
    assert hm.find_tool_call("tc-missing") is None
    await hm.handle_content(user("go"), "m-1")
    hm.turn.add(call("tc-own", name="own_tool"), "c-1")
    assert hm.find_tool_call("tc-own") is None  # still in the turn buffer
    hm.flush_turn()
    assert hm.find_tool_call("tc-own") == call("tc-own", name="own_tool")
    # A result is not a call.
    assert hm.find_tool_call("seed-1") is None


async def test_child_seed_answers_the_inherited_spawn_call(stores: Stores) -> None:
    conv, _ = stores
    root, child = uid("R"), uid("C")
    await seed(conv, root, user("spawn please"), call("tc-spawn", name="spawn_thread"))
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="tc-spawn", kind=ThreadKind.CHILD)
    hm = await manager(stores, child)
    assert hm.pending_tool_call() == call("tc-spawn", name="spawn_thread")
    assert await hm.handle_content(result("tc-spawn", "You are now INSIDE the thread"), "tc-spawn") is True
    assert hm.take_interrupted_tool_calls() == []
    await hm.sync()
    assert [row.order for row in await rows(conv, child)] == [1]


# ----------------------------------------------------------------------------------------------------------
# safe_spawn_point


async def test_safe_spawn_point_simple_cases(stores: Stores) -> None:
    hm = await manager(stores, uid("t"))
    assert hm.safe_spawn_point() == 0
    await hm.handle_content(user("u1"), "m-1")
    assert hm.safe_spawn_point() == 1
    hm.turn.add(AssistantText("a2"), "c-1")
    assert hm.safe_spawn_point() == 1  # buffered content does not count
    hm.flush_turn()
    assert hm.safe_spawn_point() == 2
    hm.turn.add(call("tc-1"), "c-2")
    hm.flush_turn()
    assert hm.safe_spawn_point() == 2  # trailing unanswered call excluded
    await hm.handle_content(result("tc-1"), "m-2")
    assert hm.safe_spawn_point() == 4  # answered: included with its result


async def test_safe_spawn_point_skips_a_trailing_run_of_unanswered_calls(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("u1"), AssistantText("a2"), call("tc-1"), call("tc-2"))
    hm = await manager(stores, thread)
    assert hm.safe_spawn_point() == 2


async def test_safe_spawn_point_with_only_unanswered_calls(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, call("tc-1"))
    hm = await manager(stores, thread)
    assert hm.safe_spawn_point() == 0


async def test_safe_spawn_point_after_own_compaction(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("u1"), AssistantText("a2"), user("u3"), call("tc-4"))
    await conv.save_summary(thread, Summary("first two", 2))
    hm = await manager(stores, thread)
    assert texts(hm.history) == ["summary:first two@2", "user:u3", "call:tc-4"]
    assert hm.safe_spawn_point() == 3

    only_summary = uid("t")
    await seed(conv, only_summary, user("u1"), AssistantText("a2"), call("tc-3"))
    await conv.save_summary(only_summary, Summary("first two", 2))
    hm2 = await manager(stores, only_summary)
    assert texts(hm2.history) == ["summary:first two@2", "call:tc-3"]
    assert hm2.safe_spawn_point() == 2


async def test_safe_spawn_point_in_a_child_with_inherited_prefix(stores: Stores) -> None:
    conv, _ = stores
    root, child = uid("R"), uid("C")
    await seed(conv, root, user("r1"), AssistantText("r2"), call("tc-spawn", name="spawn_thread"))
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="tc-spawn", kind=ThreadKind.CHILD)
    hm = await manager(stores, child)
    # Only inherited items (ending in the spawn call, unanswered from the child's point of view): nothing own.
    assert hm.safe_spawn_point() == 0
    await hm.handle_content(result("tc-spawn", "seed"), "tc-spawn")
    assert hm.safe_spawn_point() == 1
    hm.turn.add(AssistantText("child work"), "c-1")
    hm.turn.add(call("tc-async"), "c-2")
    hm.flush_turn()
    assert hm.safe_spawn_point() == 2


# ----------------------------------------------------------------------------------------------------------
# apply_compaction


async def test_apply_compaction_without_summary(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("u1"))
    hm = await manager(stores, thread)
    assert await hm.apply_compaction() is False
    assert hm.history == [user("u1")]
    assert hm.compacted_up_to is None


async def test_first_compaction(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("u1"), AssistantText("a2"), user("u3"))
    hm = await manager(stores, thread)
    await conv.save_summary(thread, Summary("u1 and a2", 2))
    assert await hm.apply_compaction() is True
    assert hm.history == [Summary("u1 and a2", 2), user("u3")]
    assert hm.compacted_up_to == 2
    assert hm.ancestor_prefix_len == 0
    assert hm.own_items() == [(2, Summary("u1 and a2", 2)), (3, user("u3"))]
    assert hm.safe_spawn_point() == 3
    # New items continue the own order space, and a fresh load agrees.
    await hm.handle_content(user("u4"), "m-4")
    await hm.sync()
    fresh = await manager(stores, thread)
    assert fresh.history == hm.history
    assert fresh.own_items() == hm.own_items()
    assert fresh.compacted_up_to == 2


async def test_apply_compaction_after_fresh_load_is_a_no_op_that_reports_true(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("u1"), AssistantText("a2"), user("u3"))
    await conv.save_summary(thread, Summary("s", 2))
    hm = await manager(stores, thread)
    before = list(hm.history)
    assert await hm.apply_compaction() is True
    assert hm.history == before
    assert hm.compacted_up_to == 2


async def test_apply_compaction_refuses_a_summary_beyond_what_it_has_seen(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("u1"), AssistantText("a2"))
    stale = await manager(stores, thread)
    await seed(conv, thread, user("u3"), AssistantText("a4"))
    await conv.save_summary(thread, Summary("four rows", 4))
    assert await stale.apply_compaction() is False
    assert stale.history == [user("u1"), AssistantText("a2")]
    assert stale.compacted_up_to is None


async def test_apply_compaction_keeps_unsynced_items(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("u1"), AssistantText("a2"))
    hm = await manager(stores, thread)
    await hm.handle_content(user("u3 unsynced"), "m-3")
    await conv.save_summary(thread, Summary("s", 2))
    assert await hm.apply_compaction() is True
    assert hm.history == [Summary("s", 2), user("u3 unsynced")]
    await hm.sync()
    assert (await manager(stores, thread)).history == hm.history


async def test_second_compaction_during_tool_call_after_prior_compaction(stores: Stores) -> None:
    """The orders add up across two compactions, with real stores and real compaction children: each summary
    sits at the order it covers, the second compaction stops before a pending call, and the call, its result
    and what follows keep their orders after the summary."""
    conv, _ = stores
    t1 = uid("t1")
    hm = await manager(stores, t1)
    await hm.handle_content(user("first message"), "m-1")
    hm.turn.add(AssistantText("first response"), "c-1")
    hm.flush_turn()
    await hm.sync()

    # First compaction at safe point 2.
    assert hm.safe_spawn_point() == 2
    k1 = uid("compact1")
    await conv.spawn_thread(
        t1,
        child_id=k1,
        spawn_tool_call_id=uid("tc"),
        kind=ThreadKind.COMPACTION,
        spawn_order=hm.safe_spawn_point(),
    )
    k1_view = await load_history_with_ancestors(conv, k1)
    assert texts(k1_view.items) == ["user:first message", "assistant:first response"]
    await conv.save_summary(t1, Summary("S1", 2))
    assert await hm.apply_compaction() is True
    assert hm.history == [Summary("S1", 2)]
    assert hm.compacted_up_to == 2

    # Orders 3..7, then 8 = an unanswered tool call.
    for n, text in enumerate(["second message", "second response", "third message", "third response"], 3):
        if n % 2:
            await hm.handle_content(user(text), f"m-{n}")
        else:
            hm.turn.add(AssistantText(text), f"c-{n}")
            hm.flush_turn()
    await hm.handle_content(user("fourth message"), "m-7")
    hm.turn.add(call("tc-2", name="slow_tool"), "c-8")
    hm.flush_turn()
    await hm.sync()
    assert [order for order, _ in hm.own_items()] == [2, 3, 4, 5, 6, 7, 8]

    # Second compaction: safe point 7 (tc-2 excluded).
    assert hm.safe_spawn_point() == 7
    k2 = uid("compact2")
    await conv.spawn_thread(
        t1, child_id=k2, spawn_tool_call_id=uid("tc"), kind=ThreadKind.COMPACTION, spawn_order=7
    )
    k2_hm = await manager(stores, k2)
    assert texts(k2_hm.history) == [
        "summary:S1@2",
        "user:second message",
        "assistant:second response",
        "user:third message",
        "assistant:third response",
        "user:fourth message",
    ]
    assert k2_hm.ancestor_prefix_len == 6
    assert k2_hm.thread_stack == [t1, k2]

    # Meanwhile the tool result arrives in t1.
    await hm.handle_content(result("tc-2", "slow result"), "m-9")
    hm.turn.add(AssistantText("processed tool result"), "c-10")
    hm.flush_turn()
    await hm.sync()

    await conv.save_summary(t1, Summary("S2", 7))
    assert await hm.apply_compaction() is True
    assert texts(hm.history) == [
        "summary:S2@7",
        "call:tc-2",
        "result:tc-2:slow result",
        "assistant:processed tool result",
    ]
    assert hm.own_items()[0] == (7, Summary("S2", 7))
    assert [order for order, _ in hm.own_items()] == [7, 8, 9, 10]
    assert hm.compacted_up_to == 7
    assert hm.safe_spawn_point() == 10
    fresh = await manager(stores, t1)
    assert fresh.history == hm.history
    assert fresh.own_items() == hm.own_items()


async def test_compaction_inside_a_child_thread(stores: Stores) -> None:
    """A child thread compacts through its own compaction grandchild (root → child → compaction): the child
    loads its ancestors' rows, the summary applies to its own rows only, nothing fails; driven through
    HistoryManager."""
    conv, _ = stores
    root, child, compactor = uid("root"), uid("child"), uid("compaction")

    r = await manager(stores, root)
    for n, text in enumerate(["root message one", "root reply one", "root message two", "root reply two"], 1):
        if n % 2:
            await r.handle_content(user(text), f"m-{n}")
        else:
            r.turn.add(AssistantText(text), f"c-{n}")
            r.flush_turn()
    await r.handle_content(user("spawn a child"), "m-5")
    r.turn.add(call("tc-spawn", name="spawn_thread", instructions="do it"), "c-6")
    r.flush_turn()
    await r.sync()  # synced before the sync tool runs
    spawned = await conv.spawn_thread(
        root, child_id=child, spawn_tool_call_id="tc-spawn", kind=ThreadKind.CHILD
    )
    assert spawned.spawn_order == 6
    r.append_generated(result("tc-spawn", f"Child thread is successfully spawned and has ID: {child}"), "r-7")
    r.turn.add(AssistantText("ok, child spawned"), "c-8")
    r.flush_turn()
    await r.sync()

    c = await manager(stores, child)
    assert c.ancestor_prefix_len == 6
    assert c.thread_stack == [root, child]
    await c.handle_content(result("tc-spawn", "You are now INSIDE the thread"), "tc-spawn")
    c.turn.add(AssistantText("child first response"), "c-c2")
    c.flush_turn()
    await c.handle_content(user("child follow-up"), "m-c3")
    c.turn.add(call("tc-async", name="async_tool"), "c-c4")
    c.flush_turn()
    await c.sync()
    assert [order for order, _ in c.own_items()] == [None] * 6 + [1, 2, 3, 4]

    # Safe point: index of C3 + 1 = 9 in memory, minus the prefix 6 → 3 in C's own order space.
    assert c.safe_spawn_point() == 3
    await conv.spawn_thread(
        child, child_id=compactor, spawn_tool_call_id="tc-compact", kind=ThreadKind.COMPACTION, spawn_order=3
    )
    k = await manager(stores, compactor)
    assert k.thread_stack == [root, child, compactor]
    assert k.root_thread_id == root
    await k.handle_content(
        call("tc-begin", name="__harness_begin_compaction__"), "tc-compact-compaction-call"
    )
    await k.handle_content(result("tc-begin", "You are now INSIDE a compaction thread."), "tc-compact")
    assert texts(k.history) == [
        "user:root message one",
        "assistant:root reply one",
        "user:root message two",
        "assistant:root reply two",
        "user:spawn a child",
        "call:tc-spawn",
        "result:tc-spawn:You are now INSIDE the thread",
        "assistant:child first response",
        "user:child follow-up",
        "call:tc-begin",
        "result:tc-begin:You are now INSIDE a compaction thread.",
    ]
    assert k.ancestor_prefix_len == 9
    await k.sync()

    # The summary lands on C (up_to = the compaction child's spawn order) and C applies it.
    await conv.save_summary(child, Summary("child summary", 3))
    assert await c.apply_compaction() is True
    assert texts(c.history) == ["summary:child summary@3", "call:tc-async"]
    assert c.ancestor_prefix_len == 0
    assert c.compacted_up_to == 3
    assert c.pending_tool_call() == call("tc-async", name="async_tool")
    # Ancestor context is gone from C after its own compaction.
    assert c.find_tool_call("tc-spawn") is None
    # The thread stack is still the tree path.
    assert c.thread_stack == [root, child]

    await c.handle_content(result("tc-async", "async result"), "m-c5")
    c.turn.add(AssistantText("processed tool result"), "c-c6")
    c.flush_turn()
    await c.handle_content(user("message after compaction"), "m-c7")
    await c.sync()
    assert texts(c.history) == [
        "summary:child summary@3",
        "call:tc-async",
        "result:tc-async:async result",
        "assistant:processed tool result",
        "user:message after compaction",
    ]
    assert c.safe_spawn_point() == 7
    fresh = await manager(stores, child)
    assert fresh.history == c.history
    assert fresh.own_items() == c.own_items()
    assert (fresh.compacted_up_to, fresh.ancestor_prefix_len) == (3, 0)


async def test_compaction_in_child_before_its_first_own_row_is_refused(stores: Stores) -> None:
    conv, _ = stores
    root, child = uid("R"), uid("C")
    await seed(conv, root, user("r1"), call("tc-spawn", name="spawn_thread"))
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="tc-spawn", kind=ThreadKind.CHILD)
    hm = await manager(stores, child)
    await conv.save_summary(child, Summary("premature", 1))
    assert await hm.apply_compaction() is False
    assert hm.ancestor_prefix_len == 2


# ----------------------------------------------------------------------------------------------------------
# Interrupted tool calls


async def test_take_interrupted_tool_calls_accumulates_until_drained(stores: Stores) -> None:
    conv, _ = stores
    thread = uid("t")
    await seed(conv, thread, user("go"), call("tc-1"))
    hm = await manager(stores, thread)
    assert hm.take_interrupted_tool_calls() == []
    await hm.handle_content(user("stop"), "m-1")
    hm.turn.add(call("tc-2"), "c-1")
    hm.flush_turn()
    await hm.handle_content(user("stop again"), "m-2")
    assert hm.take_interrupted_tool_calls() == ["tc-1", "tc-2"]
    assert hm.take_interrupted_tool_calls() == []
    # An answered trailing call is never interrupted.
    hm.turn.add(call("tc-3"), "c-2")
    hm.flush_turn()
    await hm.handle_content(result("tc-3"), "m-3")
    await hm.handle_content(user("next"), "m-4")
    assert hm.take_interrupted_tool_calls() == []
