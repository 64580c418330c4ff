"""Step overhead excluding the model, store work per step, and local-mode throughput.

- :func:`step_overhead`: wall and CPU time of one worker step (a user message answered with one line of
  text by :class:`InstantModel`, which costs nothing and looks at nothing) on a thread with ``rows``
  stored rows, all in context or behind a compaction summary, on the in-memory store, the SQLite
  benchmark store or DynamoDB on a local moto server. With DynamoDB the store's
  :class:`~stepagent.stores.metrics.StoreMetrics` give the AWS calls, rows read and bytes written per
  step. moto's timings are not DynamoDB's (an in-process Python server; each transaction deep-copies the
  tables it touches, so its commits slow down as tables grow): use them for shape, and the call counts as
  the portable figure.
- :func:`local_mode_rate`: steps per second of :class:`~stepagent.modes.local.LocalAgentSystem` (in-memory
  stores, the scripted model) answering many user messages over several threads.

Timings are medians over several steps after warm-up steps. Nothing here is a test: see
``tests/reliability/test_work_counters.py`` for the asserted, machine-independent counts.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bench.sqlite_store import sqlite_stores
from bench.workload import Workload
from stepagent.events import AgentEvent, CompletionFinished
from stepagent.history_items import AssistantText, HistoryItem, Summary, UserItem, encode_item
from stepagent.messages import InputMessage, TextContent
from stepagent.providers.base import Final, ModelInfo, ModelRequest, StreamEvent, TextDelta, Usage
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import Commit, ConversationStore, StateStore
from stepagent.stores.memory import memory_stores
from stepagent.stores.metrics import StoreMetrics

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_dynamodb.type_defs import AttributeValueTypeDef, WriteRequestTypeDef

    from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore

ROW_CHARS = 1000


class InstantModel:
    """A model that answers "ok" at once, whatever it is asked (so a step's time is the runtime's)."""

    def __init__(self) -> None:
        self._info = ModelInfo("instant", context_window=0)

    @property
    def info(self) -> ModelInfo:
        return self._info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta("ok")
        yield Final(usage=Usage(input_tokens=1, output_tokens=1))


def seeded_item(order: int) -> HistoryItem:
    text = f"row {order:06d} " + f"{order:06d}" * (ROW_CHARS // 6)
    return UserItem(content=TextContent(text=text)) if order % 2 else AssistantText(text)


async def seed_by_commits(conversation: ConversationStore, thread: str, rows: int, in_context: int) -> None:
    version, order = 0, 0
    while order < rows:
        batch = [(seeded_item(n), f"seed-{n}") for n in range(order + 1, min(order + 1000, rows) + 1)]
        version = (await conversation.commit(thread, Commit(expected_version=version, rows=batch))).version
        order += len(batch)
    if in_context < rows:
        await conversation.save_summary(thread, Summary("SUMMARY", rows - in_context))


async def seed_dynamodb(client: DynamoDBClient, table: str, thread: str, rows: int, in_context: int) -> None:
    """The same history written directly in the DynamoDB store's item layout (``stores/dynamodb/conversation.py``),
    in large ``BatchWriteItem`` calls (moto does not enforce the 25-item limit; DynamoDB would)."""
    head: dict[str, AttributeValueTypeDef] = {
        "pk": {"S": thread},
        "sk": {"S": "HEAD"},
        "root_id": {"S": thread},
        "kind": {"S": "root"},
        "closed": {"BOOL": False},
        "version": {"N": "1"},
        "tail": {"N": str(rows)},
    }
    items: list[dict[str, AttributeValueTypeDef]] = [head]
    items += [
        {
            "pk": {"S": thread},
            "sk": {"S": f"R#{order:012d}"},
            "message_id": {"S": f"seed-{order}"},
            "cv": {"N": "1"},
            "body": {"S": encode_item(seeded_item(order))},
        }
        for order in range(1, rows + 1)
    ]
    if in_context < rows:
        items.append(
            {"pk": {"S": thread}, "sk": {"S": f"S#{rows - in_context:012d}"}, "body": {"S": "SUMMARY"}}
        )
    for start in range(0, len(items), 1000):
        chunk: list[WriteRequestTypeDef] = [
            {"PutRequest": {"Item": item}} for item in items[start : start + 1000]
        ]
        await client.batch_write_item(RequestItems={table: chunk})


@dataclass
class Overhead:
    store: str
    rows: int
    in_context: int
    steps: int
    median_ms: float
    p90_ms: float
    median_cpu_ms: float
    calls_per_step: dict[str, int] = field(default_factory=dict)
    rows_read_per_step: int | None = None
    bytes_written_per_step: int | None = None


async def measure_steps(
    workload: Workload, thread: str, *, warmup: int, steps: int, metrics: StoreMetrics | None = None
) -> tuple[list[float], list[float], StoreMetrics | None]:
    walls: list[float] = []
    cpus: list[float] = []
    last: StoreMetrics | None = None
    for n in range(warmup + steps):
        message_id = f"bench-{n}"
        await workload.queue.send(InputMessage.user_text(thread, f"message {n}", id=message_id), message_id)
        before = metrics.snapshot() if metrics is not None else None
        wall, cpu = time.perf_counter(), time.process_time()
        await workload.step()
        if n >= warmup:
            walls.append((time.perf_counter() - wall) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
            if metrics is not None and before is not None:
                last = metrics.since(before)
    return walls, cpus, last


def _summary(store: str, rows: int, in_context: int, walls: list[float], cpus: list[float]) -> Overhead:
    ordered = sorted(walls)
    return Overhead(
        store=store,
        rows=rows,
        in_context=in_context,
        steps=len(walls),
        median_ms=round(statistics.median(walls), 3),
        p90_ms=round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        median_cpu_ms=round(statistics.median(cpus), 3),
    )


def _steps_for(in_context: int, quick: bool) -> tuple[int, int]:
    if quick:
        return 1, 3
    return (2, 5) if in_context >= 10_000 else (3, 25)


async def local_store_overhead(store: str, rows: int, in_context: int, *, quick: bool = False) -> Overhead:
    """``store`` is ``"memory"`` or ``"sqlite"`` (a file in a temporary directory)."""
    with tempfile.TemporaryDirectory(prefix="stepagent-bench-") as folder:
        pair: tuple[ConversationStore, StateStore] = (
            memory_stores() if store == "memory" else sqlite_stores(os.path.join(folder, "bench.sqlite"))
        )
        conversation, state = pair
        await seed_by_commits(conversation, "t", rows, in_context)
        workload = Workload.build(conversation, state, provider=InstantModel())
        warmup, steps = _steps_for(in_context, quick)
        walls, cpus, _ = await measure_steps(workload, "t", warmup=warmup, steps=steps)
        return _summary(store, rows, in_context, walls, cpus)


@dataclass
class MotoDynamo:
    """DynamoDB on a moto server in this process (and fake credentials); tables per measurement."""

    client: DynamoDBClient
    conversation_table: str = ""
    state_table: str = ""
    _count: int = 0

    def stores(
        self, metrics: StoreMetrics | None = None, *, page_size: int | None = 100
    ) -> tuple[DynamoConversationStore, DynamoStateStore]:
        """The two DynamoDB stores over these tables (``page_size=None``: the worker's, as in
        ``aws/runtime.py``)."""
        from stepagent.stores.dynamodb import dynamo_stores

        return dynamo_stores(
            self.client,
            conversation_table=self.conversation_table,
            state_table=self.state_table,
            metrics=metrics,
            page_size=page_size,
        )

    @contextlib.asynccontextmanager
    async def fresh_tables(self) -> AsyncIterator[MotoDynamo]:
        """Fresh tables: moto copies a whole table on every transaction, so one measurement's seeded rows
        must not slow down the next one's commits."""
        from stepagent.aws.resources import ensure_tables

        self._count += 1
        tables = MotoDynamo(self.client, f"bench-conv-{self._count}", f"bench-state-{self._count}")
        await ensure_tables(self.client, tables.conversation_table, tables.state_table)
        try:
            yield tables
        finally:
            for table in (tables.conversation_table, tables.state_table):
                await self.client.delete_table(TableName=table)


