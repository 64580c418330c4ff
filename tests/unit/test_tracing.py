"""Spans of a step: ``invoke_agent`` around it, ``chat {model}`` per model call, ``execute_tool {name}`` per
tool run or dispatch, with the GenAI attributes; never able to fail a step; one trace per turn across the
queued messages of that turn (a tool result carries its trace on); a redelivered input re-emits its spans
into the trace its first delivery started."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from stepagent.core.completion import RetryPolicy
from stepagent.messages import InputMessage
from stepagent.providers.base import Final, TextDelta, Usage
from stepagent.telemetry.otel import OtelTracer, parse_traceparent
from stepagent.tools.base import ToolContext
from stepagent.tracing import (
    Attributes,
    continuing,
    current_traceparent,
    genai_model,
    trace_attributes,
    traced,
)
from tests.engine.harness import EchoSyncTool, RecordingTool, ReplayProvider, call, no_sleep, text
from tests.engine.test_agents import System


@dataclass
class SpanLog:
    name: str
    attributes: dict[str, Any]
    parent: str | None
    traceparent: str
    errors: list[str] = field(default_factory=list)
    ended: bool = False

    def set_attributes(self, attributes: Attributes) -> None:
        self.attributes.update(attributes)

    def record_error(self, error: BaseException) -> None:
        self.errors.append(type(error).__name__)

    def end(self) -> None:
        self.ended = True


@dataclass
class RecordingTracer:
    spans: list[SpanLog] = field(default_factory=list)
    capture_content: bool = False

    def start_span(
        self, name: str, attributes: Attributes, parent: str | None, seed: str | None = None
    ) -> SpanLog:
        span_id = f"{len(self.spans) + 1:016x}"
        self.spans.append(SpanLog(name, dict(attributes), parent, f"00-{'a' * 32}-{span_id}-01"))
        return self.spans[-1]


class BrokenTracer:
    """Fails at every turn: starting, and (through its spans) annotating, recording errors and ending."""

    capture_content = True

    def __init__(self, fail_start: bool) -> None:
        self.fail_start = fail_start

    def start_span(
        self, name: str, attributes: Mapping[str, Any], parent: str | None, seed: str | None = None
    ) -> BrokenTracer:
        if self.fail_start:
            raise RuntimeError("tracer down")
        return self

    @property
    def traceparent(self) -> str:
        raise RuntimeError("no context")

    def set_attributes(self, attributes: Attributes) -> None:
        raise RuntimeError("cannot annotate")

    def record_error(self, error: BaseException) -> None:
        raise RuntimeError("cannot record")

    def end(self) -> None:
        raise RuntimeError("cannot end")


@dataclass
class AnsweringTool(RecordingTool):
    """An asynchronous tool whose result comes back through the queue, as a tool runner's would."""

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        await super().execute(arguments, context)
        await context.send_result("sunny")


def scenario() -> tuple[ReplayProvider, list[Any]]:
    provider = (
        ReplayProvider()
        .then(call("echo_sync", "s1", text="a"), Final(usage=Usage(10, 2, 3, 4), stop_reason="tool_use"))
        .then(TextDelta("checking"), call("lookup", "c1", q="x"), Final())
    )
    return provider, [EchoSyncTool(), RecordingTool(tool_name="lookup")]


