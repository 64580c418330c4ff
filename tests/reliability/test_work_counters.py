"""Work counters: what one step costs the store must not depend on how long the thread's history is, once
compaction bounds what is in context: a step reads what is in context and writes its new rows, so its
reads are flat and its writes are O(new rows), independent of history length. Counted, never timed.

The step is the real worker handler (``bench.workload``: one record per invocation, outputs
published) doing a function-tool round trip — a user-text step (load, model, commit, dispatch) and the
tool-result step (load, model, commit) — on a thread with 10, 1,000 or 10,000 stored rows whose latest
compaction summary leaves the same 10 rows in context.

- **In-memory stores** behind a counting wrapper: store calls per method, rows read, rows and bytes
  written (encoded rows) per step are identical at 10, 1,000 and 10,000 rows. Without a summary the rows
  read grow linearly and nothing grows faster (work ratio at 4N vs N ≤ 4.5: no quadratic path).
- **DynamoDB on moto** with the store's own :class:`~stepagent.stores.metrics.StoreMetrics`: AWS calls
  per operation, rows read, items and bytes written per step are identical at 10, 1,000 and 10,000 rows.
  The big histories are seeded directly with ``BatchWriteItem`` in the store's row layout (committing
  10,000 rows one step at a time would take minutes on moto); without a summary, the Query pages grow
  with the rows in context (100 rows a page) and nothing else does.
- **The peer workload** (``bench.step_costs``: user text → tool call → tool result → answer, ~1 KB
  messages) at turn 10 and turn 60 with compaction: requests per cold and warm step (the
  targets in ``bench.step_costs``: ≤ 4 for a cold step of a one-page context, the head read once, no query of empty state, a
  warm step reading only the head) and bytes read flat from turn 10 on (at most 1.2 times).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from bench import step_costs
from bench.step_costs import approval_costs, dynamo_row_writer, peer_costs
from bench.workload import Workload
from stepagent.agent_config import AgentConfig
from stepagent.history_items import AssistantText, HistoryItem, Summary, UserItem, encode_item
from stepagent.messages import InputMessage, TextContent
from stepagent.providers.prices import parse_prices
from stepagent.stores.base import Commit, ConversationStore, StateStore
from stepagent.stores.memory import memory_stores
from stepagent.stores.metrics import StoreMetrics
from tests.conftest import DynamoEnv

SIZES = (10, 1_000, 10_000)
IN_CONTEXT = 10


def seeded_item(order: int) -> HistoryItem:
    text = f"row {order:06d} " + f"{order:06d}" * 160  # ~1 KB, unique per row
    return UserItem(content=TextContent(text=text)) if order % 2 else AssistantText(text)


@dataclass
class Counts:
    calls: dict[str, int] = field(default_factory=dict)
    rows_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0


class Counting:
    """Wraps an in-memory store: counts each async method call, every row ``load_rows`` yields, and the
    rows and encoded bytes every commit writes."""

    def __init__(self, inner: Any, counts: Callable[[], Counts], label: str) -> None:
        self._inner, self._counts, self._label = inner, counts, label

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        counts, label = self._counts, self._label
        if inspect.isasyncgenfunction(attr):

            async def rows(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                current = counts()
                current.calls[f"{label}.{name}"] = current.calls.get(f"{label}.{name}", 0) + 1
                async for row in attr(*args, **kwargs):
                    current.rows_read += 1
                    yield row

            return rows
        if inspect.iscoroutinefunction(attr):

            async def call(*args: Any, **kwargs: Any) -> Any:
                current = counts()
                current.calls[f"{label}.{name}"] = current.calls.get(f"{label}.{name}", 0) + 1
                if name == "commit":
                    commit: Commit = args[1]
                    current.rows_written += len(commit.rows)
                    current.bytes_written += sum(len(encode_item(i).encode()) for i, _ in commit.rows)
                return await attr(*args, **kwargs)

            return call
        return attr


async def tool_round_trip(workload: Workload, thread: str) -> int:
    """User text that makes the model call the function tool; returns how many invocations it took."""
    await workload.queue.send(InputMessage.user_text(thread, "please look up the weather", id="ask"), "ask")
    before = workload.steps
    while workload.queue.pending:
        await workload.step()
    return workload.steps - before


# ---- in-memory stores --------------------------------------------------------------------------------


async def memory_step_costs(rows: int, in_context: int | None) -> list[Counts]:
    conversation, state = memory_stores()
    version, order = 0, 0
    while order < rows:
        batch = [(seeded_item(n), f"seed-{n}") for n in range(order + 1, min(order + 1000, rows) + 1)]
        version = (await conversation.commit("t", Commit(expected_version=version, rows=batch))).version
        order += len(batch)
    if in_context is not None:
        await conversation.save_summary("t", Summary("SUMMARY", rows - in_context))
    per_step: list[Counts] = []

    def current() -> Counts:
        return per_step[-1]

    workload = Workload.build(
        Counting(conversation, current, "conversation"),  # type: ignore[arg-type]
        Counting(state, current, "state"),  # type: ignore[arg-type]
        compact_after_tokens=10**10,
    )
    step = workload.step

    async def counted_step() -> None:
        per_step.append(Counts())
        await step()

    workload.step = counted_step  # type: ignore[method-assign]
    assert await tool_round_trip(workload, "t") == 2
    return per_step


async def test_in_memory_step_costs_do_not_grow_with_history_length() -> None:
    costs = {rows: await memory_step_costs(rows, IN_CONTEXT) for rows in SIZES}
    small = costs[SIZES[0]]
    assert [c.rows_read for c in small] == [IN_CONTEXT, IN_CONTEXT + 3]  # the context (+ user, text, call)
    assert all(c.rows_written > 0 and c.bytes_written > 0 for c in small)
    for rows, steps in costs.items():
        assert steps == small, f"{rows} stored rows cost {steps}, 10 rows cost {small}"


async def test_without_compaction_reads_grow_linearly_and_nothing_faster() -> None:
    n, four_n = await memory_step_costs(250, None), await memory_step_costs(1000, None)
    for a, b in zip(n, four_n, strict=True):
        assert b.calls == a.calls and b.bytes_written == a.bytes_written
        assert b.rows_read / a.rows_read <= 4.5


# ---- DynamoDB on moto ----------------------------------------------------------------------------------


async def seed_dynamo(env: DynamoEnv, thread: str, rows: int, in_context: int | None) -> None:
    """A committed history in the store's layout (``stores/dynamodb/conversation.py``): a ``HEAD`` item at version 1
    with ``tail`` = rows, ``R#{order:012d}`` rows written by that commit (``cv`` 1), and a summary
    ``S#{up_to:012d}``. moto does not enforce BatchWriteItem's 25-item limit, so it takes few calls."""
    items: list[dict[str, Any]] = [
        {
            "pk": {"S": thread},
            "sk": {"S": "HEAD"},
            "root_id": {"S": thread},
            "kind": {"S": "root"},
            "closed": {"BOOL": False},
            "version": {"N": "1"},
            "tail": {"N": str(rows)},
        }
    ]
    items += [
        {
            "pk": {"S": thread},
            "sk": {"S": f"R#{order:012d}"},
            "message_id": {"S": f"seed-{order:06d}"},
            "cv": {"N": "1"},
            "body": {"S": encode_item(seeded_item(order))},
        }
        for order in range(1, rows + 1)
    ]
    if in_context is not None:
        items.append(
            {"pk": {"S": thread}, "sk": {"S": f"S#{rows - in_context:012d}"}, "body": {"S": "SUMMARY"}}
        )
    for start in range(0, len(items), 1000):
        chunk = [{"PutRequest": {"Item": item}} for item in items[start : start + 1000]]
        response = await env.client.batch_write_item(RequestItems={env.conversation_table: chunk})
        assert not response.get("UnprocessedItems")


