"""A long conversation never wedges on its own growth, through the worker on moto.

40 turns in a 16,000-token window, each a question, one tool call with a ~2,000-character result and a
~200-word answer, with the scripted model's usage at 4 characters a token (text that tokenizes at ~4 bytes
a token, where truncation by the runtime's 3-bytes-a-token estimate used to start before compaction, and
every step from turn 19 on failed: "the request does not fit the model's context window").
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from stepagent.stores.base import ThreadKind
from tests.integration.aws_helpers import SCRIPT, Stack, aws_stack, failed_ids

pytestmark = pytest.mark.asyncio

TURNS = 40
ANSWER = "Answer: " + " ".join(f"word{n % 13}" for n in range(200))  # ~200 words, ~1,300 characters
LONG_SCRIPT: dict[str, Any] = {
    "context_window": 16_000,
    "rules": [
        {
            "when": "INSIDE a compaction thread",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {
                            "thread_id": "{thread_id}",
                            "report_to_parent": "Summary: questions answered.",
                        },
                    }
                }
            ],
        },
        {
            "when": "^Question",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "big_result", "arguments": {"size": 2_000}}}],
        },
        {"when": "^x{1000}", "on": ["tool_result"], "reply": [{"text": ANSWER}]},
        *SCRIPT["rules"],
    ],
    "default": [{"text": "ok"}],
}


async def pump_checked(stack: Stack) -> None:
    """Feed every queue until all are empty; no handler reports a failed record."""
    for _ in range(40):
        busy = False
        for url, handler in stack.handlers():
            event = await stack.receive_event(url)
            if not event["Records"]:
                continue
            busy = True
            result = await handler(event)
            assert failed_ids(result) == []
            await stack.ack(url, event, result)
        if not busy:
            return
    raise AssertionError("the queues did not drain")


async def test_a_40_turn_conversation_in_a_16k_window_answers_every_turn() -> None:
    thread = f"long-{uuid.uuid4().hex[:8]}"
    async with aws_stack(script=LONG_SCRIPT) as stack:
        for turn in range(TURNS):
            await stack.send_user(thread, f"Question {turn}: what does the report say? " * 4, f"q{turn}")
            await pump_checked(stack)
        events = await stack.outputs()
        texts = await stack.texts(thread)
        children = await stack.runtime.conversation.children(thread)
    assert [e for e in events if e["type"] == "error"] == []  # no failed step
    assert texts.count(ANSWER) == TURNS  # every turn answered
    compactions = [c for c in children if c.kind == ThreadKind.COMPACTION]
    assert len(compactions) >= 3  # it compacted instead of truncating until nothing fit
    completes = [e for e in events if e["type"] == "turn_complete" and e["thread_id"] == thread]
    assert len(completes) >= TURNS
