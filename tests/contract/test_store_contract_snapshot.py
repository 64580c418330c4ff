"""Contract: a thread snapshot (``load_snapshot``, what a step reads first) says exactly what the port's
separate reads say (``compose_snapshot``), on every store; ``incremental`` only when the caller's rows
still hold; and a state flag is ``False`` only when that state really is empty."""

from __future__ import annotations

from typing import Any

from stepagent.history_items import AssistantText, Summary, UserItem
from stepagent.messages import InputMessage, TextContent, UserChoiceRequired
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    DeferredInput,
    DispatchIntent,
    KnownRows,
    Rewind,
    StateStore,
    ThreadSnapshot,
    compose_snapshot,
    load_snapshot,
)
from tests.contract.conftest import StorePair


def user(text: str) -> tuple[UserItem, str]:
    return UserItem(content=TextContent(text=text)), f"m-{text}"


def view(snapshot: ThreadSnapshot) -> tuple[Any, ...]:
    rows = [(r.order, r.message_id, r.item, r.epoch) for r in snapshot.rows]
    return (
        snapshot.info,
        snapshot.summary,
        snapshot.summary_order,
        rows,
        snapshot.incremental,
        snapshot.metadata,
        snapshot.processed,
        snapshot.answered,
    )


async def both(
    conversation: ConversationStore, state: StateStore, thread: str, **kwargs: Any
) -> ThreadSnapshot:
    fast = await load_snapshot(conversation, state, thread, **kwargs)
    composed = await compose_snapshot(conversation, state, thread, **kwargs)
    assert view(fast) == view(composed)
    return fast


async def flags_are_sound(conversation: ConversationStore, state: StateStore, thread: str) -> None:
    snapshot = await load_snapshot(conversation, state, thread)
    if snapshot.open_intents is False:
        assert await state.open_intents(thread) == []
    if snapshot.deferred is False:
        assert await state.deferred_inputs(thread) == []
    if snapshot.choices is False:
        assert await state.pending_choices(thread) == []


async def test_snapshot_of_an_unknown_thread_is_empty(stores: StorePair) -> None:
    conversation, state = stores
    snapshot = await both(conversation, state, "nobody", message_ids=["a"], tool_call_ids=["c"])
    assert snapshot.info is None and snapshot.rows == [] and not snapshot.processed


async def test_snapshot_reads_head_summary_rows_metadata_and_dedup_ids(stores: StorePair) -> None:
    conversation, state = stores
    rows = [user(str(n)) for n in range(1, 6)]
    await conversation.commit(
        "t",
        Commit(
            expected_version=0,
            rows=rows,
            processed_message_ids=["p1"],
            answered_tool_calls=["c1"],
            metadata=("t", {"user_id": "u"}),
        ),
    )
    snapshot = await both(conversation, state, "t", message_ids=["p1", "p2"], tool_call_ids=["c1", "c2"])
    assert [r.order for r in snapshot.rows] == [1, 2, 3, 4, 5] and snapshot.summary is None
    assert snapshot.metadata == {"user_id": "u"}
    assert snapshot.processed == {"p1"} and snapshot.answered == {"c1"}
    await conversation.save_summary("t", Summary("S", 3))
    snapshot = await both(conversation, state, "t")
    assert snapshot.summary == Summary("S", 3) and snapshot.summary_order == 3
    assert [r.order for r in snapshot.rows] == [4, 5]


async def test_known_rows_are_continued_only_while_they_hold(stores: StorePair) -> None:
    conversation, state = stores
    info = await conversation.commit("t", Commit(expected_version=0, rows=[user("1"), user("2")]))
    known = KnownRows(info.version, info.epoch, info.tail, None)
    info = await conversation.commit("t", Commit(expected_version=info.version, rows=[user("3")]))
    snapshot = await both(conversation, state, "t", known=known)
    assert snapshot.incremental and [r.order for r in snapshot.rows] == [3]
    # A new summary: the caller's rows no longer are the thread's history after its summary.
    await conversation.save_summary("t", Summary("S", 1))
    snapshot = await both(conversation, state, "t", known=known)
    assert not snapshot.incremental and [r.order for r in snapshot.rows] == [2, 3]
    # A rewind (a new epoch) and new rows at the same orders: everything is read again.
    known = KnownRows(info.version, info.epoch, info.tail, 1)
    info = await conversation.rewind("t", Rewind(expected_version=info.version, to_order=2))
    info = await conversation.commit(
        "t", Commit(expected_version=info.version, rows=[(AssistantText("new 3"), "n3")])
    )
    snapshot = await both(conversation, state, "t", known=known)
    assert not snapshot.incremental
    assert [(r.order, r.item) for r in snapshot.rows] == [(2, user("2")[0]), (3, AssistantText("new 3"))]


async def test_a_state_flag_says_none_only_when_there_is_none(stores: StorePair) -> None:
    conversation, state = stores
    info = await conversation.commit("t", Commit(expected_version=0, rows=[user("1")]))
    await flags_are_sound(conversation, state, "t")
    held = DeferredInput("d1", InputMessage.user_text("t", "held"))
    info = await conversation.commit(
        "t",
        Commit(
            expected_version=info.version,
            intents_added=[DispatchIntent("c1", "lookup", {})],
            deferred_added=[held],
        ),
    )
    await flags_are_sound(conversation, state, "t")
    await state.add_pending_choice(
        "t", UserChoiceRequired(id="ch1", prompt="?", choices=["a", "b"], response_url="https://x/r")
    )
    await flags_are_sound(conversation, state, "t")
    await state.mark_intent_done("t", "c1")
    await state.mark_intent_done("t", "c1")  # twice: idempotent
    await state.remove_pending_choice("t", "ch1")
    await flags_are_sound(conversation, state, "t")
    info = await conversation.commit("t", Commit(expected_version=info.version, deferred_removed=["d1"]))
    snapshot = await load_snapshot(conversation, state, "t")
    await flags_are_sound(conversation, state, "t")
    assert (
        snapshot.open_intents is not True and snapshot.deferred is not True and snapshot.choices is not True
    )
    # Adding and releasing in one commit, then a rewind that cleans up: still sound.
    info = await conversation.commit(
        "t",
        Commit(
            expected_version=info.version,
            deferred_added=[DeferredInput("d2", held.message), DeferredInput("d3", held.message)],
            deferred_removed=["d2"],
            intents_added=[DispatchIntent("c2", "lookup", {})],
        ),
    )
    await flags_are_sound(conversation, state, "t")
    assert [d.message_id for d in await state.deferred_inputs("t")] == ["d3"]
    await conversation.rewind("t", Rewind(expected_version=info.version, to_order=0))
    await flags_are_sound(conversation, state, "t")


async def test_a_choice_before_the_first_commit_is_not_hidden_by_the_flags(stores: StorePair) -> None:
    conversation, state = stores
    choice = UserChoiceRequired(id="early", prompt="?", choices=["a"], response_url="https://x/r")
    await state.add_pending_choice("new", choice)  # no head yet
    await conversation.commit("new", Commit(expected_version=0, rows=[user("1")]))
    await flags_are_sound(conversation, state, "new")
    assert [c.id for c in await state.pending_choices("new")] == ["early"]
