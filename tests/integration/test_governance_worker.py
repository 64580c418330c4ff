"""Limits, cost and structured output through the worker on moto: a scripted model that calls a tool
forever is stopped at exactly the per-turn limit, the events on the output queue say so, and the spend
kept with the root is exactly what the usage records add up to."""

from __future__ import annotations

import json
import uuid

import pytest

from stepagent.client import Client
from stepagent.providers.factory import make_provider
from stepagent.usage import thread_usage
from tests.integration.aws_helpers import aws_stack, script_file

LOOP = {
    "rules": [
        {"when": "report", "on": ["user"], "reply": [{"output": {"city": "Paris", "sunny": True}}]},
    ],
    "default": [
        {"text": "Checking."},
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    ],
}
SCHEMA = {"type": "object", "required": ["city", "sunny"]}


@pytest.mark.asyncio
async def test_a_looping_model_stops_at_exactly_the_limit_through_the_worker() -> None:
    model = f"scripted:{script_file(LOOP)}"
    name = make_provider(model).info.name
    env = {
        "STEPAGENT_MODEL": model,
        "STEPAGENT_MAX_MODEL_CALLS_PER_TURN": "3",
        "STEPAGENT_PRICES": json.dumps({name: {"input": 3, "output": 15}}),
    }
    async with aws_stack(env=env) as stack:
        thread = f"conv-{uuid.uuid4().hex[:8]}"
        await stack.send_user(thread, "what is the weather?", "m1")
        await stack.pump()
        events = await stack.outputs()
        kinds = [e["type"] for e in events]
        assert kinds.count("tool_call") == 3 and kinds.count("tool_result") == 3
        [limit] = [e for e in events if e["type"] == "limit_reached"]
        assert (limit["limit"], limit["value"], limit["used"]) == ("model_calls_per_turn", 3, 3)
        assert kinds[-2:] == ["limit_reached", "turn_complete"]
        report = await thread_usage(stack.runtime.conversation, thread)
        assert report is not None and report.total.completions == 3
        spend = await stack.runtime.state.spend(thread)
        total = report.total
        assert spend.tokens == total.input_tokens + total.output_tokens
        expected_cost = (total.input_tokens * 3 + total.output_tokens * 15) / 1_000_000
        assert spend.cost_usd == pytest.approx(expected_cost)
        assert total.cost_usd == pytest.approx(expected_cost)
        usage = events[-1]["usage"]
        assert set(usage) == {
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "cost_usd",
        }
        info = await stack.runtime.conversation.get_thread(thread)
        assert info is not None and info.turn_model_calls == 3

        # The next user text starts a new count; a structured answer ends the turn with its output.
        await stack.send_user(thread, "report please", "m2")
        await stack.pump()
        events = await stack.outputs()
        assert [e["type"] for e in events if e["type"] in ("limit_reached", "tool_call")] == []
        assert events[-1]["type"] == "turn_complete" and "output" not in events[-1]


@pytest.mark.asyncio
async def test_structured_output_through_the_worker() -> None:
    model = f"scripted:{script_file(LOOP)}"
    env = {"STEPAGENT_MODEL": model, "STEPAGENT_OUTPUT_SCHEMA": json.dumps(SCHEMA)}
    async with aws_stack(env=env) as stack:
        thread = f"conv-{uuid.uuid4().hex[:8]}"
        await stack.send_user(thread, "report please", "m1")
        await stack.pump(twice=True)  # every batch handed over twice: the output is reported once, the same
        events = await stack.outputs()
        turns = [e for e in events if e["type"] == "turn_complete"]
        assert [t["output"] for t in turns] == [{"city": "Paris", "sunny": True}]
        assert turns[0]["usage"]["input_tokens"] > 0 and "cost_usd" not in turns[0]["usage"]
        # A client waiting for its message gets the turn's output.
        async with Client(stack.settings, poll_interval=0.05) as client:
            other = f"conv-{uuid.uuid4().hex[:8]}"
            message_id = await client.send(other, "report please")
            await stack.pump()
            assert await client.wait(other, message_id, timeout=30) == {"city": "Paris", "sunny": True}
