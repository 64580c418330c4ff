"""An MCP server's question during a call, through the real worker and tool runner on moto: the thread
publishes ``input_required`` and no ``turn_complete``; the ``elicitation`` answer continues the call and the
model sees the tool's real result. A 2026-07-28 server: the tool runner ends its run at the question (the
server's request state kept in DynamoDB with the waiting call) and the answer re-sends the call through
the outbox. An older server: the tool runner holds the session and reads the answer from the state table.
Accept, decline and cancel, on both eras."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stepagent.messages import InputMessage
from stepagent.rap.server import serve_in_background
from stepagent.tools.mcp_session import forget_all
from tests.integration.aws_helpers import Stack, aws_stack
from tests.mcp.fixtures.eras import Recorder, build, recording

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "delete",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "web__confirm_delete", "arguments": {"path": "a.txt"}}}],
        },
        {"when": "^deleted a.txt because it is old", "on": ["tool_result"], "reply": [{"text": "Deleted."}]},
        {"when": "declined", "on": ["tool_result"], "reply": [{"text": "Kept (declined)."}]},
        {"when": "cancelled", "on": ["tool_result"], "reply": [{"text": "Kept (cancelled)."}]},
    ],
    "default": [{"text": "ok"}],
}

ANSWERS: dict[str, tuple[dict[str, Any] | None, str, str]] = {
    "accept": ({"reason": "it is old"}, "deleted a.txt because it is old", "Deleted."),
    "decline": (None, "kept a.txt: the user declined", "Kept (declined)."),
    "cancel": (None, "kept a.txt: the user cancelled", "Kept (cancelled)."),
}


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def _env(base: str) -> dict[str, str]:
    return {"STEPAGENT_MCP_SERVERS": json.dumps([{"name": "web", "url": f"{base}/mcp"}])}


async def _pump_input(stack: Stack) -> None:
    """Feed only the input queue to the worker until it is empty (the tool runner is busy elsewhere)."""
    url = stack.resources.input_queue_url
    for _ in range(60):
        event = await stack.receive_event(url)
        if not event["Records"]:
            return
        await stack.ack(url, event, await stack.runtime.handle_sqs_batch(event))
    raise AssertionError("the input queue did not drain")


@pytest.mark.parametrize("action", sorted(ANSWERS))
async def test_a_2026_server_question_through_the_worker(action: str) -> None:
    forget_all()
    seen = Recorder()
    async with (
        serve_in_background(recording(build().streamable_http_app(), seen)) as base,
        aws_stack(script=SCRIPT, env=_env(base)) as stack,
    ):
        thread = f"conv-elicit-{action}"
        await stack.send_user(thread, "please delete a.txt", "m1")
        await stack.pump()
        events = await stack.outputs()
        [asked] = of(events, "input_required")
        [called] = of(events, "tool_call")
        assert asked["tool_call_id"] == called["tool_call_id"] and asked["thread_id"] == thread
        assert asked["message"] == "Why should I delete it?"
        assert asked["requested_schema"]["required"] == ["reason"]
        assert of(events, "turn_complete") == []  # the thread waits, nothing runs
        assert seen.rpc("tools/call") == 1

        content, result, reply = ANSWERS[action]
        answer = InputMessage.elicitation(thread, asked["tool_call_id"], action, content, id="a1")
        await stack.runtime.sender.send(answer, "a1")
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts[-2:] == [result, reply]
        assert of(await stack.outputs(), "turn_complete")
        assert seen.rpc("tools/call") == 2 and seen.rpc("initialize") == 0

        # a second answer: the call no longer waits — an error event, nothing re-sent
        again = InputMessage.elicitation(thread, asked["tool_call_id"], "accept", {"reason": "x"}, id="a2")
        await stack.runtime.sender.send(again, "a2")
        await stack.pump()
        [error] = of(await stack.outputs(), "error")
        assert error["retrying"] is False and "waiting for an answer" in error["message"]
        assert seen.rpc("tools/call") == 2


@pytest.mark.parametrize("action", sorted(ANSWERS))
async def test_an_older_server_question_through_the_worker(action: str) -> None:
    forget_all()
    seen = Recorder()
    app = recording(build().streamable_http_app(), seen, legacy=True)
    async with (
        serve_in_background(app) as base,
        aws_stack(script=SCRIPT, env={**_env(base), "STEPAGENT_MCP_INPUT_WAIT": "30"}) as stack,
    ):
        thread = f"conv-held-{action}"
        await stack.send_user(thread, "please delete a.txt", "m1")
        await _pump_input(stack)  # the step dispatches the call to the tool queue
        tool_url = stack.resources.tool_queue_url
        tool_event = await stack.receive_event(tool_url)
        assert len(tool_event["Records"]) == 1
        running = asyncio.create_task(stack.runtime.handle_tool_batch(tool_event))
        asked: list[dict[str, Any]] = []
        for _ in range(200):  # the held call sends its question; the worker publishes it
            await _pump_input(stack)
            asked = of(await stack.outputs(), "input_required")
            if asked:
                break
            await asyncio.sleep(0.05)
        [question] = asked
        assert question["message"] == "Why should I delete it?" and not running.done()

        content, result, reply = ANSWERS[action]
        answer = InputMessage.elicitation(thread, question["tool_call_id"], action, content, id="a1")
        await stack.runtime.sender.send(answer, "a1")
        await _pump_input(stack)
        outcome = await asyncio.wait_for(running, 30)
        assert outcome == {"batchItemFailures": []}
        await stack.ack(tool_url, tool_event, outcome)
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts[-2:] == [result, reply]
        assert seen.rpc("tools/call") == 1  # one call, held open for the answer
