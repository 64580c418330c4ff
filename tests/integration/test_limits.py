"""Input that grows one step's commit past DynamoDB's transaction limits (100 actions, 4 MB), through the
worker on moto.

Every place whose item count grows with input is driven to (or far past) its limit:

- **held events**: 300 subscription events arrive while a tool call is pending; the step that gets the
  result releases all of them (900 state changes in one commit, nine times a transaction's 100 actions:
  the journal's chunking is what is exercised; more events only repeat it) — all folded in, in order, nothing
  dead-lettered;
- **a 10-record batch of claim-checked events** held at once: ten ~300 KB deferrals in one commit (over the
  4 MB budget), then released;
- **spawned children**: one step spawning children up to the per-step round limit, each spawn with its
  own index entry and intent;
- **compaction**: a compaction whose summary covers more rows than one transaction could hold.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from stepagent.core.completion import MAX_ROUNDS_PER_STEP
from stepagent.history_items import AssistantText, EventItem, ToolCallItem
from stepagent.messages import InputMessage, SubscriptionEvent, ToolResult
from stepagent.senders.claim_check import wrap_body
from stepagent.stores.base import ThreadKind
from stepagent.tools.base import Tool, ToolContext
from tests.integration.aws_helpers import SCRIPT, TOOLS, Stack, aws_stack, failed_ids

pytestmark = pytest.mark.asyncio


class Subscribe(Tool):
    """A subscription that starts at once; its events are sent by the test."""

    name = "subscribe"
    description = "Subscribe to ticks."
    parameters = {"type": "object", "properties": {}}

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        started = ToolResult.text(context.tool_call_id, "subscribed to ticks")
        message = InputMessage.tool_result(context.thread_id, started, subscription=True)
        await context.sender.send(message, context.tool_call_id)


def script(*rules: dict[str, Any]) -> dict[str, Any]:
    return {**SCRIPT, "rules": [*rules, *SCRIPT["rules"]]}


WATCH = {"when": "watch", "on": ["user"], "reply": [{"tool_call": {"name": "subscribe", "arguments": {}}}]}
WATCHING = {"when": "^subscribed to ticks", "on": ["tool_result"], "reply": [{"text": "Watching."}]}


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def pump_input(stack: Stack) -> None:
    """Only the input queue (the tool queue waits: its call stays pending)."""
    while True:
        event = await stack.receive_event(stack.input_url)
        if not event["Records"]:
            return
        result = await stack.runtime.handle_sqs_batch(event)
        assert failed_ids(result) == []
        await stack.ack(stack.input_url, event, result)


async def send_ticks(stack: Stack, thread: str, subscription: str, texts: list[str]) -> None:
    for start in range(0, len(texts), 10):
        entries = []
        for offset, text in enumerate(texts[start : start + 10]):
            n = start + offset
            message = InputMessage(
                content=ToolResult.text(subscription, text),
                group_id=thread,
                synthetic=SubscriptionEvent(tool_call_id=subscription, associative=True),
                id=f"tick-{n}",
            )
            queues = stack.runtime.queues
            body = await wrap_body(message.to_json(), queues.blobs)
            entries.append(
                {
                    "Id": str(n),
                    "MessageBody": body,
                    "MessageGroupId": thread,
                    "MessageDeduplicationId": f"tick-{n}",
                }
            )
        response = await stack.sqs.send_message_batch(QueueUrl=stack.input_url, Entries=entries)
        assert not response.get("Failed")


async def held_events_round_trip(stack: Stack, texts: list[str]) -> str:
    """Subscribe, start a slow tool, hold ``texts`` as events behind it, then release them; the thread."""
    thread = tid("ticker")
    await stack.send_user(thread, "watch the ticks", "m1")
    await stack.pump()
    [subscribe] = [
        row.item.call.id
        async for row in stack.runtime.conversation.load_rows(thread)
        if isinstance(row.item, ToolCallItem)
    ]
    await stack.send_user(thread, "what is the weather?", "m2")
    await pump_input(stack)  # get_weather waits on the tool queue
    await send_ticks(stack, thread, subscribe, texts)
    await pump_input(stack)
    held = await stack.runtime.state.deferred_inputs(thread)
    assert [d.message_id for d in held] == [f"tick-{n}" for n in range(len(texts))]
    await stack.pump(rounds=200)  # the result arrives: everything held is released
    assert await stack.runtime.state.deferred_inputs(thread) == []
    assert not await stack.receive(stack.resources.input_dlq_url), "an input was dead-lettered"
    assert all(failed_ids(result) == [] for _, _, result in stack.handled)
    return thread


async def test_hundreds_of_held_events_are_released_in_order() -> None:
    count = 300
    ticks = [f"tick {n}" for n in range(count)]
    last = {"when": f"^tick {count - 1}$", "on": ["event"], "reply": [{"text": "All the ticks."}]}
    async with aws_stack(script=script(WATCH, WATCHING, last), tools=[*TOOLS, Subscribe()]) as stack:
        thread = await held_events_round_trip(stack, ticks)
        items = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
        texts = await stack.texts(thread)
        start = texts.index("Sunny in Paris")
        assert texts[start + 1 : start + count + 1] == ticks  # every event once, in arrival order
        assert all(isinstance(i, EventItem) for i in items[start + 1 : start + count + 1])
        assert texts[start + count + 1 :] == ["All the ticks."]
        info = await stack.runtime.conversation.get_thread(thread)
        assert info is not None and info.tail == len(texts)


async def test_ten_claim_checked_events_held_in_one_batch_exceed_four_megabytes() -> None:
    ticks = [f"tick {n} " + "y" * 300_000 for n in range(10)]  # ~3 MB of deferrals in one commit
    last = {"when": "^tick 9 ", "on": ["event"], "reply": [{"text": "Ten big ticks."}]}
    async with aws_stack(script=script(WATCH, WATCHING, last), tools=[*TOOLS, Subscribe()]) as stack:
        thread = await held_events_round_trip(stack, ticks)
        texts = await stack.texts(thread)
        start = texts.index("Sunny in Paris")
        assert texts[start + 1 : start + 11] == ticks
        assert texts[start + 11 :] == ["Ten big ticks."]


async def test_one_step_spawning_children_up_to_the_round_limit() -> None:
    spawn = {
        "when": "delegate|successfully spawned",
        "reply": [
            {
                "tool_call": {
                    "name": "spawn_thread",
                    "arguments": {"instructions": "n", "child_of": "{thread_stack}"},
                }
            }
        ],
    }
    quiet_child = {"when": "You are now INSIDE", "reply": [{"text": "child here"}]}
    async with aws_stack(script=script(quiet_child, spawn)) as stack:
        thread = tid("spawner")
        await stack.send_user(thread, "delegate", "m1")
        await stack.pump(rounds=100)
        children = await stack.runtime.conversation.children(thread)
        assert len(children) == MAX_ROUNDS_PER_STEP  # one spawn per round, as many rounds as allowed
        assert all(c.kind == ThreadKind.CHILD for c in children)
        assert len({c.spawn_tool_call_id for c in children}) == MAX_ROUNDS_PER_STEP
        for child in children:
            assert (await stack.texts(child.thread_id))[-1] == "child here"
        assert await stack.runtime.state.open_intents(thread) == []


async def test_a_compaction_covering_more_rows_than_one_transaction() -> None:
    compact = {
        "when": "INSIDE a compaction thread",
        "reply": [
            {
                "tool_call": {
                    "name": "close_thread",
                    "arguments": {"thread_id": "{thread_id}", "report_to_parent": "SUMMARY"},
                }
            }
        ],
    }
    # 150 held events make a 300-row history in one step; the next completion passes the threshold.
    ticks = [f"tick {n} " + "z" * 40 for n in range(150)]
    async with aws_stack(
        script={**script(WATCH, WATCHING, compact), "context_window": 6000}, tools=[*TOOLS, Subscribe()]
    ) as stack:
        thread = await held_events_round_trip(stack, ticks)
        await stack.pump(rounds=100)
        summary = await stack.runtime.conversation.latest_summary(thread)
        assert summary is not None and summary.text == "SUMMARY" and summary.up_to_order > 100
        [child] = [
            c for c in await stack.runtime.conversation.children(thread) if c.kind == ThreadKind.COMPACTION
        ]
        assert (await stack.runtime.conversation.get_thread(child.thread_id)).closed  # type: ignore[union-attr]
        await stack.send_user(thread, "hello again", "m3")
        await stack.pump()
        items = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
        assert isinstance(items[-1], AssistantText)
