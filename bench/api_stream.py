"""What a client connected to the HTTP API's event stream costs in DynamoDB requests.

The stream (:class:`stepagent.api.events.TreeEvents`, paced as the API paces it) follows a conversation on
DynamoDB (moto) while this benchmark plays the worker with its own, uncounted, store clients:

- **idle**: a settled conversation, followed for a while by 1 stream, by 10 streams of the same
  conversation (one API process: their polls are shared), and by 10 streams of 10 conversations. A stream
  polls at the busy pace for :data:`~stepagent.api.events.BUSY_GRACE` seconds after it opens (the worker
  may be about to start); those reads are reported apart (``opening_requests``), then the steady state;
- **streaming**: one streamed turn — the model writes ~300 characters a second for 5 seconds, the
  ``LIVE`` item written as the worker's live writer writes it (at once, then every
  :data:`~stepagent.aws.live.LIVE_INTERVAL_S`, then cleared), then the commit of the reply and its
  ``turn_complete``. Reported: the writer's writes and the stream's reads per streamed turn, with the
  DynamoDB capacity units they bill (a write: one unit per started KB of the item; a strongly consistent
  read: one unit per started 4 KB of each item), how many ``text_delta`` events the stream sent per second
  of writing, and how long after its write the first text was out.

Targets: an idle conversation at most one read a second however many streams follow it (the idle poll
interval is the floor), a streaming one at most eight (a poll every 0.15 s, plus the reads of each commit).
Counts are the portable figures; moto's timings are not DynamoDB's.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from bench.overhead import MotoDynamo, moto_dynamodb
from stepagent.api.events import (
    BUSY_GRACE,
    BUSY_INTERVAL,
    IDLE_INTERVAL,
    ResumeTokens,
    SharedReads,
    TreeEvents,
)
from stepagent.api.keys import ApiKeys
from stepagent.aws.live import LIVE_INTERVAL_S
from stepagent.client.watch import StoreReader
from stepagent.history_items import AssistantText, HistoryItem, UserItem
from stepagent.messages import TextContent
from stepagent.stores.base import Commit, UsageRecord
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.dynamodb.live import LiveStore
from stepagent.stores.metrics import StoreMetrics

IDLE_TARGET = 1.0  # requests a second per idle conversation
STREAMING_TARGET = 8.0  # requests a second per stream while the model writes
CHARS_PER_SECOND = 300  # a fast model's pace
ITEM_OVERHEAD_BYTES = 120  # the LIVE item's key and other attributes, besides the text


def _requests(metrics: StoreMetrics) -> int:
    return sum(metrics.calls.values())


async def _follow(tree: TreeEvents, until: float) -> int:
    """Follow like the API's stream does until ``until`` (monotonic); the events seen."""
    seen = 0
    while time.monotonic() < until:
        async for _ in tree.poll():
            seen += 1
        await asyncio.sleep(tree.interval)
    return seen


async def _turn(conversation: Any, thread: str, version: int, text: str) -> None:
    rows: list[tuple[HistoryItem, str]] = [
        (UserItem(TextContent(text="hello")), f"{thread}-in-{version}"),
        (AssistantText(text), f"{thread}-out"),
    ]
    usage = UsageRecord(step_id=f"{thread}-in-{version}", model="bench:model", turn_complete=True)
    await conversation.commit(
        thread, Commit(expected_version=version, rows=rows, usage=usage, turn_complete=True)
    )


async def _idle(tables: MotoDynamo, streams: int, conversations: int, seconds: float) -> dict[str, Any]:
    writer, _ = tables.stores()
    threads = [f"idle-{streams}-{conversations}-{i}" for i in range(conversations)]
    for thread in threads:
        await _turn(writer, thread, 0, "settled")
    metrics = StoreMetrics()
    conversation, state = tables.stores(metrics)
    reads = SharedReads(StoreReader(conversation, state, DynamoIo(tables.client, None, None, metrics)))
    tokens = ResumeTokens(ApiKeys.generate().resume)
    trees = [
        TreeEvents(reads, threads[i % conversations], tokens=tokens, follow=True) for i in range(streams)
    ]
    # Catch up first (the replay of the settled turn), then measure the steady state.
    opened = _requests(metrics)
    for tree in trees:
        async for _ in tree.poll():
            pass
    await asyncio.gather(*(_follow(tree, time.monotonic() + BUSY_GRACE) for tree in trees))
    opening = _requests(metrics) - opened
    start = _requests(metrics)
    until = time.monotonic() + seconds
    await asyncio.gather(*(_follow(tree, until) for tree in trees))
    spent = _requests(metrics) - start
    per_second = spent / seconds
    return {
        "streams": streams,
        "conversations": conversations,
        "seconds": seconds,
        "requests": spent,
        "opening_requests_per_conversation": round(opening / conversations, 1),
        "requests_per_second_per_conversation": round(per_second / conversations, 3),
        "requests_per_second_per_stream": round(per_second / streams, 3),
        "target_per_conversation": IDLE_TARGET,
        "within_target": per_second / conversations <= IDLE_TARGET,
    }