async def dynamo_step_costs(env: DynamoEnv, thread: str) -> list[StoreMetrics]:
    metrics = StoreMetrics()
    conversation, state = env.stores(metrics=metrics)
    workload = Workload.build(conversation, state, compact_after_tokens=10**10)
    per_step: list[StoreMetrics] = []
    step = workload.step

    async def measured_step() -> None:
        before = metrics.snapshot()
        await step()
        per_step.append(metrics.since(before))

    workload.step = measured_step  # type: ignore[method-assign]
    assert await tool_round_trip(workload, thread) == 2
    return per_step


async def test_dynamodb_step_costs_do_not_grow_with_history_length(dynamo: DynamoEnv) -> None:
    for rows in SIZES:
        await seed_dynamo(dynamo, f"t{rows:05d}", rows, IN_CONTEXT)
    costs = {rows: await dynamo_step_costs(dynamo, f"t{rows:05d}") for rows in SIZES}  # ids of one length
    small = costs[SIZES[0]]
    assert [c.rows_read for c in small] == [IN_CONTEXT, IN_CONTEXT + 3]
    assert all(c.total_calls > 0 and c.bytes_written > 0 for c in small)
    for rows, steps in costs.items():
        assert steps == small, f"{rows} stored rows cost {steps}, 10 rows cost {small}"


