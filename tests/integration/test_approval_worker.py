"""Approval through the real worker on moto: a built-in needs approval only when named
(``STEPAGENT_APPROVAL=sleep``); the waiting call publishes ``approval_required`` and no ``turn_complete``;
schema-level bad decisions go the bad-input route (input DLQ with the reason, an ``error`` event,
``retrying: false``); a decision for a call that does not wait is refused with an ``error`` event and
changes nothing; a rejection answers the call and the model continues."""

from __future__ import annotations

import json
from typing import Any

from stepagent.history_items import waiting_for_approval
from stepagent.messages import InputMessage
from tests.integration.aws_helpers import aws_stack

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "nap",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 5}}}],
        },
        {"when": "declined", "on": ["tool_result"], "reply": [{"text": "Staying awake."}]},
    ],
    "default": [{"text": "ok"}],
}


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def test_approval_decisions_through_the_worker() -> None:
    async with aws_stack(script=SCRIPT, env={"STEPAGENT_APPROVAL": "sleep"}) as stack:
        thread = "conv-approve"
        await stack.send_user(thread, "take a nap", "m1")
        await stack.pump()
        rows = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
        waiting = waiting_for_approval(rows)
        assert waiting is not None and waiting.call.name == "sleep"
        events = await stack.outputs()
        [asked] = of(events, "approval_required")
        assert asked["tool_call_id"] == waiting.call.id and asked["args"] == {"seconds": 5}
        assert asked["thread_id"] == thread and of(events, "turn_complete") == []

        # An unknown decision is bad input: dead-lettered with the reason, an error event, nothing changes.
        bad = {
            "content": {"type": "approval", "tool_call_id": waiting.call.id, "decision": "maybe"},
            "group_id": thread,
        }
        await stack.send_raw(json.dumps(bad), thread, "bad-1")
        # A decision for a call this thread does not have: refused with an error event, not dead-lettered.
        unknown = InputMessage.approval(thread, "call-nope", "approve", id="d-unknown")
        await stack.runtime.sender.send(unknown, "d-unknown")
        await stack.pump()
        [dead] = await stack.receive(stack.resources.input_dlq_url)
        assert json.loads(dead["Body"]) == bad
        assert "content.decision" in dead["MessageAttributes"]["stepagent_error"]["StringValue"]
        errors = of(await stack.outputs(), "error")
        assert len(errors) == 2 and all(e["retrying"] is False for e in errors)
        assert any("call-nope" in e["message"] for e in errors)
        rows_after = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
        assert rows_after == rows

        # A rejection answers the call (the timer never starts) and the model continues.
        decision = InputMessage.approval(thread, waiting.call.id, "reject", message="not now", id="d1")
        await stack.runtime.sender.send(decision, "d1")
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts[-1] == "Staying awake." and "not now" in texts[-2]
        assert of(await stack.outputs(), "turn_complete")
