"""What the live partial text costs (``STEPAGENT_LIVE_TEXT``), and what a client's poll costs.

- :func:`live_text_costs`: worker steps on DynamoDB (moto) whose model streams for 0, 2 and 5 seconds
  (a 15-character chunk every 50 ms, ~300 characters a second, about a fast model's pace), with partial
  text on and off. Per step: the live writer's requests and bytes (its own
  :class:`~stepagent.stores.metrics.StoreMetrics`), the store's requests, and the wall time. The writer's
  requests follow ``1 + streaming seconds / interval + 1`` (the first text at once, then one every
  :data:`~stepagent.aws.live.LIVE_INTERVAL_S`, the clear); its bytes grow with the text, since every
  write carries the whole partial turn (DynamoDB bills an update by the item's size anyway).
- :func:`client_poll_cost`: the requests of one :class:`~stepagent.client.watch.TreeWatch` poll of an idle
  tree of 1 and of 3 threads — the steady cost of following a conversation (one ``BatchGetItem`` of a
  head and a ``LIVE`` item per thread).

Counts are the portable figures; moto's timings are not DynamoDB's.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from bench.overhead import MotoDynamo, moto_dynamodb
from bench.workload import Workload
from stepagent.aws.live import LIVE_INTERVAL_S, LiveText
from stepagent.messages import InputMessage
from stepagent.providers.base import Final, ModelInfo, ModelRequest, StreamEvent, TextDelta, Usage
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.metrics import StoreMetrics

CHUNK = "fifteen chars. "
CHUNK_SECONDS = 0.05


class StreamingModel:
    """Streams text for ``seconds`` (a chunk every 50 ms), like a model writing a long answer."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @property
    def info(self) -> ModelInfo:
        return ModelInfo("streaming", context_window=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        chunks = max(1, round(self.seconds / CHUNK_SECONDS))
        for _ in range(chunks):
            if self.seconds:
                await asyncio.sleep(CHUNK_SECONDS)
            yield TextDelta(CHUNK)
        yield Final(usage=Usage(input_tokens=1, output_tokens=chunks))


async def _steps(moto: MotoDynamo, seconds: float, enabled: bool, steps: int) -> dict[str, Any]:
    async with moto.fresh_tables() as tables:
        store_metrics = StoreMetrics()
        conversation, state = tables.stores(store_metrics)
        workload = Workload.build(conversation, state, provider=StreamingModel(seconds))
        live = LiveText(tables.client, tables.state_table, enabled=enabled)
        workload.worker.live = live
        requests: list[int] = []
        written: list[int] = []
        store_requests: list[int] = []
        walls: list[float] = []
        for n in range(steps):
            message_id = f"live-{n}"
            await workload.queue.send(InputMessage.user_text("t", f"message {n}", id=message_id), message_id)
            live_before, store_before = live.metrics.snapshot(), store_metrics.snapshot()
            start = time.perf_counter()
            await workload.step()
            walls.append((time.perf_counter() - start) * 1000)
            spent = live.metrics.since(live_before)
            requests.append(spent.total_calls)
            written.append(spent.bytes_written)
            store_requests.append(store_metrics.since(store_before).total_calls)
    return {
        "stream_seconds": seconds,
        "live_text": "on" if enabled else "off",
        "steps": steps,
        "text_chars_per_step": max(1, round(seconds / CHUNK_SECONDS)) * len(CHUNK),
        "live_requests_per_step": statistics.median(requests),
        "live_bytes_per_step": statistics.median(written),
        "store_requests_per_step": statistics.median(store_requests),
        "median_step_ms": round(statistics.median(walls), 1),
    }


async def client_poll_cost(moto: MotoDynamo) -> list[dict[str, Any]]:
    from stepagent.client.watch import StoreReader, TreeWatch
    from stepagent.history_items import AssistantText
    from stepagent.stores.base import Commit, ThreadKind

    out = []
    async with moto.fresh_tables() as tables:
        for threads in (1, 3):
            metrics = StoreMetrics()
            conversation, state = tables.stores(metrics)
            root = f"poll-{threads}"
            await conversation.commit(
                root, Commit(expected_version=0, rows=[(AssistantText("hi"), "m")], turn_complete=True)
            )
            for n in range(threads - 1):
                child = f"{root}-child-{n}"
                await conversation.spawn_thread(
                    root, child_id=child, spawn_tool_call_id=f"s{n}", kind=ThreadKind.CHILD
                )
                await conversation.commit(
                    child, Commit(expected_version=0, rows=[(AssistantText("ok"), "m")], turn_complete=True)
                )
            reader = StoreReader(conversation, state, DynamoIo(tables.client, None, None, metrics))
            watch = TreeWatch(reader, root, {})
            await watch.poll()  # the first poll reads the tree (rows, children, choices)
            await watch.poll()
            before = metrics.snapshot()
            _, idle = await watch.poll()  # steady state
            spent = metrics.since(before)
            out.append({"threads": threads, "idle": idle, "requests_per_poll": dict(spent.calls)})
    return out


async def live_text_costs(quick: bool = False) -> dict[str, Any]:
    durations = (0.0, 0.5) if quick else (0.0, 2.0, 5.0)
    steps = 2 if quick else 5
    results: dict[str, Any] = {"interval_seconds": LIVE_INTERVAL_S, "steps": []}
    async with moto_dynamodb() as moto:
        for seconds in durations:
            for enabled in (True, False):
                row = await _steps(moto, seconds, enabled, steps)
                results["steps"].append(row)
                print(
                    f"  live text {row['live_text']}, {seconds:.0f} s streamed: "
                    f"{row['live_requests_per_step']} requests, {row['live_bytes_per_step']} bytes per step",
                    flush=True,
                )
        results["client_poll"] = await client_poll_cost(moto)
    results["method"] = (
        "worker steps (Workload, one record per invocation) on DynamoDB on moto; the model streams a "
        "15-character chunk every 50 ms for the given time; live requests/bytes are the live writer's own "
        "counters, store requests everything else the step did; client_poll is one steady-state poll of an "
        "idle thread tree"
    )
    return results