async def test_dynamodb_reads_without_compaction_grow_only_by_query_pages(dynamo: DynamoEnv) -> None:
    await seed_dynamo(dynamo, "n-250", 250, None)
    await seed_dynamo(dynamo, "n1000", 1000, None)
    n, four_n = await dynamo_step_costs(dynamo, "n-250"), await dynamo_step_costs(dynamo, "n1000")
    for a, b in zip(n, four_n, strict=True):
        assert b.rows_read / a.rows_read <= 4.5
        assert b.bytes_written == a.bytes_written and b.items_written == a.items_written
        extra_pages = b.calls.get("Query", 0) - a.calls.get("Query", 0)
        assert 0 < extra_pages <= (1000 - 250) // 100 + 1  # 100-row pages: ~8 more, nothing else
        assert {op: n for op, n in b.calls.items() if op != "Query"} == {
            op: n for op, n in a.calls.items() if op != "Query"
        }


# ---- the peer workload: requests and bytes per cold and warm step ----------------------------------------


async def peer_costs_on(dynamo: DynamoEnv, turn: int) -> dict[str, Any]:
    def stores(metrics: StoreMetrics) -> tuple[ConversationStore, StateStore]:
        return dynamo.stores(metrics=metrics, page_size=None)  # the worker's 1 MB pages

    writer = dynamo_row_writer(dynamo.client, dynamo.conversation_table)
    return await peer_costs(stores, turn, True, f"peer{turn:04d}", writer)


async def test_peer_workload_steps_make_few_requests_and_read_no_more_at_turn_60(dynamo: DynamoEnv) -> None:
    """One Query page of context: a cold step is one BatchGetItem (head, summary copy with its call-id
    filter, metadata, dedup markers), one Query and the commit (+ the outbox's done mark after a dispatch)
    — the head is read once, nothing is queried for empty state, publishing reads nothing, and a compacted
    thread's new call id costs no read. A warm step reads only the head."""
    early, late = await peer_costs_on(dynamo, 10), await peer_costs_on(dynamo, 60)
    for figures in (early, late):
        for step in figures["cold"] + figures["warm"]:
            assert step["calls"].get("GetItem", 0) == 0, step  # the head: once, in the BatchGetItem
        user, result = figures["cold"]
        assert result["requests"] <= 3 and result["calls"] == {
            "BatchGetItem": 1,
            "Query": 1,
            "TransactWriteItems": 1,
        }
        warm_user, warm_result = figures["warm"]
        assert "Query" not in warm_user["calls"] and "Query" not in warm_result["calls"]
        assert warm_user["bytes_read"] < 1_000 and warm_result["bytes_read"] < 1_000
        assert warm_result["requests"] <= 2 and warm_user["requests"] <= user["requests"] - 1
    assert early["cold"][0]["requests"] <= 4  # no summary: no call-id check against hidden history
    # With compaction the model's new call id is checked against the calls the summary hides: its
    # call-id filter (read with the summary copy) rules the id out, so no answered-marker read is added.
    assert late["cold"][0]["requests"] <= 4
    assert late["cold"][0]["calls"] == early["cold"][0]["calls"], late["cold"][0]
    for kind in ("cold", "warm"):
        for a, b in zip(early[kind], late[kind], strict=True):
            assert b["requests"] <= a["requests"] + 1
            assert b["bytes_read"] <= 1.2 * a["bytes_read"] + 2_000  # + the ~1 KB summary


