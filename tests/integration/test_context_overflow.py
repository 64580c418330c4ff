"""Context overflow through the worker on moto: no input is lost to fitting the window, and what cannot fit
is said, never silent.

- A turn whose arrival makes the request too large is answered after the compaction it triggers, seeing
  itself verbatim as the last item of its request, exactly once (the summary covers only what came before).
- A window smaller than the fixed part of every request (system prompt, tool schemas, output reserve) ends
  the turn with an ``error`` event naming both sizes, and no compaction runs.
- One input larger than the window gets an ``error`` event naming its size and the window; the thread
  answers the next message.

The scripted model reports usage as one token per 4 characters of the request.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stepagent.history_items import AssistantText, UserItem
from stepagent.messages import TextContent
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import ThreadKind
from tests.integration.aws_helpers import Stack, aws_stack, failed_ids
from tests.integration.test_cli import clean_env, stepagent

PAD = " Please keep the details of this request in mind for later."


def turn_text(turn: int, chars: int = 4_000) -> str:
    """Turn ``turn``'s question, padded to about ``chars`` characters."""
    head = f"TURN-{turn:02d}: what is the answer to question {turn}?"
    return head + PAD * ((chars - len(head)) // len(PAD))


def turns_script(turns: int, context_window: int) -> dict[str, Any]:
    """Answers each ``TURN-NN`` with ``ANSWER-NN``; a compaction thread closes with a short summary; any
    other input gets ``DEFAULT`` (which no turn should ever see)."""
    return {
        "context_window": context_window,
        "rules": [
            {
                "when": "INSIDE a compaction thread",
                "reply": [
                    {
                        "tool_call": {
                            "name": "close_thread",
                            "arguments": {
                                "thread_id": "{thread_id}",
                                "report_to_parent": "SUMMARY of turns.",
                            },
                        }
                    }
                ],
            },
            *(
                {"when": f"^TURN-{n:02d}:", "on": ["user"], "reply": [{"text": f"ANSWER-{n:02d}"}]}
                for n in range(1, turns + 1)
            ),
        ],
        "default": [{"text": "DEFAULT"}],
    }


@dataclass
class Recording:
    """The scripted model, keeping every request it was sent."""

    inner: ScriptedProvider
    requests: list[ModelRequest] = field(default_factory=list)

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        async for event in self.inner.stream(request):
            yield event


async def pump_checked(stack: Stack) -> None:
    """Feed every queue until all are empty; no handler reports a failed record."""
    for _ in range(60):
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


def answering_requests(provider: Recording, thread: str) -> dict[str, list[ModelRequest]]:
    """The root thread's requests by the answer the script gave them (the text of the last user item)."""
    out: dict[str, list[ModelRequest]] = {}
    for request in provider.requests:
        if request.thread_stack[-1] != thread:
            continue
        last = request.history[-1]
        key = last.text[:7] if isinstance(last, UserItem) and last.text else type(last).__name__
        out.setdefault(key or "", []).append(request)
    return out


@pytest.mark.asyncio
async def test_every_turn_that_overflows_the_window_is_answered_once_seeing_itself() -> None:
    turns = 40
    thread = f"overflow-{uuid.uuid4().hex[:8]}"
    provider = Recording(ScriptedProvider(turns_script(turns, 6_000)))
    async with aws_stack(provider=provider) as stack:
        for turn in range(1, turns + 1):
            await stack.send_user(thread, turn_text(turn), f"u{turn}")
            await pump_checked(stack)
        events = await stack.outputs()
        answers = [
            row.item.text
            async for row in stack.runtime.conversation.load_rows(thread)
            if isinstance(row.item, AssistantText)
        ]
        children = await stack.runtime.conversation.children(thread)
    assert [e for e in events if e["type"] == "error"] == []
    assert "DEFAULT" not in answers  # no turn was answered without seeing its question
    assert answers == [f"ANSWER-{n:02d}" for n in range(1, turns + 1)]  # each once, in order
    assert sum(c.kind == ThreadKind.COMPACTION for c in children) >= 5
    by_turn = answering_requests(provider, thread)
    for turn in range(1, turns + 1):
        [request] = by_turn[f"TURN-{turn:02d}"]  # asked once, with its question as the last item
        assert request.history[-1] == UserItem(TextContent(text=turn_text(turn)))


@pytest.mark.asyncio
async def test_a_window_smaller_than_the_fixed_part_ends_each_turn_with_an_error_and_never_compacts() -> None:
    thread = f"tiny-{uuid.uuid4().hex[:8]}"
    provider = Recording(ScriptedProvider(turns_script(2, 1_000)))  # the built-in tools alone are larger
    async with aws_stack(provider=provider) as stack:
        for turn in (1, 2):
            await stack.send_user(thread, f"TURN-{turn:02d}: hello", f"u{turn}")
            await pump_checked(stack)
        events = await stack.outputs()
        children = await stack.runtime.conversation.children(thread)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 2 and all(e["retrying"] is False for e in errors)  # each turn says it
    message = errors[0]["message"]
    assert "context window (1000 tokens)" in message and "smaller than the fixed part" in message
    assert "STEPAGENT_BUILTIN_TOOLS" in message and "STEPAGENT_SYSTEM_PROMPT" in message
    fixed = int(message.split("fixed part of every request (about ", 1)[1].split(" ", 1)[0])
    assert fixed > 1_000  # both sizes are named
    assert sum(e["type"] == "turn_complete" for e in events) == 2  # the turns end
    assert children == [] and provider.requests == []  # no compaction ran, the model was never called
    assert not [e for e in events if "compacting" in str(e.get("message", ""))]


@pytest.mark.asyncio
async def test_one_message_larger_than_the_window_is_refused_by_name_and_the_thread_answers_the_next() -> (
    None
):
    thread = f"huge-{uuid.uuid4().hex[:8]}"
    provider = Recording(ScriptedProvider(turns_script(3, 8_000)))
    huge = turn_text(2, 60_000)
    async with aws_stack(provider=provider) as stack:
        await stack.send_user(thread, turn_text(1, 1_000), "u1")
        await pump_checked(stack)
        await stack.send_user(thread, huge, "u2")
        await pump_checked(stack)
        refused = await stack.outputs()
        await stack.send_user(thread, turn_text(3, 1_000), "u3")
        await pump_checked(stack)
        after = await stack.outputs()
        rows = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
        children = await stack.runtime.conversation.children(thread)
    [error] = [e for e in refused if e["type"] == "error"]
    assert error["retrying"] is False
    assert f"{len(huge)} characters" in error["message"] and "window is 8000 tokens" in error["message"]
    assert [e for e in after if e["type"] == "error"] == []
    answers = [i.text for i in rows if isinstance(i, AssistantText)]
    assert answers == ["ANSWER-01", "ANSWER-03"]  # the thread stays usable; the huge turn is not answered
    shown = [i.text or "" for i in rows if isinstance(i, UserItem)]
    assert shown[1].startswith(f"[A message of {len(huge)} characters was not shown to the model")
    assert not any(r.history[-1] == UserItem(TextContent(text=huge)) for r in provider.requests)
    assert children == []  # not summarised away


def test_run_says_before_it_starts_that_the_window_cannot_hold_the_fixed_part(tmp_path: Path) -> None:
    script = tmp_path / "tiny.json"
    script.write_text(json.dumps(turns_script(1, 1_000)))
    done = stepagent("run", "--say", "hello", env=clean_env(STEPAGENT_MODEL=f"scripted:{script}"), timeout=60)
    assert done.returncode != 0
    assert "context window (1000 tokens) is smaller than the fixed part" in done.stderr
    assert "STEPAGENT_BUILTIN_TOOLS" in done.stderr
    assert "starting the embedded local stack" not in done.stderr  # said before anything starts