async def test_a_step_is_an_invoke_agent_span_with_its_model_calls_and_tool_runs_inside() -> None:
    provider, tools = scenario()
    system = System(provider, tools=tools)
    tracer = system.config.tracer = RecordingTracer()
    await system.say("t1", "go", "m1", metadata={"profile": None})
    spans = tracer.spans
    assert [(s.name, s.ended) for s in spans] == [
        ("invoke_agent", True),
        ("chat replay", True),
        ("execute_tool echo_sync", True),  # inline, in the round
        ("chat replay", True),
        ("execute_tool lookup", True),  # the dispatch
    ]
    step, chat, inline, second_chat, dispatch = spans
    assert step.parent is None and chat.parent == second_chat.parent == dispatch.parent == step.traceparent
    assert inline.parent == chat.traceparent  # an inline tool runs while its model call's stream is open
    assert step.attributes == {
        "gen_ai.operation.name": "invoke_agent",
        "stepagent.thread_id": "t1",
        "gen_ai.conversation.id": "t1",
        "gen_ai.agent.name": "stepagent",
    }
    assert chat.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "stepagent",
        "gen_ai.request.model": "replay",
        "stepagent.thread_id": "t1",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.usage.cache_read.input_tokens": 3,
        "gen_ai.usage.cache_creation.input_tokens": 4,
        "gen_ai.response.finish_reasons": ["tool_use"],
    }
    assert inline.attributes["gen_ai.tool.call.id"] == "s1"
    assert dispatch.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": "c1",
        "stepagent.thread_id": "t1",
    }  # no content unless content capture is on
    assert not any("gen_ai.output.messages" in s.attributes for s in spans)


async def test_content_is_recorded_only_when_capture_is_on() -> None:
    provider, tools = scenario()
    system = System(provider, tools=tools)
    tracer = system.config.tracer = RecordingTracer(capture_content=True)
    await system.say("t1", "go", "m1")
    by_name = {s.name: s for s in tracer.spans}
    assert by_name["execute_tool lookup"].attributes["gen_ai.tool.call.arguments"] == '{"q": "x"}'
    assert '"content": "checking"' in tracer.spans[3].attributes["gen_ai.output.messages"]


@pytest.mark.parametrize("fail_start", [True, False])
async def test_a_failing_tracer_never_fails_a_step(fail_start: bool) -> None:
    provider, tools = scenario()
    traced_system = System(provider, tools=tools)
    traced_system.config.tracer = BrokenTracer(fail_start)
    await traced_system.say("t1", "go", "m1")
    reference_provider, reference_tools = scenario()
    reference = System(reference_provider, tools=reference_tools)
    await reference.say("t1", "go", "m1")
    rows = [r.item async for r in traced_system.conversation.load_rows("t1")]
    assert rows == [r.item async for r in reference.conversation.load_rows("t1")]
    assert tools[1].dispatches == reference_tools[1].dispatches == [("c1", {"q": "x"})]


async def test_the_bodys_own_error_propagates_and_is_recorded() -> None:
    tracer = RecordingTracer()
    with pytest.raises(ValueError, match="boom"):
        async with traced(tracer, "execute_tool t", {"gen_ai.tool.name": "t"}):
            raise ValueError("boom")
    assert tracer.spans[0].errors == ["ValueError"] and tracer.spans[0].ended


async def test_concurrent_tasks_keep_their_own_trace_context() -> None:
    tracer = RecordingTracer()
    seen: dict[str, tuple[str | None, str | None]] = {}

    async def task(name: str, parent: str) -> None:
        with continuing(parent):
            async with traced(tracer, name, {}) as span:
                await asyncio.sleep(0)  # let the other task run inside its span too
                seen[name] = (current_traceparent(), span.traceparent)

    first, second = f"00-{'1' * 32}-{'1' * 16}-01", f"00-{'2' * 32}-{'2' * 16}-01"
    await asyncio.gather(task("a", first), task("b", second))
    assert {s.name: s.parent for s in tracer.spans} == {"a": first, "b": second}
    # What a send inside each span carries is its own task's turn context, not the other task's.
    assert {name: current for name, (current, _) in seen.items()} == {"a": first, "b": second}
    assert all(own is not None and own not in (first, second) for _, own in seen.values())
    assert current_traceparent() is None and trace_attributes() == {}


