"""Contract: a step's usage record lands atomically with its commit, keyed by the head version that commit
produced, and stays through rewinds — on every store."""

from __future__ import annotations

import uuid

import pytest

from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import UserItem
from stepagent.messages import TextContent
from stepagent.stores.base import Commit, ConversationStore, Rewind, StateStore, UsageRecord

StorePair = tuple[ConversationStore, StateStore]


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def record(step: str, tokens: int, *, done: bool = True) -> UsageRecord:
    return UsageRecord(
        step_id=step,
        model="anthropic:claude-sonnet-4-6",
        input_tokens=tokens,
        output_tokens=tokens // 10,
        cache_read_tokens=3,
        cache_write_tokens=4,
        completions=2,
        turn_complete=done,
    )


async def records(conv: ConversationStore, thread: str, after: int = 0) -> list[UsageRecord]:
    return [r async for r in conv.usage_records(thread, after_version=after)]


async def test_a_usage_record_is_stored_under_its_commits_version(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    row = (UserItem(TextContent(text="hi")), uid("m"))
    first = await conv.commit(
        thread, Commit(expected_version=0, rows=[row], usage=record("m1", 100, done=False))
    )
    second = await conv.commit(thread, Commit(expected_version=1, usage=record("m2", 250)))  # usage alone
    assert (first.version, second.version, second.tail) == (1, 2, 1)  # a usage-only commit is a commit
    stored = await records(conv, thread)
    assert stored == [
        UsageRecord("m1", "anthropic:claude-sonnet-4-6", 100, 10, 3, 4, 2, False, version=1),
        UsageRecord("m2", "anthropic:claude-sonnet-4-6", 250, 25, 3, 4, 2, True, version=2),
    ]
    assert await records(conv, thread, after=1) == stored[1:]
    assert await records(conv, thread, after=2) == []
    assert await records(conv, uid("other")) == []


async def test_a_usage_record_keeps_the_tail_of_its_commit(stores: StorePair) -> None:
    # Where a turn's end falls among the rows: the HTTP API's event stream places turn_complete by it.
    conv, _ = stores
    thread = uid("t")
    rows = [(UserItem(TextContent(text=str(i))), uid("m")) for i in range(3)]
    await conv.commit(thread, Commit(expected_version=0, rows=rows[:2], usage=record("m1", 10)))
    await conv.commit(thread, Commit(expected_version=1, usage=record("m2", 10)))
    await conv.commit(thread, Commit(expected_version=2, rows=rows[2:], usage=record("m3", 10)))
    assert [(r.version, r.tail) for r in await records(conv, thread)] == [(1, 2), (2, 2), (3, 3)]


async def test_a_refused_commit_stores_no_usage(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await conv.commit(thread, Commit(expected_version=0, usage=record("m1", 10)))
    with pytest.raises(ConcurrentWriteError):
        await conv.commit(thread, Commit(expected_version=0, usage=record("loser", 999)))
    assert [r.step_id for r in await records(conv, thread)] == ["m1"]


async def test_usage_survives_a_rewind_and_later_commits_get_new_versions(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    rows = [(UserItem(TextContent(text=str(n))), uid("m")) for n in range(3)]
    await conv.commit(thread, Commit(expected_version=0, rows=rows, usage=record("m1", 10)))
    rewound = await conv.rewind(thread, Rewind(expected_version=1, to_order=1))
    await conv.commit(thread, Commit(expected_version=rewound.version, usage=record("m2", 20)))
    stored = await records(conv, thread)
    assert [(r.step_id, r.version) for r in stored] == [("m1", 1), ("m2", rewound.version + 1)]


async def test_a_commit_over_the_transaction_limits_still_stores_its_usage(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    rows = [(UserItem(TextContent(text=f"row {n}")), uid("m")) for n in range(130)]  # > 100 actions
    info = await conv.commit(thread, Commit(expected_version=0, rows=rows, usage=record("big", 7)))
    assert info.tail == 130
    assert [(r.step_id, r.version) for r in await records(conv, thread)] == [("big", 1)]
