"""One trace per turn on the AWS path: a conversation whose one user message makes the worker call a
function tool (tool queue → tool runner), sleep twice (delay queue → timer relay; EventBridge Scheduler),
spawn a child thread that reports back, and compact — every span the worker, the tool runner and the
children emit reaches an OTLP/HTTP collector on loopback with one trace id and the GenAI attributes.
Telemetry off: the same conversation imports nothing of OpenTelemetry and sends no ``traceparent``."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stepagent import telemetry
from stepagent.telemetry.otel import OtelTracer
from tests.conftest import REGION, moto_endpoint, unique_name
from tests.integration.aws_helpers import Stack, aws_stack
from tests.otlp_collector import otlp_collector


def close(report: str) -> dict[str, Any]:
    return {
        "tool_call": {
            "name": "close_thread",
            "arguments": {"thread_id": "{thread_id}", "report_to_parent": report},
        }
    }


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_call": {"name": name, "arguments": arguments}}


SCRIPT: dict[str, Any] = {
    "context_window": 16000,
    "rules": [
        {"when": "INSIDE a compaction thread", "reply": [close("SUMMARY")]},
        {"when": "You are now INSIDE", "reply": [tool_call("report_to_parent", report="three")]},
        {"when": "Report sent to parent", "reply": [close("done")]},
        {
            "when": "weather",
            "on": ["user"],
            "reply": [{"text": "Checking."}, tool_call("get_weather", city="Paris")],
        },
        {"when": "^Sunny in Paris", "on": ["tool_result"], "reply": [tool_call("sleep", seconds=0.01)]},
        {"when": "^Slept for 0.01", "on": ["tool_result"], "reply": [tool_call("sleep", seconds=7200)]},
        {
            "when": "^Slept for 7200",
            "on": ["tool_result"],
            "reply": [tool_call("spawn_thread", instructions="count", child_of="{thread_stack}")],
        },
        {"when": "successfully spawned", "reply": [{"text": "Spawned a child."}]},
        {"when": "Report from child thread: three", "reply": [{"text": "Got the report."}]},
        {"when": "has shut down", "reply": [{"text": "Child finished."}]},
    ],
    "default": [{"text": "ok"}],
}
PADDING = " ".join(f"word{n}" for n in range(4000))  # over half the window: a compaction at COMPACTING
COMPACTING = {"STEPAGENT_COMPACTION_THRESHOLD": "0.5"}


async def converse(stack: Stack, thread: str) -> list[dict[str, Any]]:
    """The whole turn: worker, tool runner, timer relay (the delay queue), the fired schedule, child."""
    await stack.send_user(thread, f"weather please {PADDING}", "m1")
    await stack.pump()
    # The short sleep waits one second on the delay queue. A pump slower than that (a loaded machine) has
    # already relayed it: the queues were drained, so either its result is in history or it is still there.
    if not any(text.startswith("Slept for 0.01") for text in await stack.texts(thread)):
        await stack.wait_visible(stack.resources.delay_queue_url)
        await stack.pump()
    assert await stack.runtime.deliver_due_schedules(datetime.now(UTC) + timedelta(hours=3)) == 1
    await stack.pump()
    return await stack.outputs()


async def test_every_span_of_a_turn_across_invocations_has_one_trace_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with otlp_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=stepagent")
        tracer = telemetry.tracer_from_env()
        assert isinstance(tracer, OtelTracer)
        async with aws_stack(script=SCRIPT, tracer=tracer, env=COMPACTING) as stack:
            thread = f"conv-{uuid.uuid4().hex[:8]}"
            outputs = await converse(stack, thread)
            assert tracer.flush()
    texts = [e["text"] for e in outputs if e["type"] == "text" and e["thread_id"] == thread]
    assert texts[0] == "Checking." and "Got the report." in texts and "Child finished." in texts
    spans = collector.spans
    assert collector.requests and collector.requests[0]["x-team"] == "stepagent"
    assert len(collector.trace_ids()) == 1, Counter(s.trace_id for s in spans)
    names = Counter(s.name for s in spans)
    assert names["execute_tool get_weather"] == 2  # the worker's dispatch and the tool runner's run
    assert names["execute_tool sleep"] == 2 and names["execute_tool spawn_thread"] == 1
    assert names["execute_tool report_to_parent"] == 1 and names["execute_tool close_thread"] == 2
    steps = [s for s in spans if s.name == "invoke_agent"]
    assert {s.attributes["gen_ai.conversation.id"] for s in steps} == {thread}
    threads = {s.attributes["stepagent.thread_id"] for s in steps}
    assert len(threads) == 3  # the root, its child and its compaction thread
    assert all(s.attributes["gen_ai.agent.name"] == "stepagent" for s in steps)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert chats and all(s.attributes["gen_ai.usage.input_tokens"] > 0 for s in chats)
    assert all(
        "gen_ai.request.model" in s.attributes and "gen_ai.provider.name" in s.attributes for s in chats
    )
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.parent_span_id not in by_id]
    assert [s.name for s in roots] == ["invoke_agent"]  # one tree: every other span has its parent here
    # Flat, not a staircase: every later step (the root's, the child's, the compaction's) and the tool
    # runner's run hang directly under the turn's first step; nothing is deeper than a step's own spans.
    first_step = roots[0]
    assert all(by_id[s.parent_span_id] is first_step for s in steps if s is not first_step)
    runs = [s for s in spans if s.name == "execute_tool get_weather"]
    assert all(by_id[s.parent_span_id].name == "invoke_agent" for s in runs)

    def depth(span: Any) -> int:
        return 0 if span.parent_span_id not in by_id else 1 + depth(by_id[span.parent_span_id])

    assert max(depth(s) for s in spans) <= 3, sorted((depth(s), s.name) for s in spans)
    assert {s.service for s in spans} == {"stepagent"}


async def test_with_telemetry_off_no_message_carries_a_trace() -> None:
    assert not telemetry.enabled()
    async with aws_stack() as stack:
        thread = f"conv-{uuid.uuid4().hex[:8]}"
        await stack.send_user(thread, "what is the weather?", "m1")
        await stack.pump()
        records = [r for _, event, _ in stack.handled for r in event["Records"]]
        assert records and all("traceparent" not in r["messageAttributes"] for r in records)


def test_an_unreachable_collector_costs_at_most_the_export_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    with otlp_collector(hang=True) as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.3")
        tracer = telemetry.tracer_from_env()
        assert tracer is not None
        span = tracer.start_span("invoke_agent", {}, None)
        span.end()
        started = time.monotonic()
        assert tracer.flush() is False  # dropped with a warning, never raised
        # The default timeout (10 s) would take far longer: the configured bound is what holds.
        assert time.monotonic() - started < 5
        assert tracer.take() == []
    assert "stepagent.telemetry.otel" in sys.modules


def test_the_lambda_entry_reads_the_export_headers_from_a_secret_and_exports_before_returning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3

    from stepagent.aws import lambda_entry

    secrets = boto3.client("secretsmanager", endpoint_url=moto_endpoint(), region_name=REGION)
    name = unique_name("otlp-headers")
    secrets.create_secret(Name=name, SecretString="x-team=from-the-secret")
    with otlp_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("STEPAGENT_OTLP_HEADERS_SECRET_ID", name)
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint())
        monkeypatch.setenv("AWS_REGION", REGION)
        try:
            tracer = lambda_entry.tracer()
            assert tracer is not None and lambda_entry.telemetry.process_tracer() is tracer
            tracer.start_span("invoke_agent", {}, None).end()
            lambda_entry.telemetry.flush()  # what every handler does before it returns
        finally:
            lambda_entry.reset()
    assert [s.name for s in collector.spans] == ["invoke_agent"]
    assert collector.requests[0]["x-team"] == "from-the-secret"