@pytest.mark.parametrize(
    ("provider", "model_id", "expected"),
    [
        ("anthropic", "claude-sonnet-4-5", ("anthropic", "claude-sonnet-4-5")),
        ("openai", "gpt-4o-mini", ("openai", "gpt-4o-mini")),
        (
            "bedrock",
            "anthropic.claude-3-haiku-20240307-v1:0",
            ("aws.bedrock", "anthropic.claude-3-haiku-20240307-v1:0"),
        ),
        ("", "scripted:/home/me/agents/demo_script.json", ("scripted", "demo_script")),
        ("", "scripted:inline", ("scripted", "inline")),
        ("", "function:answer", ("function", "answer")),
    ],
)
def test_the_chat_span_names_the_provider_and_the_bare_model_id(
    provider: str, model_id: str, expected: tuple[str, str]
) -> None:
    assert genai_model(provider, model_id) == expected


def test_a_malformed_traceparent_starts_a_new_trace() -> None:
    with continuing("not-a-traceparent"):
        assert current_traceparent() is None
    assert parse_traceparent(f"00-{'0' * 32}-{'1' * 16}-01") is None  # all-zero trace id: invalid


# ---- the OpenTelemetry SDK behind the port ----------------------------------------------------------------


def answering_scenario() -> tuple[ReplayProvider, AnsweringTool]:
    provider = (
        ReplayProvider()
        .then(call("lookup", "c1", q="x"), Final())
        .then(*text("it is sunny"))
        .then(*text("bye"))
    )
    return provider, AnsweringTool(tool_name="lookup")


async def test_a_turn_across_queued_messages_is_one_otel_trace_and_the_next_turn_another() -> None:
    provider, tool = answering_scenario()
    system = System(provider, tools=[tool])
    tracer = system.config.tracer = OtelTracer(None)
    await system.say("t1", "weather?", "m1")  # step → dispatch → result message → step
    first = tracer.take()
    await system.say("t1", "thanks", "m2")
    second = tracer.take()
    assert [s.name for s in first] == [
        "chat replay",
        "execute_tool lookup",
        "invoke_agent",
        "chat replay",
        "invoke_agent",
    ]
    assert len({s.context.trace_id for s in first}) == 1
    by_id = {s.context.span_id: s for s in first}
    tool_span = next(s for s in first if s.name == "execute_tool lookup")
    first_step, answering_step = first[2], first[-1]
    # The step the result starts is a sibling under the turn's first step, not under the tool span.
    assert answering_step.parent is not None and answering_step.parent.span_id == first_step.context.span_id
    assert by_id[tool_span.parent.span_id] is first_step  # type: ignore[union-attr]
    assert {s.context.trace_id for s in second} != {first[0].context.trace_id}


async def test_a_redelivered_input_re_emits_its_spans_into_the_same_trace() -> None:
    traces = []
    for _ in range(2):  # two runtimes: the first delivery, then the redelivery after a crash
        system = System(ReplayProvider().then(*text("hello")))
        tracer = system.config.tracer = OtelTracer(None)
        await system.say("t1", "hi", "m1")
        traces.append({s.context.trace_id for s in tracer.take()})
    assert len(traces[0]) == 1 and traces[0] == traces[1]


async def test_a_message_sent_inside_a_span_carries_its_context() -> None:
    tracer = OtelTracer(None)
    system = System(ReplayProvider())
    async with traced(tracer, "execute_tool x", {}) as span:
        await system.sender.send(InputMessage.user_text("t2", "hi"), "d1")
    [queued] = system.sender.drain()
    assert queued.traceparent == span.traceparent is not None


async def test_local_mode_traces_a_turn_across_its_queued_messages_as_one_trace() -> None:
    from stepagent.modes.local import LocalAgentSystem

    provider, tool = answering_scenario()
    tracer = OtelTracer(None)
    system = LocalAgentSystem.create(provider, tools=[tool], tracer=tracer, retry=RetryPolicy(sleep=no_sleep))
    await system.start()
    try:
        await system.send_user_text("t1", "weather?")
        await system.wait_idle(10)
    finally:
        await system.shutdown()
    spans = tracer.take()
    assert [s.name for s in spans].count("invoke_agent") == 2 and len(
        {s.context.trace_id for s in spans}
    ) == 1
