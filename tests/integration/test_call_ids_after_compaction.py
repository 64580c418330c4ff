"""Call ids stay unique in a compacted thread, and checking a new one costs no store read.

The real worker (``bench.workload``) on the in-memory and the DynamoDB stores, with real compactions (a
compaction child summarises and closes, the parent applies the summary). Each summary carries the call-id
filter of the calls it hides (``Summary.call_ids``):

- a model that reuses the id of a call the summary hides still gets its call renamed: the filter says
  "maybe", so the answered markers are read, exactly as before the filter existed — the reused call's
  result is not absorbed as a duplicate;
- a model's fresh id is ruled out by the filter: the step asks the state store nothing about it;
- a compacted child's summary also covers the calls of the prefix it inherited from its parent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from bench.workload import Workload, lookup_tool, window_for, workload_script
from stepagent.history_items import (
    Summary,
    ToolCallItem,
    ToolResultItem,
    hidden_call_ids,
    item_call_ids,
)
from stepagent.messages import InputMessage
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent, ToolCallComplete
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import ConversationStore, StateStore, ThreadKind
from stepagent.stores.memory import memory_stores
from stepagent.tools.builtins import builtin_tools
from tests.conftest import dynamo_store_pair
from tests.contract.test_store_contract_call_ids import AnsweredReads

StorePair = tuple[ConversationStore, StateStore]
COMPACT_AFTER = 4000  # tokens of conversation: the workload's default, a compaction every few lookups


@asynccontextmanager
async def memory_pair() -> AsyncIterator[StorePair]:
    yield memory_stores()


FACTORIES: dict[str, Callable[[], AbstractAsyncContextManager[StorePair]]] = {
    "memory": memory_pair,
    "dynamodb": dynamo_store_pair,
}


@pytest.fixture(params=sorted(FACTORIES))
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[StorePair]:
    async with FACTORIES[request.param]() as pair:
        yield pair


class LookupIds:
    """The workload's scripted model; with ``fixed``, every ``lookup`` call carries that id (an
    OpenAI-compatible server that repeats ids)."""

    def __init__(self, fixed: str | None = None) -> None:
        window = window_for([lookup_tool(), *builtin_tools()], COMPACT_AFTER)
        self.inner = ScriptedProvider(workload_script(window))
        self.fixed = fixed

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        async for event in self.inner.stream(request):
            if self.fixed is not None and isinstance(event, ToolCallComplete) and event.call.name == "lookup":
                event = ToolCallComplete(event.call.model_copy(update={"id": self.fixed}))
            yield event


def build(pair: StorePair, provider: LookupIds) -> tuple[Workload, AnsweredReads]:
    conversation, state = pair
    spy = AnsweredReads(state)
    return Workload.build(conversation, spy, provider=provider, compact_after_tokens=COMPACT_AFTER), spy  # type: ignore[arg-type]


async def ask(workload: Workload, thread: str, n: int, spy: AnsweredReads | None = None) -> list[str]:
    """One user message asking for a lookup, then every step it leads to (compactions included). Given
    ``spy``: the call ids the user step (the one whose model makes the call) asked the state store about."""
    message_id = f"{thread}-ask-{n}"
    await workload.queue.send(
        InputMessage.user_text(thread, f"please look up item {n}", id=message_id), message_id
    )
    if spy is not None:
        spy.asked.clear()
    await workload.step()
    asked = list(spy.asked) if spy is not None else []
    while workload.queue.pending:
        await workload.step()
    return asked


async def lookup_calls(conversation: ConversationStore, thread: str) -> list[tuple[int, str]]:
    return [
        (row.order, row.item.call.id)
        async for row in conversation.load_rows(thread)
        if isinstance(row.item, ToolCallItem) and row.item.call.name == "lookup"
    ]


async def compact_past(workload: Workload, thread: str, order: int, asked: int) -> tuple[Summary, int]:
    """Ask for lookups until a summary of ``thread`` hides ``order``; the summary and how many were asked."""
    while True:
        summary = await workload.conversation.latest_summary(thread)
        if summary is not None and summary.up_to_order >= order:
            return summary, asked
        assert asked < 30, "the thread should compact within a few lookups"
        asked += 1
        await ask(workload, thread, asked)


async def test_a_reused_id_of_a_call_the_summary_hides_is_renamed(stores: StorePair) -> None:
    workload, spy = build(stores, LookupIds("call_1"))
    conversation, thread = stores[0], "reuse"
    await ask(workload, thread, 1)
    [(first_order, first_id)] = await lookup_calls(conversation, thread)
    assert first_id == "call_1"
    summary, asked = await compact_past(workload, thread, first_order, 1)
    assert summary.call_ids is not None and summary.call_ids.might_contain("call_1")

    reads = await ask(workload, thread, asked + 1, spy)
    # The filter said "maybe": the answered markers were read, found call_1 answered, and the new call
    # got a fresh id — so its result was recorded, not absorbed as a redelivery of the first one's.
    assert "call_1" in reads
    calls = await lookup_calls(conversation, thread)
    ids = [call_id for _, call_id in calls]
    assert len(calls) == asked + 1 and len(set(ids)) == len(ids) and ids[-1] != "call_1"
    answered = [
        row.item.result.id
        async for row in conversation.load_rows(thread)
        if isinstance(row.item, ToolResultItem)
    ]
    assert set(ids) <= set(answered)  # every lookup was answered, the last one included


async def test_a_fresh_id_costs_no_answered_marker_read(stores: StorePair) -> None:
    workload, spy = build(stores, LookupIds())
    conversation, thread = stores[0], "fresh"
    await ask(workload, thread, 1)
    [(first_order, _)] = await lookup_calls(conversation, thread)
    summary, asked = await compact_past(workload, thread, first_order, 1)
    # What the real compaction stored: every id the summary hides, and no other store than it knows.
    hidden = [row.item async for row in conversation.load_rows(thread, up_to=summary.up_to_order)]
    assert summary.call_ids is not None and summary.call_ids == hidden_call_ids(hidden)
    assert all(summary.call_ids.might_contain(i) for item in hidden for i in item_call_ids(item))

    reads = await ask(workload, thread, asked + 1, spy)
    new_id = (await lookup_calls(conversation, thread))[-1][1]
    assert not summary.call_ids.might_contain(new_id)
    assert reads == [], reads  # the step that made the call asked the state store nothing


async def test_a_compacted_childs_summary_covers_the_calls_it_inherited(stores: StorePair) -> None:
    """A child's first own summary hides its inherited prefix too: its filter holds the parent's calls up
    to the spawn as well as the child's own."""
    conversation = stores[0]
    workload, _ = build(stores, LookupIds())
    await ask(workload, "parent", 1)
    child = await conversation.spawn_thread(
        "parent", child_id="child", spawn_tool_call_id="spawn-1", kind=ThreadKind.CHILD
    )
    inherited = [row.item async for row in conversation.load_rows("parent", up_to=child.spawn_order)]
    parent_ids = [i for item in inherited for i in item_call_ids(item)]
    assert parent_ids
    summary, _ = await compact_past(workload, "child", 1, 0)
    own = [row.item async for row in conversation.load_rows("child", up_to=summary.up_to_order)]
    assert summary.call_ids is not None and summary.call_ids == hidden_call_ids([*inherited, *own])
    assert all(summary.call_ids.might_contain(i) for i in parent_ids)
