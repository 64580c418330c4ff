"""A trace a GenAI tool reads right, on the AWS path, exported to an OTLP/HTTP collector on loopback.

One conversation with a priced model (the real OpenAI provider, ``openai:gpt-4o-mini``, over an httpx
MockTransport serving OpenAI's streaming wire format), a function tool that waits for a person's approval
(``STEPAGENT_APPROVAL=get_weather``) and then runs on the tool runner, and a child thread. With content
capture on, every span carries the attributes the GenAI conventions name, in their JSON shapes; the turn —
including the step the approval resumes, which arrives with no trace context — is one trace, and every
later step hangs under the turn's first ``invoke_agent`` span as a sibling.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest

from stepagent import telemetry
from stepagent.history_items import waiting_for_approval
from stepagent.messages import InputMessage
from stepagent.providers.catalog import model_info
from stepagent.providers.openai_compat import OpenAIProvider
from stepagent.telemetry.otel import OtelTracer
from tests.integration.aws_helpers import aws_stack
from tests.otlp_collector import ReceivedSpan, otlp_collector

RESPONSE_MODEL = "gpt-4o-mini-2024-07-18"
SYSTEM_MARK = "You are"  # the default system prompt's opening words


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _chunk(n: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion.chunk",
        "model": RESPONSE_MODEL,
        "choices": [choice],
    }


class OpenAIWire:
    """Answers chat completions by the last message the model is shown; counts the requests."""

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.requests = 0

    def reply(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        last = body["messages"][-1]
        content = last.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        n = self.requests
        if child := re.search(r"Your thread ID is (\S+?)\.", text):
            return [self._call(n, "close_thread", {"thread_id": child[1], "report_to_parent": "three"})]
        if "Sunny" in text:
            return [self._call(n, "spawn_thread", {"instructions": "count", "child_of": [self.thread]})]
        if "weather please" in text:
            return [
                _chunk(n, {"role": "assistant", "content": "Checking."}),
                self._call(n, "get_weather", {"city": "Paris"}),
            ]
        return [_chunk(n, {"role": "assistant", "content": "Done."}), _chunk(n, {}, "stop")]

    def _call(self, n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call = {"index": 0, "id": f"call_{n}", "type": "function"}
        call["function"] = {"name": name, "arguments": json.dumps(arguments)}
        chunk = _chunk(n, {"tool_calls": [call]}, "tool_calls")
        return chunk

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests += 1
        chunks = self.reply(body)
        usage = {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129}
        chunks.append({"id": chunks[0]["id"], "model": RESPONSE_MODEL, "choices": [], "usage": usage})
        return httpx.Response(200, content=_sse(chunks), headers={"content-type": "text/event-stream"})


def _json(span: ReceivedSpan, name: str) -> Any:
    return json.loads(span.attributes[name])


async def test_a_turn_with_an_approval_and_a_child_is_one_flat_trace_with_the_genai_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    thread = f"conv-{uuid.uuid4().hex[:8]}"
    wire = OpenAIWire(thread)
    provider = OpenAIProvider(
        "gpt-4o-mini",
        api_key="sk-test",
        info=model_info("openai", "gpt-4o-mini"),
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(wire.handler)),
    )
    with otlp_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
        tracer = telemetry.tracer_from_env()
        assert isinstance(tracer, OtelTracer) and tracer.capture_content
        env = {"STEPAGENT_APPROVAL": "get_weather"}
        async with aws_stack(env=env, provider=provider, tracer=tracer) as stack:
            await stack.send_user(thread, "weather please", "m1")
            await stack.pump()
            rows = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
            waiting = waiting_for_approval(rows)
            assert waiting is not None and waiting.call.name == "get_weather"
            assert tracer.flush()  # the invocation that paused exports before the decision arrives
            # The decision comes from a process with no trace context (the API, the CLI): no traceparent.
            decision = InputMessage.approval(thread, waiting.call.id, "approve", id="d1")
            await stack.runtime.sender.send(decision, "d1")
            await stack.pump()
            assert tracer.flush()
            texts = await stack.texts(thread)
        assert texts[-1] == "Done.", texts

    spans = collector.spans
    by_id = {s.span_id: s for s in spans}
    names = Counter(s.name for s in spans)
    # One trace for the whole turn, the approval wait included.
    assert len(collector.trace_ids()) == 1, Counter(s.trace_id for s in spans)
    roots = [s for s in spans if s.parent_span_id not in by_id]
    assert [s.name for s in roots] == ["invoke_agent"], [s.name for s in roots]
    first = roots[0]
    steps = [s for s in spans if s.name == "invoke_agent"]
    threads = {s.attributes["stepagent.thread_id"] for s in steps}
    assert len(steps) >= 4 and len(threads) == 2, names  # the root's steps and the child's
    # Siblings, not a staircase: every later step (the resumed one and the child's) under the first.
    assert all(by_id[s.parent_span_id] is first for s in steps if s is not first)
    for step in steps:
        assert step.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert step.attributes["gen_ai.agent.name"] == "stepagent"
        assert step.attributes["gen_ai.conversation.id"] == thread

    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert chats and {s.name for s in chats} == {"chat gpt-4o-mini"}
    for chat in chats:
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.request.model"] == "gpt-4o-mini"
        assert chat.attributes["gen_ai.response.model"] == RESPONSE_MODEL
        assert re.fullmatch(r"chatcmpl-\d+", chat.attributes["gen_ai.response.id"])
        assert chat.attributes["gen_ai.usage.input_tokens"] == 120
        assert chat.attributes["gen_ai.usage.output_tokens"] == 9
        assert chat.attributes["gen_ai.response.finish_reasons"] in (["stop"], ["tool_calls"])
        [system] = _json(chat, "gen_ai.system_instructions")
        assert system["type"] == "text" and SYSTEM_MARK in system["content"]
        inputs = _json(chat, "gen_ai.input.messages")
        assert inputs and all(m["role"] in ("user", "assistant", "tool") and m["parts"] for m in inputs)
        [output] = _json(chat, "gen_ai.output.messages")
        assert output["role"] == "assistant" and output["finish_reason"] in ("stop", "tool_calls")
    # The first model call: the person's question in, the text and the tool call out.
    asking = min(chats, key=lambda s: by_id[s.parent_span_id] is not first)
    assert by_id[asking.parent_span_id] is first
    assert _json(asking, "gen_ai.input.messages")[-1] == {
        "role": "user",
        "parts": [{"type": "text", "content": "weather please"}],
    }
    [answer] = _json(asking, "gen_ai.output.messages")
    assert answer["parts"][0] == {"type": "text", "content": "Checking."}
    call_part = answer["parts"][1]
    assert call_part["type"] == "tool_call" and call_part["name"] == "get_weather"
    assert call_part["arguments"] == {"city": "Paris"} and call_part["id"] == waiting.call.id
    # A later call was shown the tool's answer as a tool_call_response.
    responses = [
        part
        for chat in chats
        for message in _json(chat, "gen_ai.input.messages")
        for part in message["parts"]
        if part["type"] == "tool_call_response" and part["id"] == waiting.call.id
    ]
    assert responses and responses[0]["response"].startswith("Sunny in Paris")

    tools = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    for tool in tools:
        assert tool.name == f"execute_tool {tool.attributes['gen_ai.tool.name']}"
        assert tool.attributes["gen_ai.tool.call.id"]
        assert isinstance(json.loads(tool.attributes["gen_ai.tool.call.arguments"]), dict)
    weather = [s for s in tools if s.attributes["gen_ai.tool.name"] == "get_weather"]
    assert len(weather) == 2  # the worker's dispatch and the tool runner's run
    assert all(json.loads(s.attributes["gen_ai.tool.call.arguments"]) == {"city": "Paris"} for s in weather)
    assert any(
        str(s.attributes.get("gen_ai.tool.call.result", "")).startswith("Sunny in Paris") for s in weather
    )
    [spawn] = [s for s in tools if s.attributes["gen_ai.tool.name"] == "spawn_thread"]
    assert "gen_ai.tool.call.result" in spawn.attributes  # an inline tool's result, on its own span