@contextlib.contextmanager
def local_moto() -> Iterator[str]:
    """A moto server on loopback for the duration (its endpoint URL), with fake credentials in the
    environment so nothing can reach real AWS."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request log
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def moto_dynamodb() -> AsyncIterator[MotoDynamo]:
    from stepagent.aws.clients import AwsSession, open_client

    with local_moto() as endpoint:
        async with open_client(AwsSession("us-east-1"), "dynamodb", endpoint) as client:
            yield MotoDynamo(client)


async def dynamodb_overhead(moto: MotoDynamo, rows: int, in_context: int, *, quick: bool = False) -> Overhead:
    thread = f"t-{rows:06d}-{in_context:06d}"
    async with moto.fresh_tables() as tables:
        await seed_dynamodb(tables.client, tables.conversation_table, thread, rows, in_context)
        metrics = StoreMetrics()
        conversation, state = tables.stores(metrics)
        workload = Workload.build(conversation, state, provider=InstantModel())
        warmup, steps = (1, 3) if in_context >= 10_000 or quick else (2, 10)
        walls, cpus, last = await measure_steps(workload, thread, warmup=warmup, steps=steps, metrics=metrics)
    result = _summary("dynamodb-moto", rows, in_context, walls, cpus)
    if last is not None:
        result.calls_per_step = dict(sorted(last.calls.items()))
        result.rows_read_per_step = last.rows_read
        result.bytes_written_per_step = last.bytes_written
    return result


class _CompletionCounter:
    def __init__(self) -> None:
        self.completions = 0

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        if isinstance(event, CompletionFinished):
            self.completions += 1


async def local_mode_rate(*, threads: int = 10, rounds: int = 50, quick: bool = False) -> dict[str, Any]:
    """Steps per second of local mode, interactively: each round sends one user message to each of
    ``threads`` threads and waits until the system is idle, so every message is one step (no batching)."""
    from stepagent.modes.local import LocalAgentSystem

    if quick:
        threads, rounds = 2, 3
    counter = _CompletionCounter()
    system = LocalAgentSystem.create(ScriptedProvider({"default": [{"text": "ok"}]}), observer=counter)
    async with system:
        start = time.perf_counter()
        for n in range(rounds):
            for t in range(threads):
                await system.send_user_text(f"thread-{t}", f"message {n}")
            await system.wait_idle(timeout=600)
        elapsed = time.perf_counter() - start
    return {
        "threads": threads,
        "messages": threads * rounds,
        "steps": counter.completions,
        "seconds": round(elapsed, 3),
        "steps_per_second": round(counter.completions / elapsed, 1),
        "method": "rounds of one user message per thread, each round run until idle; in-memory stores, "
        "scripted model (one text reply)",
    }


def as_dict(result: Overhead) -> dict[str, Any]:
    return asdict(result)
