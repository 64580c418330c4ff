"""Contract: a summary's call-id filter (``Summary.call_ids``) is stored with it and read back with it by
every reader — ``latest_summary``, the cold snapshot (DynamoDB: the ``SUMMARY`` copy in the one
``BatchGetItem``, or the ``S#`` item when the copy is stale), rewinds and replaced histories — and a summary
without one reads as unknown (``None``). On top of it, ``HistoryManager.tool_call_id_taken`` reads the
answered markers only when the filter cannot rule an id out; its answers are the same as without a filter.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from stepagent.call_id_filter import FORMAT, CallIdFilter
from stepagent.core.effects import StoreToolAccess
from stepagent.core.history import HistoryManager
from stepagent.history_items import Summary, ToolCallItem, ToolResultItem, UserItem, hidden_call_ids
from stepagent.messages import TextContent, ToolCall, ToolResult
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    Replacement,
    Rewind,
    StateStore,
    ThreadKind,
    compose_snapshot,
    load_snapshot,
    replace_history,
)
from stepagent.stores.dynamodb import DynamoConversationStore
from tests.conftest import DynamoEnv
from tests.contract.conftest import StorePair

FILTER = CallIdFilter.of(["c-1", "c-2"])


def turn(n: int) -> list[tuple[Any, str]]:
    """User text, a call ``c-{n}`` and its result."""
    call = ToolCall(id=f"c-{n}", name="lookup", arguments={})
    return [
        (UserItem(TextContent(text=f"ask {n}")), f"u-{n}"),
        (ToolCallItem(call=call), f"call-{n}"),
        (ToolResultItem(result=ToolResult.text(call.id, "out")), f"c-{n}"),
    ]


async def seeded(conversation: ConversationStore, thread: str, turns: int) -> None:
    rows = [row for n in range(1, turns + 1) for row in turn(n)]
    answered = [f"c-{n}" for n in range(1, turns + 1)]
    await conversation.commit(thread, Commit(expected_version=0, rows=rows, answered_tool_calls=answered))


async def test_the_filter_round_trips_with_the_summary(stores: StorePair) -> None:
    conversation, state = stores
    await seeded(conversation, "t", 3)
    await conversation.save_summary("t", Summary("S", 6, call_ids=FILTER))
    found = await conversation.latest_summary("t")
    assert found == Summary("S", 6) and found is not None and found.call_ids == FILTER
    for snapshot in (
        await load_snapshot(conversation, state, "t"),
        await compose_snapshot(conversation, state, "t"),
    ):
        assert snapshot.summary is not None and snapshot.summary.call_ids == FILTER
    # A second save at the same order replaces the first, filter and all (here: unknown).
    await conversation.save_summary("t", Summary("S again", 6))
    found = await conversation.latest_summary("t")
    assert found is not None and found.text == "S again" and found.call_ids is None
    snapshot = await load_snapshot(conversation, state, "t")
    assert snapshot.summary is not None and snapshot.summary.call_ids is None


async def test_an_older_summary_keeps_its_own_filter(stores: StorePair) -> None:
    conversation, state = stores
    await seeded(conversation, "t", 3)
    await conversation.save_summary("t", Summary("newer", 6, call_ids=FILTER))
    older = CallIdFilter.of(["c-1"])
    await conversation.save_summary("t", Summary("older", 3, call_ids=older))  # older than the latest
    latest, earlier = await conversation.latest_summary("t"), await conversation.latest_summary("t", 5)
    assert latest is not None and latest.call_ids == FILTER
    assert earlier is not None and earlier.up_to_order == 3 and earlier.call_ids == older
    snapshot = await load_snapshot(conversation, state, "t")
    assert snapshot.summary is not None and snapshot.summary.call_ids == FILTER


async def test_rewind_keeps_the_filters_of_the_summaries_it_keeps(stores: StorePair) -> None:
    conversation, state = stores
    await seeded(conversation, "t", 3)
    older = CallIdFilter.of(["c-1"])
    await conversation.save_summary("t", Summary("older", 3, call_ids=older))
    await conversation.save_summary("t", Summary("newer", 6, call_ids=FILTER))
    info = await conversation.get_thread("t")
    assert info is not None
    await conversation.rewind("t", Rewind(expected_version=info.version, to_order=4, summaries_removed=[6]))
    kept = await conversation.latest_summary("t")
    assert kept is not None and kept.up_to_order == 3 and kept.call_ids == older
    snapshot = await load_snapshot(conversation, state, "t")  # the head's copy token is gone: S# is read
    assert snapshot.summary is not None and snapshot.summary.call_ids == older


async def test_a_replaced_history_stores_the_filters_it_is_given(stores: StorePair) -> None:
    conversation, state = stores
    await seeded(conversation, "t", 1)
    rows = [row for n in range(1, 4) for row in turn(n)]
    entries = [*rows, Summary("known", 6, call_ids=FILTER), Summary("unknown", 3)]
    await replace_history(conversation, "t", 1, entries, Replacement())
    latest, earlier = await conversation.latest_summary("t"), await conversation.latest_summary("t", 5)
    assert latest is not None and latest.call_ids == FILTER
    assert earlier is not None and earlier.call_ids is None
    snapshot = await load_snapshot(conversation, state, "t")
    assert snapshot.summary is not None and snapshot.summary.call_ids == FILTER


# ---- the check on top of it: same answers, fewer reads ---------------------------------------------------


class AnsweredReads:
    """A state store that records every ``filter_answered`` question."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.asked: list[str] = []

    async def filter_answered(self, thread_id: str, tool_call_ids: Sequence[str]) -> set[str]:
        self.asked.extend(tool_call_ids)
        return await self.inner.filter_answered(thread_id, tool_call_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def loaded(stores: StorePair, thread: str) -> tuple[HistoryManager, AnsweredReads]:
    spy = AnsweredReads(stores[1])
    history = await HistoryManager.load(stores[0], spy, thread)  # type: ignore[arg-type]
    spy.asked.clear()
    return history, spy


async def test_an_id_the_filter_rules_out_is_free_without_a_read(stores: StorePair) -> None:
    conversation = stores[0]
    await seeded(conversation, "t", 3)  # c-1 .. c-3; the summary hides c-1 and c-2
    await conversation.save_summary("t", Summary("S", 6, call_ids=CallIdFilter.of(["c-1", "c-2"])))
    history, spy = await loaded(stores, "t")
    assert history.compacted_up_to == 6
    assert await history.tool_call_id_taken("c-3")  # visible
    assert not await history.tool_call_id_taken("c-new")  # ruled out by the filter
    assert spy.asked == []
    assert await history.tool_call_id_taken("c-1")  # "maybe": the answered marker says it is taken
    assert spy.asked == ["c-1"]


async def test_without_a_filter_every_hidden_check_reads_the_markers_as_before(stores: StorePair) -> None:
    conversation = stores[0]
    await seeded(conversation, "t", 3)
    await conversation.save_summary("t", Summary("S", 6))  # an older summary: no filter
    history, spy = await loaded(stores, "t")
    assert await history.tool_call_id_taken("c-1")
    assert not await history.tool_call_id_taken("c-new")
    assert spy.asked == ["c-1", "c-new"]


async def test_a_false_maybe_costs_a_read_and_still_answers_free(stores: StorePair) -> None:
    """A filter that says "maybe" for an id it never held (every bit set: all false positives) costs
    the marker read, and the answer is the exact one: no rename for a free id."""
    conversation = stores[0]
    await seeded(conversation, "t", 3)
    await conversation.save_summary("t", Summary("S", 6, call_ids=CallIdFilter((1 << 8192) - 1)))
    history, spy = await loaded(stores, "t")
    assert not await history.tool_call_id_taken("c-new")
    assert spy.asked == ["c-new"]


async def test_a_compaction_childs_summary_gets_the_filter_of_exactly_its_inherited_prefix(
    stores: StorePair,
) -> None:
    conversation, state = stores
    await seeded(conversation, "p", 3)
    await conversation.save_summary("p", Summary("first", 3, call_ids=CallIdFilter.of(["c-1"])))
    child = await conversation.spawn_thread(
        "p", child_id="k", spawn_tool_call_id="compact-1", kind=ThreadKind.COMPACTION
    )
    assert child.spawn_order == 9
    history = await HistoryManager.load(conversation, state, "k")
    prefix = [row.item async for row in conversation.load_rows("p", after=3, up_to=9)]
    expected = CallIdFilter.of(["c-1"]).union(hidden_call_ids(prefix) or CallIdFilter())
    assert history.inherited_call_ids("p", 9) == expected
    assert all(expected.might_contain(f"c-{n}") for n in (1, 2, 3))
    # Not the summary this prefix is: another order, another thread — unknown, never a guess.
    assert history.inherited_call_ids("p", 8) is None and history.inherited_call_ids("q", 9) is None
    await StoreToolAccess(conversation, state, history).save_summary("p", Summary("second", 9))
    saved = await conversation.latest_summary("p")
    assert saved is not None and saved.up_to_order == 9 and saved.call_ids == expected
    # A prefix that starts at a summary without a filter cannot say what it hides.
    await seeded(conversation, "p2", 3)
    await conversation.save_summary("p2", Summary("first", 3))
    await conversation.spawn_thread("p2", child_id="k2", spawn_tool_call_id="c", kind=ThreadKind.COMPACTION)
    history = await HistoryManager.load(conversation, state, "k2")
    assert history.ancestor_prefix_len == 1 + 6 and history.inherited_call_ids("p2", 9) is None


# ---- DynamoDB: summaries written before the filter existed ------------------------------------------------


async def test_dynamodb_summary_items_without_or_with_an_unknown_filter_read_as_unknown(
    dynamo: DynamoEnv,
) -> None:
    conversation, state = dynamo.stores()
    assert isinstance(conversation, DynamoConversationStore)
    await seeded(conversation, "t", 3)
    await conversation.save_summary("t", Summary("S", 6, call_ids=FILTER))
    table, key = dynamo.conversation_table, {"pk": {"S": "t"}}
    for sk in ("S#000000000006", "SUMMARY"):
        item = (await dynamo.client.get_item(TableName=table, Key=key | {"sk": {"S": sk}}))["Item"]
        assert base64.b64decode(item["cid"]["S"]) == FILTER.encode()
    # As an older build wrote them: no ``cid`` on either item.
    for sk in ("S#000000000006", "SUMMARY"):
        await dynamo.client.update_item(
            TableName=table, Key=key | {"sk": {"S": sk}}, UpdateExpression="REMOVE cid"
        )
    fresh, _ = dynamo.stores()
    snapshot = await load_snapshot(fresh, state, "t")
    assert snapshot.summary == Summary("S", 6) and snapshot.summary is not None
    assert snapshot.summary.call_ids is None
    summary = await fresh.latest_summary("t")
    assert summary is not None and summary.call_ids is None
    # A filter of a format this build does not know is not trusted either.
    future = base64.b64encode(bytes([FORMAT + 1]) + FILTER.encode()[1:]).decode()
    unknown = {":c": {"S": future}}
    for sk in ("S#000000000006", "SUMMARY"):
        await dynamo.client.update_item(
            TableName=table,
            Key=key | {"sk": {"S": sk}},
            UpdateExpression="SET cid = :c",
            ExpressionAttributeValues=unknown,
        )
    snapshot = await load_snapshot(fresh, state, "t")
    assert snapshot.summary is not None and snapshot.summary.call_ids is None
    for sk in ("S#000000000006", "SUMMARY"):  # nor one that is not even base64
        await dynamo.client.update_item(
            TableName=table,
            Key=key | {"sk": {"S": sk}},
            UpdateExpression="SET cid = :c",
            ExpressionAttributeValues={":c": {"S": "not base64!"}},
        )
    snapshot = await load_snapshot(fresh, state, "t")
    assert snapshot.summary is not None and snapshot.summary.call_ids is None
