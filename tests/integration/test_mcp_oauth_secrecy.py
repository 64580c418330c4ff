"""No OAuth token of a user ever reaches history, events, logs, traces or exports: one sign-in, a call
that reuses the token and one that refreshes it, end to end (the worker and tool runner on moto, the API's
callback, the real OAuth-protected MCP server) with every logger at DEBUG and OpenTelemetry exporting to a
loopback collector with content capture on; then every item of both tables, every output event, every log
record (its message and its extra fields), every span attribute, the callback's pages and the
``stepagent export`` lines of each conversation are searched for every access and refresh token the
authorization server issued."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from stepagent import telemetry
from stepagent.lifecycle.export import export_lines
from stepagent.telemetry.otel import OtelTracer
from tests.integration.test_mcp_oauth_worker import _state_items, oauth_world, of
from tests.otlp_collector import otlp_collector

_PLAIN = set(vars(logging.makeLogRecord({})))


def _log_text(record: logging.LogRecord) -> str:
    extra = {k: v for k, v in vars(record).items() if k not in _PLAIN}
    return record.getMessage() + " " + json.dumps(extra, default=str) + " " + (record.exc_text or "")


async def test_no_token_reaches_history_events_logs_traces_or_exports(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with otlp_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
        tracer = telemetry.tracer_from_env()
        assert isinstance(tracer, OtelTracer) and tracer.capture_content
        async with oauth_world(tracer=tracer) as world:
            events = await world.ask("conv-secret", "m1")
            [asked] = of(events, "oauth_required")
            pages = [(await world.sign_in(asked["auth_url"])).text]
            await world.stack.pump()
            events += await world.stack.outputs()
            events += await world.ask("conv-secret-2", "m2")  # reuses the token
            oauth = world.stack.runtime.oauth
            assert oauth is not None
            later = oauth.clock() + 7200
            world.stack.runtime.oauth = dataclasses.replace(oauth, clock=lambda: later)
            events += await world.ask("conv-secret-3", "m3")  # refreshes it
            assert world.authority.grants == ["authorization_code", "refresh_token"]
            assert tracer.flush()

            stack = world.stack
            tables = [await _state_items(stack), await _state_items(stack, stack.settings.conversation_table)]
            exports = [
                line
                for thread in ("conv-secret", "conv-secret-2", "conv-secret-3")
                async for line in export_lines(stack.runtime.conversation, stack.runtime.state, thread)
            ]
            texts = [t for thread in ("conv-secret", "conv-secret-3") for t in await stack.texts(thread)]
            assert "notes of alice: buy milk; call Bob" in texts  # the calls did run
            tokens = list(world.authority.issued)

    assert len(tokens) == 4  # two grants: an access and a refresh token each
    spans = [json.dumps([s.name, s.attributes], default=str) for s in collector.spans]
    assert spans and any("execute_tool notes__my_notes" in s for s in spans)
    logs = [_log_text(record) for record in caplog.records]
    assert logs
    places = {
        "state and conversation tables": json.dumps(tables),
        "output events": json.dumps(events),
        "log records": "\n".join(logs),
        "spans": "\n".join(spans),
        "exports": "\n".join(exports),
        "history texts": "\n".join(texts),
        "callback pages": "\n".join(pages),
    }
    for where, text in places.items():
        leaked = [token[:8] + "…" for token in tokens if token in text]
        assert not leaked, f"tokens found in the {where}: {leaked}"