async def _streaming(tables: MotoDynamo, seconds: int) -> dict[str, Any]:
    writer_metrics = StoreMetrics()
    writer, _ = tables.stores(writer_metrics)
    live = LiveStore(DynamoIo(tables.client, None, None, writer_metrics), tables.state_table)
    thread = "streaming"
    await _turn(writer, thread, 0, "first turn")
    metrics = StoreMetrics()
    conversation, state = tables.stores(metrics)
    reads = SharedReads(StoreReader(conversation, state, DynamoIo(tables.client, None, None, metrics)))
    tree = TreeEvents(reads, thread, tokens=ResumeTokens(ApiKeys.generate().resume), follow=True)
    async for _ in tree.poll():
        pass
    deltas: list[float] = []

    async def follow(until: float) -> None:
        while time.monotonic() < until:
            async for _, event in tree.poll():
                if event["type"] == "text_delta":
                    deltas.append(time.monotonic())
            await asyncio.sleep(tree.interval)

    start = _requests(metrics)
    began = time.monotonic()
    follower = asyncio.create_task(follow(began + seconds + 1.5))
    writes: list[tuple[float, int]] = []  # (when, item bytes) of each write of the worker's live writer
    text = ""
    while (elapsed := time.monotonic() - began) < seconds:
        text = "x" * max(1, round(elapsed * CHARS_PER_SECOND))
        writes.append((time.monotonic(), len(text.encode()) + ITEM_OVERHEAD_BYTES))
        await live.show(thread, 1, text, "writing", None)
        await asyncio.sleep(max(0.0, writes[-1][0] + LIVE_INTERVAL_S - time.monotonic()))
    await _turn(writer, thread, 1, text)
    await live.clear(thread)
    await follower
    elapsed = time.monotonic() - began
    spent = _requests(metrics) - start
    write_units = sum(math.ceil(size / 1024) for _, size in writes) + 1  # + the clear
    # Each poll reads the HEAD (one unit) and the LIVE item (one per started 4 KB of its text).
    polls = metrics.calls.get("BatchGetItem", 0)
    read_units = polls * (1 + math.ceil((len(text.encode()) + ITEM_OVERHEAD_BYTES) / 4096))
    during = [at for at in deltas if at <= began + seconds]
    return {
        "model_writes_seconds": seconds,
        "chars_per_second": CHARS_PER_SECOND,
        "live_interval_seconds": LIVE_INTERVAL_S,
        "busy_poll_seconds": BUSY_INTERVAL,
        "seconds": round(elapsed, 2),
        "requests": spent,
        "requests_per_second_per_stream": round(spent / elapsed, 3),
        "text_delta_events": len(deltas),
        "text_deltas_per_second_while_writing": round(len(during) / seconds, 2),
        "first_text_after_write_ms": round((deltas[0] - writes[0][0]) * 1000) if deltas else None,
        "per_streamed_turn": {
            "live_writes": len(writes) + 1,
            "live_write_units_at_most": write_units,
            "stream_reads": spent,
            "stream_read_units_at_most": read_units,
        },
        "target_per_stream": STREAMING_TARGET,
        "within_target": spent / elapsed <= STREAMING_TARGET,
    }


async def api_stream_costs(quick: bool = False) -> dict[str, Any]:
    """The ``api_stream`` section of ``docs/benchmarks.json``."""
    seconds = 2.0 if quick else 10.0
    results: dict[str, Any] = {"idle_interval_seconds": IDLE_INTERVAL, "idle": [], "streaming": None}
    async with moto_dynamodb() as moto:
        for streams, conversations in ((1, 1), (10, 1), (10, 10)):
            async with moto.fresh_tables() as tables:
                row = await _idle(tables, streams, conversations, seconds)
            results["idle"].append(row)
            print(
                f"  api idle: {streams} streams of {conversations} conversations: "
                f"{row['requests_per_second_per_conversation']} requests/s per conversation",
                flush=True,
            )
        async with moto.fresh_tables() as tables:
            results["streaming"] = await _streaming(tables, 2 if quick else 5)
        print(
            f"  api streaming: {results['streaming']['requests_per_second_per_stream']} requests/s per stream",
            flush=True,
        )
    return results
