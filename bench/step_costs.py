"""Store work per worker step in the peer workload, counted (never timed).

One turn = user text (~1 KB) → the model calls a function tool → the tool result (~1 KB) comes back → the
model answers (~1 KB): two worker invocations (the real :class:`~stepagent.aws.worker.Worker`, outputs
published) plus one in-process tool run. A thread at turn ``N`` is seeded with ``N - 1`` finished turns
(five rows each) through the store's own ``commit`` (so the layout is whatever the store writes); "with
compaction" a summary then covers everything but the last :data:`KEPT_TURNS` turns — the state the
thread's own compactions keep it in, call-id filter included — so what a step has in context is the same
at turn 10 and turn 500.

- **cold**: every step runs on a fresh store pair and worker (a new Lambda container: nothing cached);
- **warm**: the worker that ran turn ``N - 1`` runs turn ``N`` (a warm container).

Each figure is per worker step (``user`` step, then ``result`` step): DynamoDB requests by operation,
items and bytes read, items and bytes written (:class:`~stepagent.stores.metrics.StoreMetrics`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bench.workload import Workload
from stepagent.agent_config import AgentConfig
from stepagent.core.thread_cache import ThreadCache
from stepagent.history_items import (
    AssistantText,
    HistoryItem,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    encode_item,
    hidden_call_ids,
    waiting_for_approval,
)
from stepagent.messages import InputMessage, TextContent, ToolCall, ToolResult
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import Commit, ConversationStore, StateStore
from stepagent.stores.metrics import StoreMetrics

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_dynamodb.type_defs import WriteRequestTypeDef

MESSAGE_CHARS = 1000
KEPT_TURNS = 9
ROWS_PER_TURN = 5
ANSWER = "Here is what I found: " + "the lookup says it is fine. " * 35

StoreFactory = Callable[[StoreMetrics], tuple[ConversationStore, StateStore]]
#: Writes seeded rows ``first, first + 1, ...`` of a thread straight into a store's layout.
RawRowWriter = Callable[[str, int, list[HistoryItem]], Awaitable[None]]


def peer_script() -> dict[str, Any]:
    return {
        "context_window": 10**9,  # compaction is seeded, not triggered (the workload measures steps)
        "rules": [
            {
                "when": "^please look up",
                "on": ["user"],
                "reply": [
                    {"text": "Looking it up."},
                    {"tool_call": {"name": "lookup", "arguments": {"query": "{thread_id}"}}},
                ],
            },
            {"when": "^result: ", "on": ["tool_result"], "reply": [{"text": ANSWER}]},
        ],
        "default": [{"text": "ok"}],
    }


def user_text(turn: int) -> str:
    return f"please look up item {turn}: " + f"{turn:06d}" * (MESSAGE_CHARS // 6)


def turn_rows(turn: int) -> list[tuple[HistoryItem, str]]:
    call = ToolCall(id=f"seed-call-{turn}", name="lookup", arguments={"query": "seed"})
    result = ToolResult.text(call.id, "result: " + f"{turn:07d}" * (MESSAGE_CHARS // 7))
    return [
        (UserItem(content=TextContent(text=user_text(turn))), f"seed-{turn}-user"),
        (AssistantText("Looking it up."), f"seed-{turn}-text"),
        (ToolCallItem(call=call), f"seed-{turn}-call"),
        (ToolResultItem(result=result), f"seed-{turn}-result"),
        (AssistantText(ANSWER), f"seed-{turn}-answer"),
    ]


async def seed_thread(
    conversation: ConversationStore,
    thread: str,
    turn: int,
    compacted: bool,
    raw_rows: RawRowWriter | None = None,
    *,
    kept_turns: int = KEPT_TURNS,
) -> None:
    """``turn - 1`` finished turns; with a summary if ``compacted`` (all but the last ``kept_turns``). The first turn is a real commit (it
    creates the thread's head as the store does); the rest are committed 95 rows at a time, or, given
    ``raw_rows`` (a DynamoDB store on moto, where every transaction copies the table), written straight
    into the row layout and the head's tail moved over them."""
    rows = [row for t in range(1, turn) for row in turn_rows(t)]
    first = rows[:ROWS_PER_TURN] if raw_rows is not None else rows
    version = 0
    for start in range(0, len(first), 95):
        commit = Commit(expected_version=version, rows=first[start : start + 95], turn_complete=True)
        version = (await conversation.commit(thread, commit)).version
    if raw_rows is not None and len(rows) > len(first):
        await raw_rows(thread, len(first) + 1, [item for item, _ in rows[len(first) :]])
    kept = kept_turns * ROWS_PER_TURN
    if compacted and len(rows) > kept:
        text = "SUMMARY: the user asked for lookups and got results. " * 20  # ~1 KB
        # With the call-id filter of the rows it hides, as the thread's own compaction would write it.
        hidden = hidden_call_ids(item for item, _ in rows[: len(rows) - kept])
        await conversation.save_summary(thread, Summary(text, len(rows) - kept, call_ids=hidden))


def dynamo_row_writer(client: DynamoDBClient, table: str) -> RawRowWriter:
    """Rows ``R#{order:012d}`` (``message_id``, ``cv``, ``body``: ``stores/dynamodb/conversation.py``) written with
    BatchWriteItem, then the head's tail moved to the last of them."""

    async def write(thread: str, first: int, items: list[HistoryItem]) -> None:
        puts: list[WriteRequestTypeDef] = [
            {
                "PutRequest": {
                    "Item": {
                        "pk": {"S": thread},
                        "sk": {"S": f"R#{order:012d}"},
                        "message_id": {"S": f"seed-{order}"},
                        "cv": {"N": "1"},
                        "body": {"S": encode_item(item)},
                    }
                }
            }
            for order, item in enumerate(items, start=first)
        ]
        for start in range(0, len(puts), 25):
            response = await client.batch_write_item(RequestItems={table: puts[start : start + 25]})
            assert not response.get("UnprocessedItems")
        await client.update_item(
            TableName=table,
            Key={"pk": {"S": thread}, "sk": {"S": "HEAD"}},
            UpdateExpression="SET #t = :t",
            ExpressionAttributeNames={"#t": "tail"},
            ExpressionAttributeValues={":t": {"N": str(first + len(items) - 1)}},
        )

    return write


@dataclass
class StepCost:
    requests: int
    calls: dict[str, int] = field(default_factory=dict)
    items_read: int = 0
    bytes_read: int = 0
    items_written: int = 0
    bytes_written: int = 0
    rows_read: int = 0


def _cost(metrics: StoreMetrics) -> StepCost:
    return StepCost(
        requests=metrics.total_calls,
        calls=dict(sorted(metrics.calls.items())),
        items_read=metrics.items_read,
        bytes_read=metrics.bytes_read,
        items_written=metrics.items_written,
        bytes_written=metrics.bytes_written,
        rows_read=metrics.rows_read,
    )


def build(stores: StoreFactory, metrics: StoreMetrics, agent: AgentConfig | None = None) -> Workload:
    conversation, state = stores(metrics)
    # Each worker has its own cache, as each Lambda container does.
    return Workload.build(
        conversation,
        state,
        provider=ScriptedProvider(peer_script()),
        result_chars=MESSAGE_CHARS,
        thread_cache=ThreadCache(),
        agent=agent,
    )


async def run_turn(workload: Workload, thread: str, turn: int, metrics: StoreMetrics) -> list[StepCost]:
    """One turn on ``workload``; the cost of each worker step."""
    message = InputMessage.user_text(thread, user_text(turn), id=f"ask-{turn}")
    await workload.queue.send(message, f"ask-{turn}")
    costs = []
    while workload.queue.pending:
        before = metrics.snapshot()
        await workload.step()
        costs.append(_cost(metrics.since(before)))
    return costs


async def cold_turn(
    stores: StoreFactory, thread: str, turn: int, agent: AgentConfig | None = None
) -> list[StepCost]:
    """Each step of turn ``turn`` on a fresh store pair and worker (what is queued carries over)."""
    message = InputMessage.user_text(thread, user_text(turn), id=f"ask-{turn}")
    return await cold_steps(stores, [(message, f"ask-{turn}")], agent)


async def cold_steps(
    stores: StoreFactory, pending: list[tuple[InputMessage, str]], agent: AgentConfig | None = None
) -> list[StepCost]:
    """Each step until nothing is queued, on a fresh store pair and worker (what is queued carries over)."""
    costs = []
    while pending:
        metrics = StoreMetrics()
        workload = build(stores, metrics, agent)
        workload.queue.pending.extend(pending)
        await workload.step()
        costs.append(_cost(metrics))
        pending = list(workload.queue.pending)
    return costs


async def approval_costs(stores: StoreFactory, thread: str) -> dict[str, Any]:
    """A first turn whose ``lookup`` call waits for a person's approval, cold steps: ``user`` (the call is
    committed and waits), ``decision`` (the approval: commit the decision with the call's intent, dispatch,
    mark the intent done), ``result``; next to the same turn without approval (``user``, ``result``).
    What it shows: the deciding step makes at most one DynamoDB request more than an ordinary tool-result
    step (the outbox's done mark), and waiting costs nothing."""
    plain = await cold_turn(stores, f"{thread}-plain", 1)
    agent = AgentConfig(approval=("lookup",))
    asked = await cold_turn(stores, f"{thread}-approval", 1, agent)
    conversation, _ = stores(StoreMetrics())
    rows = [row.item async for row in conversation.load_rows(f"{thread}-approval")]
    waiting = waiting_for_approval(rows)
    if waiting is None:
        raise AssertionError("the lookup call is not waiting for approval")
    decision = InputMessage.approval(f"{thread}-approval", waiting.call.id, "approve", id="decision-1")
    decided = await cold_steps(stores, [(decision, "decision-1")], agent)
    return {
        "plain": {"user": asdict(plain[0]), "result": asdict(plain[1])},
        "approval": {
            "user": asdict(asked[0]),
            "decision": asdict(decided[0]),
            "result": asdict(decided[1]),
        },
        "decision_extra_requests": decided[0].requests - plain[1].requests,
    }


async def warm_turn(stores: StoreFactory, thread: str, turn: int) -> list[StepCost]:
    """Turn ``turn`` on the worker that just ran turn ``turn - 1`` of the same thread."""
    metrics = StoreMetrics()
    workload = build(stores, metrics)
    await run_turn(workload, thread, turn - 1, metrics)
    return await run_turn(workload, thread, turn, metrics)


async def peer_costs(
    stores: StoreFactory,
    turn: int,
    compacted: bool,
    thread: str,
    raw_rows: RawRowWriter | None = None,
    modes: tuple[str, ...] = ("cold", "warm"),
) -> dict[str, Any]:
    """Per-step costs at ``turn``: ``cold`` on a thread seeded with ``turn - 1`` finished turns, ``warm``
    on one seeded with ``turn - 2`` whose turn ``turn - 1`` the measuring worker runs first."""
    conversation, _ = stores(StoreMetrics())
    result: dict[str, Any] = {"turn": turn, "compacted": compacted}
    if "warm" in modes:
        await seed_thread(conversation, f"{thread}-warm", turn - 1, compacted, raw_rows)
        result["warm"] = [asdict(c) for c in await warm_turn(stores, f"{thread}-warm", turn)]
    if "cold" in modes:
        await seed_thread(conversation, f"{thread}-cold", turn, compacted, raw_rows)
        result["cold"] = [asdict(c) for c in await cold_turn(stores, f"{thread}-cold", turn)]
    return result


#: The counter targets: requests per cold step of a thread whose context fits one Query page, and
#: the growth of requests and bytes read per step from turn 10 to turn 500 with compaction on.
COLD_STEP_REQUESTS_TARGET = 4
GROWTH_TARGET = 1.2


def judge(early: dict[str, Any], late: dict[str, Any]) -> dict[str, Any]:
    """Each figure next to its target: per-turn sums (two worker steps) and the cold steps' maximum."""

    def per_turn(figures: dict[str, Any], kind: str, key: str) -> int:
        return sum(int(step[key]) for step in figures[kind])

    out: dict[str, Any] = {}
    for kind in ("cold", "warm"):
        for key in ("requests", "bytes_read"):
            a, b = per_turn(early, kind, key), per_turn(late, kind, key)
            out[f"{kind}_{key}_per_turn"] = {
                f"turn_{early['turn']}": a,
                f"turn_{late['turn']}": b,
                "growth": round(b / a, 3) if a else None,
                "growth_target": GROWTH_TARGET,
                "within_target": a > 0 and b / a <= GROWTH_TARGET,
            }
    for figures in (early, late):
        worst = max(int(step["requests"]) for step in figures["cold"])
        out[f"cold_step_requests_max_turn_{figures['turn']}"] = {
            "value": worst,
            "target": COLD_STEP_REQUESTS_TARGET,
            "within_target": worst <= COLD_STEP_REQUESTS_TARGET,
        }
    return out