async def test_the_limit_checks_add_no_request(dynamo: DynamoEnv, monkeypatch: Any) -> None:
    """Every limit on, with prices known: each step of a turn makes exactly the requests it makes with the
    limits off — the per-turn count rides on the head and the spend on the root's metadata item, both read
    with the step's first request and written by its commit."""

    def stores(metrics: StoreMetrics) -> tuple[ConversationStore, StateStore]:
        return dynamo.stores(metrics=metrics, page_size=None)

    plain = await peer_costs(stores, 3, False, "limits-off", modes=("cold",))
    original = step_costs.build

    def limited(factory: Any, metrics: StoreMetrics, agent: AgentConfig | None = None) -> Workload:
        workload = original(factory, metrics, agent)
        config = workload.worker.system.config  # type: ignore[attr-defined]
        config.agent = AgentConfig(
            max_model_calls_per_turn=40, max_conversation_tokens=10**9, max_conversation_cost_usd=1000.0
        )
        config.prices = parse_prices(f'{{"{config.provider.info.name}": {{"input": 3, "output": 15}}}}')
        return workload

    monkeypatch.setattr(step_costs, "build", limited)
    capped = await peer_costs(stores, 3, False, "limits-on", modes=("cold",))
    assert len(plain["cold"]) == len(capped["cold"]) == 2
    for off, on in zip(plain["cold"], capped["cold"], strict=True):
        assert on["calls"] == off["calls"], (off, on)
        assert on["requests"] == off["requests"]
    spend = await dynamo.stores(metrics=StoreMetrics())[1].spend("limits-on-cold")
    assert spend.tokens > 0 and spend.cost_usd > 0  # the limits had something to check


# ---- approval: the deciding step costs at most one request more than an ordinary tool result -------------


async def test_an_approval_adds_at_most_one_request_to_the_deciding_step(dynamo: DynamoEnv) -> None:
    """Cold steps on DynamoDB (moto) through the real worker: the step that takes a person's approval reads
    the thread like a tool-result step (one BatchGetItem — which also says whether the decided call is
    answered — and one Query), commits the decision with the call's intent in the one transaction, and adds
    only the outbox's done mark after dispatching. The step that leaves the call waiting dispatches
    nothing, so it has no done mark."""

    def stores(metrics: StoreMetrics) -> tuple[ConversationStore, StateStore]:
        return dynamo.stores(metrics=metrics, page_size=None)

    costs = await approval_costs(stores, "approve")
    plain, approval = costs["plain"], costs["approval"]
    assert costs["decision_extra_requests"] <= 1, costs
    result_calls = plain["result"]["calls"]
    # The one extra request: the outbox's done mark (a transaction of the state table).
    extra = {"TransactWriteItems": result_calls.get("TransactWriteItems", 0) + 1}
    assert approval["decision"]["calls"] == {**result_calls, **extra}, costs
    assert approval["user"]["requests"] == plain["user"]["requests"] - 1, costs  # no intent done mark
    assert approval["result"]["calls"] == plain["result"]["calls"], costs
