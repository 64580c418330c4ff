"""Contract: rewind, staged whole-history replacement and generation sweeping (run against every store).

Only protocol methods are used; every test works on fresh ids."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest

from stepagent.core.ancestors import load_history_with_ancestors
from stepagent.errors import ConcurrentWriteError, InvalidRewindError
from stepagent.history_items import HistoryItem, Summary, ToolCallItem, ToolResultItem, UserItem
from stepagent.messages import InputMessage, TextContent, ToolCall, ToolResult, UserChoiceRequired
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    DeferredInput,
    DispatchIntent,
    HistoryEntry,
    Replacement,
    Rewind,
    StateCleanup,
    StateStore,
    ThreadInfo,
    ThreadKind,
    replace_history,
)

StorePair = tuple[ConversationStore, StateStore]
LATER = 10**10  # a sweep "now" after every lease


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def rows(prefix: str, n: int) -> list[tuple[HistoryItem, str]]:
    return [(user(f"{prefix} {i}"), f"{prefix}-m{i}") for i in range(n)]


async def texts(conv: ConversationStore, thread: str) -> list[str]:
    out = []
    async for row in conv.load_rows(thread):
        assert isinstance(row.item, UserItem)
        out.append(row.item.text or "")
    return out


async def seeded(conv: ConversationStore, thread: str, n: int, prefix: str = "old") -> ThreadInfo:
    return await conv.commit(thread, Commit(expected_version=0, rows=rows(prefix, n)))


def intent(tool_call_id: str) -> DispatchIntent:
    return DispatchIntent(tool_call_id=tool_call_id, tool_name="remote", arguments={"q": 1})


def deferred(thread: str, message_id: str) -> DeferredInput:
    message = InputMessage.tool_result(thread, ToolResult.text("sub", "event"), synthetic="sub")
    return DeferredInput(message_id=message_id, message=message)


# ---- rewind ----------------------------------------------------------------------------------------------


async def test_rewind_cuts_the_tail_and_the_next_commit_overwrites_the_rest(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await seeded(conv, thread, 5)
    info = await conv.rewind(thread, Rewind(expected_version=1, to_order=2))
    assert (info.version, info.tail) == (2, 2)
    assert await conv.get_thread(thread) == info
    assert await texts(conv, thread) == ["old 0", "old 1"]
    after = await conv.commit(thread, Commit(expected_version=2, rows=rows("new", 1)))
    assert (after.version, after.tail) == (3, 3)
    assert await texts(conv, thread) == ["old 0", "old 1", "new 0"]


async def epochs(conv: ConversationStore, thread: str) -> list[tuple[int, int]]:
    return [(row.order, row.epoch) async for row in conv.load_rows(thread)]


async def test_rewinds_and_replacements_start_a_new_epoch_that_new_rows_carry(stores: StorePair) -> None:
    """Orders are reused after a rewind; (order, epoch) never is (output event ids depend on it)."""
    conv, _ = stores
    thread = uid("t")
    first = await seeded(conv, thread, 3)
    assert first.epoch == 0 and await epochs(conv, thread) == [(1, 0), (2, 0), (3, 0)]
    info = await conv.rewind(thread, Rewind(expected_version=1, to_order=1))
    assert info.epoch == 1 and (await conv.get_thread(thread)) == info
    after = await conv.commit(thread, Commit(expected_version=2, rows=rows("new", 2)))
    assert after.epoch == 1 and await epochs(conv, thread) == [(1, 0), (2, 1), (3, 1)]
    replaced = await replace_history(conv, thread, after.version, rows("swap", 2))
    assert replaced.epoch == 2 and await epochs(conv, thread) == [(1, 2), (2, 2)]
    fresh = uid("fresh")  # a new thread's history was never published: it starts at epoch 0
    assert (await replace_history(conv, fresh, 0, rows("imported", 1))).epoch == 0
    assert await epochs(conv, fresh) == [(1, 0)]


async def test_rewind_to_zero_and_bounds(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await seeded(conv, thread, 3)
    with pytest.raises(InvalidRewindError):
        await conv.rewind(thread, Rewind(expected_version=1, to_order=4))
    with pytest.raises(InvalidRewindError):
        await conv.rewind(thread, Rewind(expected_version=1, to_order=-1))
    info = await conv.rewind(thread, Rewind(expected_version=1, to_order=0))
    assert info.tail == 0 and await texts(conv, thread) == []
    with pytest.raises(ConcurrentWriteError):
        await conv.rewind(uid("nobody"), Rewind(expected_version=0, to_order=0))


async def test_rewind_with_a_stale_version_changes_nothing(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(thread, Commit(expected_version=0, rows=rows("old", 3), intents_added=[intent("c1")]))
    await conv.save_summary(thread, Summary(text="s3", up_to_order=3))
    with pytest.raises(ConcurrentWriteError):
        await conv.rewind(
            thread,
            Rewind(
                expected_version=0, to_order=1, summaries_removed=[3], cleanup=StateCleanup(intents=["c1"])
            ),
        )
    assert (await conv.get_thread(thread)) == ThreadInfo(thread_id=thread, root_id=thread, version=1, tail=3)
    assert await conv.latest_summary(thread) == Summary(text="s3", up_to_order=3)
    assert [i.tool_call_id for i in await state.open_intents(thread)] == ["c1"]


async def test_rewind_drops_summaries_and_applies_the_cleanup(stores: StorePair) -> None:
    conv, state = stores
    thread, root = uid("t"), uid("root")
    call = ToolCall(id="call-x", name="subscribe")
    await conv.commit(
        thread,
        Commit(
            expected_version=0,
            rows=rows("old", 6),
            processed_message_ids=["in-1", "in-2"],
            answered_tool_calls=["a-1", "a-2"],
            intents_added=[intent("c1"), intent("c2")],
            subscriptions_added=["s1", "s2"],
            deferred_added=[deferred(thread, "d1"), deferred(thread, "d2")],
            indexed_calls=[call],
        ),
    )
    choice = UserChoiceRequired(id="ch1", prompt="?", choices=["a"], response_url="https://x/r")
    await state.add_pending_choice(thread, choice)
    assert await state.claim_compaction(thread, "claim", now=1.0, lease_seconds=1e9)
    for order in (2, 4, 6):
        await conv.save_summary(thread, Summary(text=f"s{order}", up_to_order=order))
    child = await conv.spawn_thread(thread, child_id=uid("c"), spawn_tool_call_id="sp", kind=ThreadKind.CHILD)
    await conv.spawn_thread(root, child_id=uid("other"), spawn_tool_call_id="x", kind=ThreadKind.CHILD)

    cleanup = StateCleanup(
        intents=["c2"],
        subscriptions=["s2"],
        deferred=["d2"],
        choices=["ch1"],
        indexed_calls=["call-x"],
        answered=["a-2"],
        processed=["in-2"],
        close_threads=[child.thread_id],
        release_compaction=True,
    )
    await conv.rewind(
        thread, Rewind(expected_version=1, to_order=3, summaries_removed=[4, 6], cleanup=cleanup)
    )

    assert await conv.latest_summary(thread) == Summary(text="s2", up_to_order=2)
    assert [i.tool_call_id for i in await state.open_intents(thread)] == ["c1"]
    assert await state.active_subscriptions(thread) == {"s1"}
    assert [d.message_id for d in await state.deferred_inputs(thread)] == ["d1"]
    assert await state.pending_choices(thread) == []
    assert await state.indexed_call(thread, "call-x") is None
    assert await state.filter_answered(thread, ["a-1", "a-2"]) == {"a-1"}
    assert await state.filter_processed(thread, ["in-1", "in-2"]) == {"in-1"}
    closed = await conv.get_thread(child.thread_id)
    assert closed is not None and closed.closed
    assert await state.claim_compaction(thread, "another", now=2.0, lease_seconds=10)


# ---- staged replacement ----------------------------------------------------------------------------------


async def entries_of(items: list[HistoryEntry]) -> AsyncIterator[HistoryEntry]:
    for entry in items:
        yield entry


async def test_replacement_swaps_rows_and_summaries_and_keeps_the_record(stores: StorePair) -> None:
    conv, _ = stores
    root = uid("root")
    await seeded(conv, root, 2)
    child = uid("child")
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="sp", kind=ThreadKind.CHILD)
    await conv.commit(child, Commit(expected_version=0, rows=rows("old", 40)))
    await conv.save_summary(child, Summary(text="old summary", up_to_order=30))
    await conv.save_summary(child, Summary(text="kept order", up_to_order=5))

    new: list[HistoryEntry] = [*rows("new", 60), Summary("new summary", 50), Summary("replaced", 5)]
    info = await replace_history(conv, child, 1, entries_of(new))
    assert (info.version, info.tail, info.parent_id, info.root_id) == (2, 60, root, root)
    assert info.spawn_tool_call_id == "sp" and info.kind == ThreadKind.CHILD
    assert await conv.get_thread(child) == info
    assert await texts(conv, child) == [f"new {i}" for i in range(60)]
    assert await conv.latest_summary(child) == Summary("new summary", 50)
    assert await conv.latest_summary(child, up_to=49) == Summary("replaced", 5)
    loaded = await load_history_with_ancestors(conv, child)
    assert loaded.compacted_up_to == 50 and len(loaded.items) == 11
    # A commit appends to the new generation; a rewind cuts it.
    info = await conv.commit(child, Commit(expected_version=2, rows=rows("more", 2)))
    assert (await texts(conv, child))[-3:] == ["new 59", "more 0", "more 1"]
    info = await conv.rewind(child, Rewind(expected_version=info.version, to_order=10))
    assert await texts(conv, child) == [f"new {i}" for i in range(10)]
    assert [c.thread_id for c in await conv.children(root)] == [child]


async def test_replacement_creates_a_child_and_lands_state_with_the_flip(stores: StorePair) -> None:
    conv, state = stores
    parent = uid("p")
    await seeded(conv, parent, 3)
    first = await conv.spawn_thread(
        parent, child_id=uid("c1"), spawn_tool_call_id="s1", kind=ThreadKind.CHILD
    )
    child = uid("c2")
    record = ThreadInfo(
        thread_id=child,
        root_id=parent,
        parent_id=parent,
        spawn_order=2,
        spawn_tool_call_id="s2",
        kind=ThreadKind.SUBSCRIPTION_EVENT,
        closed=True,
    )
    call = ToolCall(id="sub-call", name="subscribe")
    state_added = Commit(
        expected_version=0,
        intents_added=[intent("c9")],
        subscriptions_added=["sub-call"],
        deferred_added=[deferred(child, "d9")],
        indexed_calls=[call],
        metadata=(parent, {"k": "v"}),
    )
    staging = await conv.stage_history(child, 0)
    await staging.add(rows("x", 3))
    assert await conv.get_thread(child) is None  # nothing visible before the flip
    info = await staging.flip(Replacement(record=record, state=state_added))
    assert info == ThreadInfo(
        thread_id=child,
        root_id=parent,
        parent_id=parent,
        spawn_order=2,
        spawn_tool_call_id="s2",
        kind=ThreadKind.SUBSCRIPTION_EVENT,
        closed=True,
        version=1,
        tail=3,
    )
    assert [c.thread_id for c in await conv.children(parent)] == [first.thread_id, child]
    assert [i.tool_call_id for i in await state.open_intents(child)] == ["c9"]
    assert await state.active_subscriptions(child) == {"sub-call"}
    assert [d.message_id for d in await state.deferred_inputs(child)] == ["d9"]
    assert await state.indexed_call(child, "sub-call") == call
    assert await state.get_metadata(parent) == {"k": "v"}


async def test_replacement_cleanup_replaces_old_state(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(
        thread,
        Commit(
            expected_version=0, rows=rows("old", 2), intents_added=[intent("c1")], answered_tool_calls=["z"]
        ),
    )
    replacement = Replacement(
        state=Commit(expected_version=0, intents_added=[intent("c2")]),
        cleanup=StateCleanup(intents=["c1", "c2"], answered=["z"]),  # c2 is added, so not deleted
    )
    await replace_history(conv, thread, 1, rows("new", 1), replacement)
    assert [i.tool_call_id for i in await state.open_intents(thread)] == ["c2"]
    assert await state.filter_answered(thread, ["z"]) == set()


async def test_a_commit_between_staging_and_flip_wins_and_the_staging_is_swept(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await seeded(conv, thread, 2)
    staging = await conv.stage_history(thread, 1)
    await staging.add(rows("new", 30))
    assert await texts(conv, thread) == ["old 0", "old 1"]  # readers follow the head, not the staging
    await conv.commit(thread, Commit(expected_version=1, rows=rows("step", 1)))
    with pytest.raises(ConcurrentWriteError):
        await staging.flip(Replacement())
    assert await texts(conv, thread) == ["old 0", "old 1", "step 0"]
    assert await conv.sweep_generations(thread, now=time.time(), lease_seconds=600) == 0  # still leased
    assert await conv.sweep_generations(thread, now=LATER, lease_seconds=600) == 30
    assert await conv.sweep_generations(thread, now=LATER, lease_seconds=600) == 0
    assert await texts(conv, thread) == ["old 0", "old 1", "step 0"]


async def test_stage_checks_the_version_and_a_later_staging_dooms_an_earlier_one(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await seeded(conv, thread, 1)
    with pytest.raises(ConcurrentWriteError):
        await conv.stage_history(thread, 0)
    with pytest.raises(ConcurrentWriteError):
        await conv.stage_history(uid("nobody"), 3)
    first = await conv.stage_history(thread, 1)
    await first.add(rows("first", 2))
    second = await conv.stage_history(thread, 1)
    await second.add(rows("second", 3))
    with pytest.raises(ConcurrentWriteError):
        await first.flip(Replacement())
    info = await second.flip(Replacement())
    assert (info.version, info.tail) == (2, 3)
    assert await texts(conv, thread) == ["second 0", "second 1", "second 2"]
    # The first staging and the original generation are both debris now.
    assert await conv.sweep_generations(thread, now=LATER, lease_seconds=600) == 3


async def test_a_new_thread_flip_loses_to_a_concurrent_creation(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    staging = await conv.stage_history(thread, 0)
    await staging.add(rows("import", 2))
    await conv.commit(thread, Commit(expected_version=0, rows=rows("live", 1)))
    with pytest.raises(ConcurrentWriteError):
        await staging.flip(Replacement())
    await staging.abandon()
    assert await texts(conv, thread) == ["live 0"]


async def test_abandon_and_an_expired_pending_mark(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await seeded(conv, thread, 2)
    abandoned = await conv.stage_history(thread, 1)
    await abandoned.add(rows("gone", 4))
    await abandoned.abandon()
    assert await conv.sweep_generations(thread, now=LATER, lease_seconds=600) == 0  # nothing left over
    stalled = await conv.stage_history(thread, 1)
    await stalled.add(rows("stalled", 3))
    # The sweep clears the expired mark: the stalled writer can no longer flip over the thread.
    assert await conv.sweep_generations(thread, now=LATER, lease_seconds=600) == 3
    with pytest.raises(ConcurrentWriteError):
        await stalled.flip(Replacement())
    assert await texts(conv, thread) == ["old 0", "old 1"]
    info = await replace_history(conv, thread, 1, rows("fresh", 1))
    assert info.version == 2 and await texts(conv, thread) == ["fresh 0"]


async def test_replacement_to_an_empty_history_and_pairs_survive(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await seeded(conv, thread, 3)
    info = await replace_history(conv, thread, 1, [])
    assert (info.version, info.tail) == (2, 0) and await texts(conv, thread) == []
    call = ToolCallItem(ToolCall(id="c", name="lookup", arguments={"big": "y" * 400_000}))
    result = ToolResultItem(ToolResult.text("c", "z" * 400_000))
    info = await replace_history(conv, thread, 2, [(call, "m1"), (result, "c")])
    assert [row.item async for row in conv.load_rows(thread)] == [call, result]


async def test_children_of_a_thread_without_a_head_stay_hidden_until_it_exists(stores: StorePair) -> None:
    conv, _ = stores
    root, child = uid("root"), uid("child")
    record = ThreadInfo(
        thread_id=child,
        root_id=root,
        parent_id=root,
        spawn_order=0,
        spawn_tool_call_id="sp",
        kind=ThreadKind.CHILD,
    )
    await replace_history(conv, child, 0, rows("child", 1), Replacement(record=record))
    assert await conv.children(root) == []  # the child exists, its parent not yet
    info = await replace_history(conv, root, 0, rows("root", 2))
    assert info.tail == 2 and [c.thread_id for c in await conv.children(root)] == [child]
