"""Contract: the call index, the compaction claim and child listing (run against every store)."""

from __future__ import annotations

import uuid

import pytest

from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import UserItem
from stepagent.messages import TextContent, ToolCall
from stepagent.stores.base import Commit, ConversationStore, StateStore, ThreadKind

StorePair = tuple[ConversationStore, StateStore]


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def test_indexed_calls_are_committed_atomically_and_found_by_id(stores: StorePair) -> None:
    conversation, state = stores
    thread = uid("t")
    call = ToolCall(
        id=uid("call"), name="spawn_thread", arguments={"instructions": "x", "child_of": [thread]}
    )
    await conversation.commit(
        thread,
        Commit(expected_version=0, rows=[(UserItem(TextContent(text="hi")), "m1")], indexed_calls=[call]),
    )
    assert await state.indexed_call(thread, call.id) == call
    assert await state.indexed_call(thread, "missing") is None
    assert await state.indexed_call(uid("other"), call.id) is None


async def test_a_failed_commit_indexes_nothing(stores: StorePair) -> None:
    conversation, state = stores
    thread = uid("t")
    await conversation.commit(
        thread, Commit(expected_version=0, rows=[(UserItem(TextContent(text="a")), "m1")])
    )
    call = ToolCall(id=uid("call"), name="subscribe")
    with pytest.raises(ConcurrentWriteError):
        await conversation.commit(thread, Commit(expected_version=0, indexed_calls=[call]))
    assert await state.indexed_call(thread, call.id) is None


async def test_compaction_claim_is_exclusive_until_released_or_expired(stores: StorePair) -> None:
    _, state = stores
    thread = uid("t")
    assert await state.claim_compaction(thread, "first", now=100.0, lease_seconds=60)
    assert await state.claim_compaction(thread, "first", now=110.0, lease_seconds=60)  # idempotent re-claim
    assert not await state.claim_compaction(thread, "second", now=150.0, lease_seconds=60)
    assert await state.claim_compaction(thread, "second", now=171.0, lease_seconds=60)  # first lease expired
    await state.release_compaction(thread)
    assert await state.claim_compaction(thread, "third", now=172.0, lease_seconds=60)
    assert await state.claim_compaction(uid("other"), "x", now=172.0, lease_seconds=60)  # per thread


async def test_children_are_listed_in_spawn_order(stores: StorePair) -> None:
    conversation, _ = stores
    parent = uid("p")
    first = await conversation.spawn_thread(
        parent, child_id=uid("c1"), spawn_tool_call_id="s1", kind=ThreadKind.CHILD
    )
    second = await conversation.spawn_thread(
        parent, child_id=uid("c2"), spawn_tool_call_id="s2", kind=ThreadKind.COMPACTION, spawn_order=0
    )
    await conversation.spawn_thread(
        parent, child_id=first.thread_id, spawn_tool_call_id="s1", kind=ThreadKind.CHILD
    )
    await conversation.spawn_thread(
        first.thread_id, child_id=uid("g"), spawn_tool_call_id="s3", kind=ThreadKind.CHILD
    )
    children = await conversation.children(parent)
    assert [c.thread_id for c in children] == [first.thread_id, second.thread_id]
    assert [c.kind for c in children] == [ThreadKind.CHILD, ThreadKind.COMPACTION]
    assert await conversation.children(uid("nobody")) == []
