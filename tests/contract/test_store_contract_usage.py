"""Contract: a step's usage record lands atomically with its commit, keyed by the head version that commit
produced, and stays through rewinds — on every store."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import UserItem
from stepagent.messages import TextContent
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    Rewind,
    Spend,
    StateStore,
    ThreadKind,
    UsageRecord,
    load_snapshot,
)
from stepagent.stores.dynamodb.io import TransactionCancelled
from tests.conftest import DynamoEnv

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


# ---- the conversation's spend: kept with the root, added to by every usage record of the tree ----------


def priced(step: str, tokens: int, cost: float | None) -> UsageRecord:
    return dataclasses.replace(record(step, tokens), cost_usd=cost, output='{"ok": true}')


async def test_every_usage_record_of_the_tree_adds_to_the_roots_spend(stores: StorePair) -> None:
    conv, state = stores
    root = uid("r")
    await conv.commit(root, Commit(expected_version=0, usage=priced("m1", 100, 0.25)))
    child = uid("c")
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id=uid("call"), kind=ThreadKind.CHILD)
    await conv.commit(child, Commit(expected_version=0, usage=priced("c1", 50, None)))  # no price known
    # 100 + 10 + 3 + 4 and 50 + 5 + 3 + 4 tokens; only the priced record adds dollars.
    assert await state.spend(root) == Spend(117 + 62, 0.25)
    assert await state.spend(child) == Spend()  # kept with the root only
    assert [r.output for r in await records(conv, root)] == ['{"ok": true}']
    [stored] = await records(conv, root)
    assert stored.cost_usd == 0.25 and stored.tokens == 117
    # What a child's step reads first carries the root's spend.
    snapshot = await load_snapshot(conv, state, child)
    assert snapshot.spend == Spend(179, 0.25)


async def test_metadata_and_spend_share_the_roots_item_without_losing_either(stores: StorePair) -> None:
    conv, state = stores
    root = uid("r")
    await conv.commit(root, Commit(expected_version=0, usage=priced("m1", 10, 0.5)))
    assert await state.get_metadata(root) is None  # spend alone is not metadata
    # Metadata and usage in one commit (one write of the root's item), then metadata alone.
    await conv.commit(
        root, Commit(expected_version=1, metadata=(root, {"profile": "a"}), usage=priced("m2", 10, 0.5))
    )
    assert (await state.get_metadata(root), await state.spend(root)) == ({"profile": "a"}, Spend(36, 1.0))
    await state.set_metadata(root, {"profile": "b"})
    await conv.commit(root, Commit(expected_version=2, metadata=(root, {"profile": "c"})))
    assert (await state.get_metadata(root), await state.spend(root)) == ({"profile": "c"}, Spend(36, 1.0))
    snapshot = await load_snapshot(conv, state, root)
    assert (snapshot.metadata, snapshot.spend) == ({"profile": "c"}, Spend(36, 1.0))


async def test_the_turns_model_call_count_rides_on_the_head(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    row = (UserItem(TextContent(text="hi")), uid("m"))
    info = await conv.commit(thread, Commit(expected_version=0, rows=[row], turn_model_calls=3))
    assert info.turn_model_calls == 3
    info = await conv.commit(
        thread, Commit(expected_version=1, rows=[(UserItem(TextContent(text="x")), uid("m"))])
    )
    assert info.turn_model_calls == 3  # unchanged when a commit does not say
    stored = await conv.get_thread(thread)
    assert stored is not None and stored.turn_model_calls == 3
    await conv.commit(thread, Commit(expected_version=2, usage=record("m", 1), turn_model_calls=0))
    stored = await conv.get_thread(thread)
    assert stored is not None and stored.turn_model_calls == 0


async def test_a_persons_pace_rides_on_the_head(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    row = (UserItem(TextContent(text="hi")), uid("m"))
    info = await conv.commit(
        thread, Commit(expected_version=0, rows=[row], turn_complete=True, turn_ended_at=100.5)
    )
    assert (info.turn_ended_at, info.person_gap) == (100.5, None)
    row = (UserItem(TextContent(text="again")), uid("m"))
    info = await conv.commit(thread, Commit(expected_version=1, rows=[row], person_gap=420.25))
    assert (info.turn_ended_at, info.person_gap) == (100.5, 420.25)  # a commit that does not say keeps it
    stored = await conv.get_thread(thread)
    assert stored is not None and (stored.turn_ended_at, stored.person_gap) == (100.5, 420.25)


async def test_a_conflict_on_the_roots_item_is_tried_again_and_one_on_the_head_is_not(
    dynamo: DynamoEnv,
) -> None:
    """Two threads of one tree committing at the same moment both write the root's metadata item (the
    spend); DynamoDB cancels one with TransactionConflict. The commit tries again — the head's condition
    still guards it — instead of failing the step (whose re-run would repeat its model call)."""
    conv, state = dynamo.stores()
    real = conv._io.call
    cancellations = [["None", "TransactionConflict"], ["TransactionConflict", "None"]]
    seen: list[str] = []

    async def flaky(op: str, table: str, **kwargs: Any) -> Any:
        if op == "TransactWriteItems" and cancellations:
            seen.append(kwargs["ClientRequestToken"])
            raise TransactionCancelled(cancellations.pop(0))
        return await real(op, table, **kwargs)

    conv._io.call = flaky  # type: ignore[method-assign]
    root = uid("r")
    # First: a conflict on the root's item only, then success on the next try (a fresh token).
    cancellations[:] = [["None", "TransactionConflict"]]
    info = await conv.commit(root, Commit(expected_version=0, usage=priced("m1", 10, 0.5)))
    assert info.version == 1 and len(seen) == 1 and await state.spend(root) == Spend(18, 0.5)
    # A conflict on the head: another writer of this very thread; the step must re-run.
    cancellations[:] = [["TransactionConflict", "None"]]
    with pytest.raises(ConcurrentWriteError):
        await conv.commit(root, Commit(expected_version=1, usage=priced("m2", 10, 0.5)))
    assert await state.spend(root) == Spend(18, 0.5)


async def test_tiny_costs_round_trip(stores: StorePair) -> None:
    conv, state = stores
    root = uid("r")
    await conv.commit(root, Commit(expected_version=0, usage=priced("m1", 1, 1e-07)))
    await conv.commit(root, Commit(expected_version=1, usage=priced("m2", 1, 2.5e-08)))
    assert [r.cost_usd for r in await records(conv, root)] == [pytest.approx(1e-07), pytest.approx(2.5e-08)]
    assert (await state.spend(root)).cost_usd == pytest.approx(1.25e-07)
