"""Limits and structured output on in-memory stores: each limit stops a looping model at exactly its value,
children count toward their root, a redelivered step counts nothing twice; answers are validated against
the output schema, sent back with the errors, and given up on with an ``error`` after the retries."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from stepagent import tool
from stepagent.agent_config import AgentConfig
from stepagent.core.step import StepConfig, StepInput
from stepagent.events import EventCollector, LimitReached, TurnComplete
from stepagent.history_items import AssistantText
from stepagent.messages import InputMessage
from stepagent.modes.step_mode import AgentSystem
from stepagent.outputs.build import step_events
from stepagent.providers.base import ModelRequest, Usage
from stepagent.providers.prices import PriceTable, parse_prices
from stepagent.providers.scripted import ScriptedProvider
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.memory import memory_stores
from stepagent.testing import run_conversation
from stepagent.testing.inprocess import InProcessQueueDriver
from stepagent.tools.base import Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import InProcessFunctionRunner
from stepagent.usage import thread_usage

PINGS: list[int] = []


@tool
def ping(n: int) -> str:
    """Ping once.

    Args:
        n: A number.
    """
    PINGS.append(n)
    return f"pong {n}"


@tool(inline=True)
def echo(text: str) -> str:
    """Echo the text (inline)."""
    return f"echo {text}"


#: A model that never stops calling tools.
LOOP = {"default": [{"text": "again"}, {"tool_call": {"name": "ping", "arguments": {"n": 1}}}]}
LOOP_INLINE = {"default": [{"tool_call": {"name": "echo", "arguments": {"text": "x"}}}]}


class Recording(ScriptedProvider):
    """The scripted model, keeping every request it was sent."""

    def __init__(self, script: Any) -> None:
        super().__init__(script)
        self.requests: list[ModelRequest] = []

    def stream(self, request: ModelRequest) -> Any:
        self.requests.append(request)
        return super().stream(request)


class World:
    """An agent system on in-memory stores, driven as the queue would."""

    def __init__(self, script: Any, *, agent: AgentConfig, prices: PriceTable | None = None) -> None:
        self.conversation, self.state = memory_stores()
        self.sender = InProcessSender()
        self.provider = Recording(script)
        self.config = StepConfig(
            provider=self.provider,
            toolset=Toolset.of([ping, echo, *builtin_tools()]),
            sender=self.sender,
            runner=InProcessFunctionRunner([ping]),
            agent=agent,
            **({"prices": prices} if prices is not None else {}),
        )
        self.system = AgentSystem(self.conversation, self.state, self.config)
        self.driver = InProcessQueueDriver(self.system, self.sender)
        self.events = EventCollector()

    async def say(self, thread: str, text: str, message_id: str) -> None:
        await self.sender.send(InputMessage.user_text(thread, text, id=message_id), message_id)
        for result in await self.driver.run_until_idle(self.events):
            assert result.error is None, result.error

    def limits(self) -> list[LimitReached]:
        return [e for _, e in self.events.events if isinstance(e, LimitReached)]

    def turns(self, thread: str) -> list[TurnComplete]:
        return [e for t, e in self.events.events if t == thread and isinstance(e, TurnComplete)]


# ---- limits ---------------------------------------------------------------------------------------------


def test_a_looping_model_stops_at_exactly_the_per_turn_limit_and_user_text_starts_a_new_count() -> None:
    PINGS.clear()
    transcript = run_conversation(
        ["go", "go on"], model=LOOP, tools=[ping], agent=AgentConfig(max_model_calls_per_turn=3)
    )
    assert len(transcript.tool_calls("ping")) == 6 and len(PINGS) == 6  # 3 per turn, never a 4th call
    assert len(transcript.texts()) == 6
    assert transcript.limits == [
        {"thread_id": "conversation", "limit": "model_calls_per_turn", "value": 3, "used": 3},
        {"thread_id": "conversation", "limit": "model_calls_per_turn", "value": 3, "used": 3},
    ]
    # No history item is added for the limit: each turn ends on the last tool result.
    kinds = [item["kind"] for item in transcript.of()]
    assert kinds[-1] == "tool_result" and kinds.count("user") == 2


async def test_the_per_turn_limit_also_counts_rounds_inside_one_step() -> None:
    world = World(LOOP_INLINE, agent=AgentConfig(max_model_calls_per_turn=4))
    await world.say("t", "go", "m1")
    assert len(world.provider.requests) == 4  # four rounds of inline calls in one step, then the limit
    assert [(e.limit, e.value, e.used) for e in world.limits()] == [("model_calls_per_turn", 4, 4)]
    [turn] = world.turns("t")
    assert turn.usage.output_tokens > 0  # the step's four calls are in its turn_complete
    info = await world.conversation.get_thread("t")
    assert info is not None and info.turn_model_calls == 4


async def test_the_token_limit_counts_the_whole_conversation_and_blocks_every_later_call() -> None:
    world = World(LOOP, agent=AgentConfig(max_conversation_tokens=1))
    await world.say("t", "go", "m1")
    assert len(world.provider.requests) == 1
    spend = await world.state.spend("t")
    [reached] = world.limits()
    assert (reached.limit, reached.value, reached.used) == ("conversation_tokens", 1, spend.tokens)
    report = await thread_usage(world.conversation, "t")
    assert report is not None
    total = report.total
    assert spend.tokens == total.input_tokens + total.output_tokens > 0
    # Once reached, a new user message gets no model call either.
    await world.say("t", "please", "m2")
    assert len(world.provider.requests) == 1
    assert [e.limit for e in world.limits()] == ["conversation_tokens", "conversation_tokens"]
    assert (await world.state.spend("t")) == spend


async def test_the_cost_limit_uses_the_price_table() -> None:
    model = Recording(LOOP).info.name
    prices = parse_prices(f'{{"{model}": {{"input": 1000, "output": 1000}}}}')  # $0.001 a token
    world = World(LOOP, agent=AgentConfig(max_conversation_cost_usd=0.05), prices=prices)
    await world.say("t", "go", "m1")
    spend = await world.state.spend("t")
    calls = len(world.provider.requests)
    assert spend.cost_usd >= 0.05 and calls >= 1
    # Every call but the last started below the limit.
    records = [r async for r in world.conversation.usage_records("t")]
    assert sum(r.cost_usd or 0 for r in records) == pytest.approx(spend.cost_usd)
    [reached] = world.limits()
    assert reached.limit == "conversation_cost_usd" and reached.value == 0.05
    assert reached.used == pytest.approx(spend.cost_usd)
    turn = world.turns("t")[-1]
    assert turn.cost_usd is not None


DELEGATE = {
    "rules": [
        {
            "when": "delegate",
            "on": ["user"],
            "reply": [
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "count to three", "child_of": "{thread_stack}"},
                    }
                }
            ],
        },
        {"when": "successfully spawned", "reply": [{"text": "Waiting for the child."}]},
        {
            "when": "You are now INSIDE",
            "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "one two three"}}}],
        },
        {"when": "Report sent to parent", "reply": [{"text": "Reported."}]},
        {"when": "one two three", "reply": [{"output": {"answer": "three"}}]},
    ],
    "default": [{"text": "ok"}],
}


async def test_children_count_toward_their_roots_spend_and_limits() -> None:
    world = World(DELEGATE, agent=AgentConfig())
    await world.say("r", "delegate", "m1")
    report = await thread_usage(world.conversation, "r")
    assert report is not None and len(report.threads) == 2
    total = report.total
    spend = await world.state.spend("r")
    root_only = report.threads["r"]
    assert spend.tokens == total.input_tokens + total.output_tokens
    assert spend.tokens > root_only.input_tokens + root_only.output_tokens  # the child's tokens are in it
    # A token limit the root alone never reaches stops the tree once the child's tokens count too.
    limit = root_only.input_tokens + root_only.output_tokens + 1
    limited = World(DELEGATE, agent=AgentConfig(max_conversation_tokens=limit))
    await limited.say("r", "delegate", "m1")
    reached = limited.limits()
    assert reached and reached[0].limit == "conversation_tokens"
    assert len(limited.provider.requests) < len(world.provider.requests)


async def test_a_redelivered_step_counts_nothing_twice() -> None:
    world = World(LOOP, agent=AgentConfig(max_model_calls_per_turn=2))
    message = InputMessage.user_text("t", "go", id="m1")
    await world.system.step([StepInput(message, "m1")], world.events)
    spend, info = await world.state.spend("t"), await world.conversation.get_thread("t")
    assert info is not None and info.turn_model_calls == 1 and spend.tokens > 0
    await world.system.step([StepInput(message, "m1")], world.events)  # the same input again
    assert await world.state.spend("t") == spend
    again = await world.conversation.get_thread("t")
    assert again is not None and (again.turn_model_calls, again.version) == (1, info.version)
    # Run the turn to its limit, then redeliver the step that hit it: same events, nothing counted.
    for result in await world.driver.run_until_idle(world.events):
        assert result.error is None
    spend = await world.state.spend("t")
    first = step_events("t", [e for _, e in world.events.take()], [])
    last_result = next(m for m in reversed(world.sender.sent) if m.message.group_id == "t")
    redelivered = [StepInput(last_result.message, last_result.message_id)]
    await world.system.step(redelivered, world.events)
    second = step_events("t", [e for _, e in world.events.take()], redelivered)
    assert await world.state.spend("t") == spend
    limit_events = [e for e in second if e["type"] == "limit_reached"]
    assert [(e["limit"], e["value"], e["used"]) for e in limit_events] == [("model_calls_per_turn", 2, 2)]
    [turn] = [e for e in second if e["type"] == "turn_complete"]
    assert turn["event_id"] in {e["event_id"] for e in first if e["type"] == "turn_complete"}


# ---- structured output ------------------------------------------------------------------------------------

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
    "required": ["city", "temp_c"],
}


class Weather(BaseModel):
    city: str
    temp_c: float


def test_a_valid_answer_is_the_turns_output() -> None:
    script = {"default": [{"output": {"city": "Paris", "temp_c": 21}}]}
    transcript = run_conversation("weather?", model=script, output_schema=WEATHER)
    assert transcript.output == {"city": "Paris", "temp_c": 21}
    assert transcript.reply == '{"city": "Paris", "temp_c": 21}'


def test_an_invalid_answer_is_sent_back_with_the_errors_and_the_corrected_one_counts() -> None:
    script = {
        "rules": [
            {
                "when": "does not match the required output schema",
                "reply": [{"output": {"city": "Oslo", "temp_c": "4"}}],
            },
        ],
        "default": [{"text": "It is sunny."}],
    }
    transcript = run_conversation("weather?", model=script, output_schema=Weather)
    assert transcript.output == {"city": "Oslo", "temp_c": 4.0}  # pydantic's own coercion
    users = [i["text"] for i in transcript.of() if i["kind"] == "user"]
    assert users[0] == "weather?" and users[1].startswith(
        "Your answer does not match the required output schema"
    )
    assert "the answer is not JSON" in users[1]
    assert transcript.error_events == []


def test_an_answer_that_stays_invalid_ends_with_an_error_naming_the_problems() -> None:
    script = {"default": [{"output": {"city": "Paris"}}]}
    agent = AgentConfig(output_schema=WEATHER, output_retries=2)
    transcript = run_conversation("weather?", model=script, agent=agent)
    assert transcript.output is None
    assert len(transcript.texts()) == 3  # the first answer and two retries
    [error] = transcript.error_events
    assert error.startswith("The answer did not match the output schema after 3 attempts")
    assert "'temp_c' is a required property" in error


async def test_only_the_root_gets_the_schema_and_is_validated() -> None:
    world = World(DELEGATE, agent=AgentConfig(output_schema={"type": "object", "required": ["answer"]}))
    await world.say("r", "delegate", "m1")
    by_thread = {tuple(r.thread_stack): r.output_schema for r in world.provider.requests}
    assert {stack for stack, schema in by_thread.items() if schema is not None} == {("r",)}
    assert any(len(stack) == 2 for stack in by_thread)  # the child was asked, without a schema
    # The root's first answer ("Waiting for the child.") did not match; its retry and the report's turn did.
    outputs = [t.output for t in world.turns("r") if t.has_output]
    assert outputs[-1] == {"answer": "three"}
    child_items = [i for i in await _items(world, "r") if isinstance(i, AssistantText)]
    assert child_items


async def _items(world: World, thread: str) -> list[Any]:
    return [row.item async for row in world.conversation.load_rows(thread)]


def test_turn_complete_carries_cache_tokens_cost_and_output() -> None:
    events: list[Any] = [
        TurnComplete(
            usage=Usage(input_tokens=5, cache_read_tokens=2),
            model="anthropic:claude-haiku-4-5",
            step_id="m1",
            version=3,
            cost_usd=0.0000052,
            output=None,
            has_output=True,
        ),
        LimitReached(limit="conversation_tokens", value=10, used=12),
    ]
    [turn, limit] = step_events("t", events, [StepInput(InputMessage.user_text("t", "x"), "m1")])
    assert turn["usage"] == {
        "input_tokens": 5,
        "output_tokens": 0,
        "cache_read_tokens": 2,
        "cache_write_tokens": 0,
        "cost_usd": 0.0000052,
    }
    assert "output" in turn and turn["output"] is None  # a JSON null output is still an output
    assert limit == {
        "type": "limit_reached",
        "event_id": limit["event_id"],
        "limit": "conversation_tokens",
        "value": 10,
        "used": 12,
    }


async def test_a_pydantic_schema_reaches_the_provider_with_its_class_name() -> None:
    # Providers send a class's schema in their vendor's strict form and a written schema as given: they tell
    # the two apart by the class name the request carries.
    script = {"default": [{"output": {"city": "Paris", "temp_c": 21}}]}
    for spec, expected in ((Weather, "Weather"), (WEATHER, None)):
        world = World(script, agent=AgentConfig(output_schema=spec))
        await world.say("r", "weather?", "m1")
        [request] = world.provider.requests
        assert request.output_schema is not None
        assert request.output_schema_class == expected
