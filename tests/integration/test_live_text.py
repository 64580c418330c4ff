"""The live channel: the worker's per-step writer of the partial turn (aws/live.py) and the ``LIVE`` item
(stores/dynamodb/live.py). Throttling is checked with counters: with a long interval, any number of chunks
after the first write cause no further write until the step ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepagent.aws.live import StepLive
from stepagent.aws.settings import Settings
from stepagent.events import CompletionStarted, Info, TextChunk, ToolCallStarted, TurnCommitted
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.dynamodb.live import NOTICES_KEPT, LiveStore, decode_live, live_key
from stepagent.stores.metrics import StoreMetrics
from tests.conftest import DynamoEnv
from tests.polling import eventually


@dataclass
class FakeLiveStore:
    shows: list[tuple[int, str, str, str | None]] = field(default_factory=list)
    clears: int = 0
    fail: bool = False

    async def show(self, thread_id: str, version: int, text: str, phase: str, tool: str | None) -> None:
        if self.fail:
            raise RuntimeError("throttled")
        self.shows.append((version, text, phase, tool))

    async def clear(self, thread_id: str) -> None:
        self.clears += 1


@dataclass
class FakeHistory:
    version: int = 0


@dataclass
class FakeStep:
    history: FakeHistory = field(default_factory=FakeHistory)


def writer(store: FakeLiveStore, interval: float, first_delay: float = 0.0) -> tuple[StepLive, FakeStep]:
    live = StepLive(store, "t", interval, first_delay)  # type: ignore[arg-type]
    step = FakeStep()
    live.attach(step)  # type: ignore[arg-type]
    return live, step


async def until(condition: Callable[[], bool]) -> None:
    await eventually(condition, interval=0.001)


async def test_chunks_after_the_first_write_wait_for_the_interval() -> None:
    store = FakeLiveStore()
    live, _ = writer(store, interval=3600)
    live.on_event("t", CompletionStarted())
    live.on_event("t", TextChunk("Hel"))
    await until(lambda: len(store.shows) == 1)
    for chunk in ("lo", " wor", "ld"):
        live.on_event("t", TextChunk(chunk))
        await asyncio.sleep(0)
    assert store.shows == [(0, "Hel", "writing", None)]  # throttled: one write, however many chunks
    await live.close()
    assert store.clears == 1 and len(store.shows) == 1


async def test_the_partial_turn_follows_the_committed_version_and_restarts_at_boundaries() -> None:
    store = FakeLiveStore()
    live, step = writer(store, interval=0)
    step.history.version = 3
    live.on_event("t", CompletionStarted())
    live.on_event("t", TextChunk("Let me "))
    await until(lambda: len(store.shows) == 1)
    live.on_event("t", TextChunk("look."))
    await until(lambda: len(store.shows) == 2)
    # A call: the text before it is committed with it, so the partial turn starts again.
    live.on_event("t", ToolCallStarted(name="spawn_thread", arguments={}, tool_call_id="c1"))
    await until(lambda: len(store.shows) == 3)
    step.history.version = 4  # the call's commit (a synchronous tool runs after it)
    live.on_event("t", TextChunk("Spawned"))
    await until(lambda: len(store.shows) == 4)
    # A retried stream discards what it had streamed.
    live.on_event("t", Info("Stream error (overloaded), retrying..."))
    await until(lambda: len(store.shows) == 5)
    live.on_event("t", TurnCommitted(rows=[]))  # the step's commit: nothing partial is left to show
    await live.close()
    assert store.shows == [
        (3, "Let me ", "writing", None),
        (3, "Let me look.", "writing", None),
        (3, "", "calling", "spawn_thread"),
        (4, "Spawned", "writing", None),
        (4, "", "retrying", None),
    ]
    assert store.clears == 1


async def test_a_step_that_streams_nothing_writes_nothing() -> None:
    store = FakeLiveStore()
    live, _ = writer(store, interval=0)
    live.on_event("t", TurnCommitted(rows=[]))
    await live.close()
    assert store.shows == [] and store.clears == 0


async def test_a_tool_call_over_before_the_first_delay_writes_nothing_but_text_is_written_at_once() -> None:
    store = FakeLiveStore()
    live, _ = writer(store, interval=0, first_delay=3600)
    live.on_event("t", CompletionStarted())
    live.on_event("t", ToolCallStarted(name="get_weather", arguments={}, tool_call_id="c1"))
    await asyncio.sleep(0.01)
    live.on_event("t", TurnCommitted(rows=[]))
    await live.close()
    assert store.shows == [] and store.clears == 0

    # Text does not wait for the first delay: a reader sees the model's first words at once.
    store = FakeLiveStore()
    live, _ = writer(store, interval=0, first_delay=3600)
    live.on_event("t", CompletionStarted())
    live.on_event("t", ToolCallStarted(name="get_weather", arguments={}, tool_call_id="c1"))
    live.on_event("t", TextChunk("quick answer"))
    await eventually(lambda: bool(store.shows))
    assert store.shows[0][1:3] == ("quick answer", "writing"), store.shows
    await live.close()
    assert store.clears == 1


async def test_a_failing_live_store_never_fails_the_step() -> None:
    store = FakeLiveStore(fail=True)
    live, _ = writer(store, interval=0)
    live.on_event("t", CompletionStarted())
    live.on_event("t", TextChunk("x"))
    await asyncio.sleep(0.01)
    live.on_event("t", TextChunk("y"))
    await live.close()  # no exception; live text is off for the rest of this step
    assert store.shows == [] and live.store is None


async def test_the_live_item_round_trips_and_keeps_the_last_notices(dynamo: DynamoEnv) -> None:
    metrics = StoreMetrics()
    store = LiveStore(DynamoIo(dynamo.client, None, None, metrics), dynamo.state_table)

    async def read() -> Any:
        response = await dynamo.client.get_item(
            TableName=dynamo.state_table, Key=live_key("t"), ConsistentRead=True
        )
        return decode_live(response.get("Item"))

    await store.show("t", 7, "partial text", "writing", None)
    live = await read()
    assert (live.version, live.text, live.phase, live.tool) == (7, "partial text", "writing", None)
    assert live.partial_after(7) and not live.partial_after(8)
    await store.show("t", 7, "", "calling", "get_weather")
    assert (await read()).tool == "get_weather"

    for n in range(NOTICES_KEPT + 5):
        await store.notice("t", {"type": "error", "event_id": f"id{n}", "message": f"e{n}", "retrying": True})
    live = await read()
    assert live.notice_seq == NOTICES_KEPT + 5
    assert [n["message"] for n in live.notices] == [f"e{n}" for n in range(5, NOTICES_KEPT + 5)]
    assert [n["message"] for n in live.new_notices(NOTICES_KEPT + 3)] == [
        f"e{NOTICES_KEPT + 3}",
        f"e{NOTICES_KEPT + 4}",
    ]

    await store.clear("t")
    live = await read()
    assert live.version is None and live.phase is None and live.text == ""
    assert live.notice_seq == NOTICES_KEPT + 5  # notices stay
    await store.clear("never-written")  # nothing to clear: fine
    assert set(metrics.calls) == {"UpdateItem"}


def test_the_live_text_setting() -> None:
    assert Settings.from_env({}).live_text is True
    assert Settings.from_env({"STEPAGENT_LIVE_TEXT": "off"}).live_text is False
    assert Settings.from_env({"STEPAGENT_LIVE_TEXT": "ON"}).live_text is True
    import pytest

    from stepagent.errors import ConfigurationError

    with pytest.raises(
        ConfigurationError, match="STEPAGENT_LIVE_TEXT='maybe' is invalid: expected on or off"
    ):
        Settings.from_env({"STEPAGENT_LIVE_TEXT": "maybe"})
