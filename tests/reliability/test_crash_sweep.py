"""Crash at every I/O boundary of a conversation, let the FIFO queue redeliver, and require the final
stored state to equal the crash-free run: no lost input, no duplicated row, no wedged thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from stepagent.core.completion import RetryPolicy
from stepagent.core.step import StepConfig, StepInput
from stepagent.history_items import (
    AssistantText,
    EventItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    encode_item,
)
from stepagent.messages import InputMessage
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.memory import memory_stores
from stepagent.tools.base import Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import InProcessFunctionRunner, tool
from tests.engine.harness import no_sleep
from tests.reliability.faults import FaultPlan, Faulty, FifoQueue, InjectedCrash

SCRIPT: dict[str, Any] = {
    "rules": [
        {"when": "what time", "reply": [{"tool_call": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
        {"when": "^12:00", "reply": [{"text": "It is noon."}]},
        {
            "when": "delegate",
            "reply": [
                {"text": "Delegating."},
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "count", "child_of": "{thread_stack}"},
                    }
                },
            ],
        },
        {"when": "successfully spawned", "reply": [{"text": "Spawned a child."}]},
        {
            "when": "You are now INSIDE",
            "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "three"}}}],
        },
        {
            "when": "Report sent to parent",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {"thread_id": "{thread_id}", "report_to_parent": "done"},
                    }
                }
            ],
        },
        {"when": "Report from child thread: three", "reply": [{"text": "Got the report."}]},
        {"when": "has shut down", "reply": [{"text": "Child finished."}]},
    ],
    "default": [{"text": "ok"}],
}


@dataclass
class World:
    plan: FaultPlan
    snapshot: dict[str, Any]
    tool_runs: list[str] = field(default_factory=list)


async def run_conversation(
    inputs: list[str], crash_at: int | None, *, dedupe: bool = True, batch_size: int = 1
) -> World:
    conversation, state = memory_stores()
    queue = FifoQueue(dedupe=dedupe)
    plan = FaultPlan(crash_at)
    runs: list[str] = []

    @tool
    async def get_time(zone: str) -> str:
        """The current time."""
        runs.append(zone)
        return "12:00"

    sender = Faulty(queue, plan, "queue")
    config = StepConfig(
        provider=Faulty(ScriptedProvider(SCRIPT), plan, "model"),
        toolset=Toolset.of([get_time, *builtin_tools()]),
        sender=sender,
        runner=InProcessFunctionRunner([get_time]),
        retry=RetryPolicy(sleep=no_sleep),
    )
    system = AgentSystem(Faulty(conversation, plan, "conversation"), Faulty(state, plan, "state"), config)
    for index, text in enumerate(inputs):
        await queue.send(InputMessage.user_text("root", text), f"user-{index}")
    for _ in range(200):
        batch = queue.receive(batch_size)
        if not batch:
            break
        try:
            results = await system.step([StepInput(r.message, r.message_id) for r in batch])
        except InjectedCrash:
            continue  # the invocation died: nothing acknowledged, the queue redelivers
        for result in results:
            assert result.ok, result.error
        queue.ack(batch)
    else:
        raise AssertionError("the conversation never went idle")

    backend = conversation.backend
    snapshot = {
        thread: {
            "rows": [(r.order, encode_item(r.item)) async for r in conversation.load_rows(thread)],
            "items": [r.item async for r in conversation.load_rows(thread)],
            "closed": info.closed,
            "intents": [i.tool_call_id for i in await state.open_intents(thread)],
        }
        for thread, info in sorted(backend.threads.items())
    }
    return World(plan, snapshot, runs)


SCENARIOS = {
    "tool round trip": ["what time is it?"],
    "spawn, report, close": ["please delegate this"],
}


def rows(world: World) -> dict[str, Any]:
    return {
        thread: (data["rows"], data["closed"], data["intents"]) for thread, data in world.snapshot.items()
    }


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("dedupe", [True, False], ids=["queue-dedup", "no-queue-dedup"])
async def test_crash_at_every_io_boundary_converges_to_the_crash_free_history(
    scenario: str, dedupe: bool
) -> None:
    """With one message per delivery, batching cannot change, so the result must be byte-identical."""
    inputs = SCENARIOS[scenario]
    baseline = await run_conversation(inputs, None, dedupe=dedupe)
    assert baseline.plan.calls > 10
    assert all(not t["intents"] for t in baseline.snapshot.values())
    for crash_at in range(1, baseline.plan.calls + 1):
        world = await run_conversation(inputs, crash_at, dedupe=dedupe)
        assert world.plan.crashed, crash_at
        assert rows(world) == rows(baseline), f"diverged after a crash before {world.plan.log[-1]}"
        # The function tool may run again after a crash (at-least-once), always for the same call.
        assert set(world.tool_runs) == set(baseline.tool_runs)


def assert_well_formed(world: World, inputs: list[str]) -> None:
    """No lost input, no duplicated row, no wedged thread."""
    root = world.snapshot["root"]["items"]
    users = [i.content.text for i in root if isinstance(i, UserItem)]  # type: ignore[union-attr]
    assert users == inputs
    for thread, data in world.snapshot.items():
        items = data["items"]
        answered = [i.result.id for i in items if isinstance(i, ToolResultItem | EventItem)]
        assert len(answered) == len(set(answered)), f"{thread}: a call answered twice"
        events = [(i.tool_call_id, i.result.first_text()) for i in items if isinstance(i, EventItem)]
        assert len(events) == len(set(events)), f"{thread}: an event folded in twice"
        assert not data["intents"], f"{thread}: undispatched intents"
        last = items[-1]
        if isinstance(last, ToolCallItem):
            assert data["closed"] and last.call.name == "close_thread", (
                f"{thread} is wedged on {last.call.name}"
            )


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_crashes_with_batched_delivery_lose_and_duplicate_nothing(scenario: str) -> None:
    """With batches of up to 10, a crash may change how inputs are batched (so the model may answer two
    reports at once); the history must still be well formed and complete."""
    inputs = SCENARIOS[scenario]
    baseline = await run_conversation(inputs, None, batch_size=10)
    assert_well_formed(baseline, inputs)
    for crash_at in range(1, baseline.plan.calls + 1):
        world = await run_conversation(inputs, crash_at, batch_size=10, dedupe=False)
        assert world.plan.crashed, crash_at
        assert sorted(world.snapshot) == sorted(baseline.snapshot)
        assert_well_formed(world, inputs)


async def test_every_input_delivered_twice_leaves_identical_history() -> None:
    once = await run_conversation(["what time is it?", "please delegate this"], None)

    conversation, state = memory_stores()
    queue = FifoQueue(dedupe=False)
    original_send = queue.send

    async def send_twice(message: InputMessage, dedup_id: str) -> None:
        await original_send(message, dedup_id)
        await original_send(message, dedup_id)

    queue.send = send_twice  # type: ignore[method-assign]

    @tool
    async def get_time(zone: str) -> str:
        """The current time."""
        return "12:00"

    config = StepConfig(
        provider=ScriptedProvider(SCRIPT),
        toolset=Toolset.of([get_time, *builtin_tools()]),
        sender=queue,
        runner=InProcessFunctionRunner([get_time]),
        retry=RetryPolicy(sleep=no_sleep),
    )
    system = AgentSystem(conversation, state, config)
    for index, text in enumerate(["what time is it?", "please delegate this"]):
        await queue.send(InputMessage.user_text("root", text), f"user-{index}")
    while batch := queue.receive(1):
        for result in await system.step([StepInput(r.message, r.message_id) for r in batch]):
            assert result.ok, result.error
        queue.ack(batch)
    twice = {
        thread: [(r.order, encode_item(r.item)) async for r in conversation.load_rows(thread)]
        for thread in sorted(conversation.backend.threads)
    }
    assert twice == {thread: data["rows"] for thread, data in once.snapshot.items()}


async def _subscribed_world(crash_at: int | None) -> tuple[World, list[Any]]:
    """A thread with an active subscription gets [user text, non-associative event] in one batch. The
    event is routed to a child only after the user text is committed (spawn from committed history), so
    a crash in between must still end with the user text answered."""
    from stepagent.messages import SubscriptionEvent, ToolResult
    from tests.engine.harness import RecordingTool

    conversation, state = memory_stores()
    queue = FifoQueue(dedupe=False)
    plan = FaultPlan(None)
    script = {
        "rules": [
            {"when": "watch", "reply": [{"tool_call": {"name": "subscribe", "arguments": {}}}]},
            {"when": "subscribed", "reply": [{"text": "Watching."}]},
            {"when": "build failed", "reply": [{"text": "Child looks at it."}]},
            {"when": "status", "reply": [{"text": "All quiet."}]},
        ]
    }
    config = StepConfig(
        provider=Faulty(ScriptedProvider(script), plan, "model"),
        toolset=Toolset.of([RecordingTool(tool_name="subscribe"), *builtin_tools()]),
        sender=Faulty(queue, plan, "queue"),
        retry=RetryPolicy(sleep=no_sleep),
    )
    system = AgentSystem(Faulty(conversation, plan, "conversation"), Faulty(state, plan, "state"), config)

    async def drain() -> None:
        for _ in range(100):
            batch = queue.receive(10)
            if not batch:
                return
            try:
                results = await system.step([StepInput(r.message, r.message_id) for r in batch])
            except InjectedCrash:
                continue
            assert all(r.ok for r in results)
            queue.ack(batch)
        raise AssertionError("never idle")

    await queue.send(InputMessage.user_text("root", "watch builds"), "u1")
    await drain()
    call_id = next(i.call.id for i in (await _items(conversation, "root")) if isinstance(i, ToolCallItem))
    await queue.send(
        InputMessage.tool_result("root", ToolResult.text(call_id, "subscribed"), subscription=True), "r1"
    )
    await drain()
    plan.calls, plan.crash_at = 0, crash_at
    await queue.send(InputMessage.user_text("root", "status?"), "u2")
    event = ToolResult.text(call_id, "build failed")
    await queue.send(
        InputMessage.tool_result("root", event, synthetic=SubscriptionEvent(tool_call_id=call_id)), "e1"
    )
    await drain()
    return World(plan, {}), await _items(conversation, "root")


async def _items(conversation: Any, thread: str) -> list[Any]:
    return [r.item async for r in conversation.load_rows(thread)]


async def test_crash_after_a_prepare_phase_commit_still_answers_the_user() -> None:
    baseline, items = await _subscribed_world(None)
    assert items[-1] == AssistantText("All quiet.")
    for crash_at in range(1, baseline.plan.calls + 1):
        world, crashed_items = await _subscribed_world(crash_at)
        assert world.plan.crashed
        assert crashed_items == items, f"crash before {world.plan.log[-1]}"
