"""Spans around model calls and tool dispatches: annotated with the thread and call ids, never able to fail a
step, and — through the X-Ray SDK — correct for the concurrent steps of one batch (each an asyncio task)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aws_xray_sdk import global_sdk_config
from aws_xray_sdk.core.lambda_launcher import LambdaContext
from aws_xray_sdk.core.recorder import AWSXRayRecorder

from stepagent.aws.tracing import XRayTracer
from stepagent.messages import InputMessage
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import Final, TextDelta
from stepagent.tracing import traced
from tests.engine.harness import EchoSyncTool, RecordingTool, ReplayProvider, call, text
from tests.engine.test_agents import System

TRACE_HEADER = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"


@dataclass
class SpanLog:
    name: str
    annotations: dict[str, str]
    errors: list[str] = field(default_factory=list)
    ended: bool = False

    def record_error(self, error: BaseException) -> None:
        self.errors.append(type(error).__name__)

    def end(self) -> None:
        self.ended = True


@dataclass
class RecordingTracer:
    spans: list[SpanLog] = field(default_factory=list)

    def start_span(self, name: str, annotations: Mapping[str, str]) -> SpanLog:
        self.spans.append(SpanLog(name, dict(annotations)))
        return self.spans[-1]


class BrokenTracer:
    """Fails at every turn: starting, and (through its spans) recording errors and ending."""

    def __init__(self, fail_start: bool) -> None:
        self.fail_start = fail_start

    def start_span(self, name: str, annotations: Mapping[str, str]) -> BrokenTracer:
        if self.fail_start:
            raise RuntimeError("tracer down")
        return self

    def record_error(self, error: BaseException) -> None:
        raise RuntimeError("cannot record")

    def end(self) -> None:
        raise RuntimeError("cannot end")


def scenario() -> tuple[ReplayProvider, list[Any]]:
    provider = (
        ReplayProvider()
        .then(call("echo_sync", "s1", text="a"), Final())
        .then(TextDelta("checking"), call("lookup", "c1", q="x"), Final())
    )
    return provider, [EchoSyncTool(), RecordingTool(tool_name="lookup")]


async def test_model_calls_and_tool_runs_are_annotated_spans() -> None:
    provider, tools = scenario()
    system = System(provider, tools=tools)
    tracer = system.config.tracer = RecordingTracer()
    await system.say("t1", "go", "m1")
    assert [(s.name, s.annotations, s.ended) for s in tracer.spans] == [
        ("model", {"thread_id": "t1", "model": "replay"}, True),
        (
            "tool",
            {"thread_id": "t1", "tool_call_id": "s1", "tool": "echo_sync"},
            True,
        ),  # inline, in the round
        ("model", {"thread_id": "t1", "model": "replay"}, True),
        ("tool", {"thread_id": "t1", "tool_call_id": "c1", "tool": "lookup"}, True),  # the dispatch
    ]


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
        async with traced(tracer, "tool", {"thread_id": "t"}):
            raise ValueError("boom")
    assert tracer.spans[0].errors == ["ValueError"] and tracer.spans[0].ended


# ---- X-Ray -------------------------------------------------------------------------------------------------


class CapturingEmitter:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_entity(self, entity: Any) -> None:
        self.sent.append(json.loads(entity.serialize()))

    def set_daemon_address(self, address: Any) -> None:
        return None

    @property
    def ip(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return 2000


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AWSXRayRecorder, CapturingEmitter]]:
    """An X-Ray recorder as in a Lambda invocation (the Lambda context, a sampled trace header, streaming
    every closed subsegment as powertools configures it), sending to a list."""
    enabled = global_sdk_config.sdk_enabled()
    global_sdk_config.set_sdk_enabled(True)
    monkeypatch.setenv("_X_AMZN_TRACE_ID", TRACE_HEADER)
    emitter = CapturingEmitter()
    xray = AWSXRayRecorder()
    xray.emitter._socket.close()  # the default UDP emitter's socket: replaced below, closed here
    xray.configure(context=LambdaContext(), emitter=emitter, sampling=False, streaming_threshold=0)
    try:
        yield xray, emitter
    finally:
        global_sdk_config.set_sdk_enabled(enabled)


def flatten(entity: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield entity
    for child in entity.get("subsegments", []):
        yield from flatten(child)


async def test_concurrent_steps_of_a_batch_get_their_own_xray_subsegments(
    recorder: tuple[AWSXRayRecorder, CapturingEmitter],
) -> None:
    xray, emitter = recorder
    provider = ReplayProvider()
    for _ in range(3):
        provider.then(TextDelta("checking"), call("lookup", "c-any", q="x"), Final())
    system = System(provider, tools=[RecordingTool(tool_name="lookup")])
    system.config.tracer = XRayTracer(xray)
    agents = AgentSystem(system.conversation, system.state, system.config)

    xray.begin_subsegment("## handler")  # what powertools' capture_lambda_handler opens per invocation
    batch = [(InputMessage.user_text(f"t{n}", "go", id=f"m{n}"), f"m{n}") for n in range(3)]
    results = await agents.step(batch)  # three threads: three concurrent asyncio tasks
    xray.end_subsegment()

    assert all(result.ok for result in results), [r.error for r in results]
    [handler] = [e for e in emitter.sent if e["name"] == "## handler"]
    spans = [e for e in flatten(handler) if e["name"] in ("model", "tool")]
    assert sorted((s["name"], s["annotations"]["thread_id"]) for s in spans) == sorted(
        [("model", f"t{n}") for n in range(3)] + [("tool", f"t{n}") for n in range(3)]
    )
    assert all(s["parent_id"] == handler["id"] and not s.get("in_progress") for s in spans)
    assert all(s["annotations"]["tool_call_id"] == "c-any" for s in spans if s["name"] == "tool")
    assert all("end_time" in s for s in spans)


async def test_an_unsampled_invocation_traces_nothing(
    recorder: tuple[AWSXRayRecorder, CapturingEmitter], monkeypatch: pytest.MonkeyPatch
) -> None:
    xray, emitter = recorder
    monkeypatch.setenv("_X_AMZN_TRACE_ID", TRACE_HEADER.replace("Sampled=1", "Sampled=0"))
    system = System(ReplayProvider().then(*text("ok")))
    system.config.tracer = XRayTracer(xray)
    await system.say("t1", "hi", "m1")
    assert emitter.sent == []
