"""A server's question during a call (elicitation) is a durable wait: the thread reports
``input_required``, waits with its call open, and the person's ``elicitation`` answer continues the call
so the model sees the tool's real result — for a 2026-07-28 server by re-sending the call with the answer
(nothing held open meanwhile) and for an older one by the held session reading the answer. Real loopback
servers of each era (the SDK), the engine in step mode with the in-process function runner."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stepagent.events import InputRejected, InputRequiredEvent
from stepagent.history_items import ToolResultItem
from stepagent.messages import InputMessage
from stepagent.providers.base import ModelRequest, StreamEvent
from stepagent.rap.server import serve_in_background
from stepagent.tools.functions import InProcessFunctionRunner
from stepagent.tools.mcp import load_mcp_tools
from stepagent.tools.mcp_config import McpServer
from tests.engine.harness import Harness
from tests.mcp.fixtures.eras import Recorder, build, recording
from tests.rap.stack import FunctionModel, call, last_input, say

ANSWERS = {
    "accept": ("accept", {"reason": "it is old"}, "deleted a.txt because it is old"),
    "decline": ("decline", None, "kept a.txt: the user declined"),
    "cancel": ("cancel", None, "kept a.txt: the user cancelled"),
}


def model(request: ModelRequest) -> list[StreamEvent]:
    text = last_input(request.history)
    if text == "delete a.txt":
        return call("web__confirm_delete", "call-del", path="a.txt")
    return say(f"model saw: {text}")


async def _harness(base: str) -> Harness:
    tools = await load_mcp_tools([McpServer(name="web", url=f"{base}/mcp")])
    h = Harness(FunctionModel(model), tools)
    h.config.runner = InProcessFunctionRunner(tools)
    return h


def _asked(h: Harness) -> list[InputRequiredEvent]:
    return [e for _, e in h.observer.events if isinstance(e, InputRequiredEvent)]


@pytest.mark.parametrize("action", sorted(ANSWERS))
async def test_a_2026_server_question_waits_durably_and_the_answer_resumes_the_call(action: str) -> None:
    seen = Recorder()
    async with serve_in_background(recording(build().streamable_http_app(), seen)) as base:
        h = await _harness(base)
        await h.say("t", "delete a.txt", "m1")
        [asked] = _asked(h)
        assert asked.tool_call_id == "call-del" and asked.message == "Why should I delete it?"
        assert asked.requested_schema is not None and "reason" in asked.requested_schema["properties"]
        history = await h.history("t")
        assert not any(isinstance(i, ToolResultItem) for i in history)  # the call is still open
        assert seen.rpc("tools/call") == 1  # and nothing is held open on the server: the request ended

        verb, content, expected = ANSWERS[action]
        await h.send(InputMessage.elicitation("t", "call-del", verb, content), "answer-1")
        await h.run()
        history = await h.history("t")
        results = [i.result.first_text() for i in history if isinstance(i, ToolResultItem)]
        assert results == [expected]  # the real result, from a fresh request carrying the answer
        assert seen.rpc("tools/call") == 2 and seen.rpc("initialize") == 0
        assert history[-1].text == f"model saw: {expected}"  # type: ignore[union-attr]

        # answering again (another message) is refused: the call is no longer waiting
        await h.send(InputMessage.elicitation("t", "call-del", "accept", {"reason": "x"}), "answer-2")
        await h.run()
        refused = [e for _, e in h.observer.events if isinstance(e, InputRejected)]
        assert refused and "no tool call call-del waiting for an answer" in refused[-1].reason
        assert seen.rpc("tools/call") == 2


async def test_an_answer_for_a_call_that_never_asked_is_refused() -> None:
    async with serve_in_background(build().streamable_http_app()) as base:
        h = await _harness(base)
        await h.send(InputMessage.elicitation("t", "nope", "decline"), "answer-1")
        await h.run()
        refused = [e for _, e in h.observer.events if isinstance(e, InputRejected)]
        assert [r.reason for r in refused] == [
            "answer refused: there is no tool call nope waiting for an answer in this thread"
        ]


@pytest.mark.parametrize("action", sorted(ANSWERS))
async def test_an_older_server_question_is_answered_while_the_runner_holds_the_call(action: str) -> None:
    seen = Recorder()
    app = recording(build().streamable_http_app(), seen, legacy=True)
    async with serve_in_background(app) as base:
        h = await _harness(base)
        runner = InProcessFunctionRunner(h.config.runner.tools, background=True)  # type: ignore[union-attr]
        h.config.runner = runner
        verb, content, expected = ANSWERS[action]

        async def answer_when_asked() -> None:
            while not _asked(h):
                await h.run()
                await asyncio.sleep(0.05)
            await h.send(InputMessage.elicitation("t", "call-del", verb, content), "answer-1")
            await h.run()

        await h.send(InputMessage.user_text("t", "delete a.txt"), "m1")
        await asyncio.wait_for(answer_when_asked(), 30)
        await runner.join()
        await h.run()
        history = await h.history("t")
        results = [i.result.first_text() for i in history if isinstance(i, ToolResultItem)]
        assert results == [expected]
        assert seen.rpc("tools/call") == 1  # one call, held open: the answer went back in the session


async def test_an_older_server_question_nobody_answers_is_declined_after_the_wait() -> None:
    app = recording(build().streamable_http_app(), Recorder(), legacy=True)
    async with serve_in_background(app) as base:
        h = await _harness(base)
        runner: Any = h.config.runner
        runner.input_wait = 0.0
        await h.say("t", "delete a.txt", "m1")
        history = await h.history("t")
        results = [i.result.first_text() for i in history if isinstance(i, ToolResultItem)]
        assert results == ["kept a.txt: the user declined"]
        assert len(_asked(h)) == 1
