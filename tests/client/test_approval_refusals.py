"""A decision the runtime refuses, as a person meets it (deployment-shaped stack on moto, the real worker,
tool runner and demo RAP server): the chat shows why and asks again until a decision is accepted — the
next line is never taken for a message that would interrupt the call — and the console keeps the
person's refused edit in the arguments box."""

from __future__ import annotations

import asyncio
import io
import itertools
import os
from typing import Any

import httpx
import pytest

from stepagent.cli import main
from stepagent.client import Client
from stepagent.client.terminal import chat, tail
from stepagent.console.app import ConsoleState, build_app
from stepagent.console.dead_letters import DeadLetters
from stepagent.providers.base import ModelRequest
from tests.client.deployment import FunctionModel, Step, call, deployment, say
from tests.conftest import aws_client

T = "conv-refusals"
BAD_EDIT = '{"timezone": 5}'


def model() -> FunctionModel:
    calls = itertools.count(1)

    def reply(text: str, request: ModelRequest) -> list[Step]:
        if text == "what time is it?":
            return call("get_time", f"call-{next(calls)}", timezone="UTC")
        if "Europe/Paris" in text:
            return say("Got the Paris time.")
        if text.startswith("20") or "UTC" in text:
            return say("Got the UTC time.")
        return say(f"you said: {text}")

    return FunctionModel(reply)


class _Screen(io.StringIO):
    """The chat's output; ``asked`` is set once the approval question is on it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    def write(self, text: str) -> int:
        if "approve?" in text:
            self.asked.set()
        return super().write(text)


def kinds(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [i for i in items if i["kind"] == kind]


async def test_say_asks_again_after_a_refused_edit_and_runs_the_call_when_approved() -> None:
    async with (
        deployment(model(), agent_settings={"STEPAGENT_APPROVAL": "get_time"}) as d,
        Client(d.settings, poll_interval=0.03) as client,
    ):
        out = io.StringIO()
        stdin = io.StringIO(f"e {BAD_EDIT}\ny\n")
        status = await chat(client, T, say=["what time is it?"], timeout=60, out=out, stdin=stdin)
        shown = out.getvalue()
        assert status == 0, shown
        question = 'get_time({"timezone":"UTC"})  approve? [y]es [n]o [e]dit [r]espond'
        assert shown.count(question) == 2, shown  # asked, refused, asked again
        refused = shown.index("approval refused: the edited arguments for get_time")
        assert shown.index(question) < refused < shown.rindex(question) < shown.index("you > y")
        assert "✔ approved" in shown and "agent > Got the UTC time." in shown
        assert "interrupted" not in shown.lower()


async def test_the_interactive_chat_never_takes_the_next_answer_for_a_message() -> None:
    """Both answers arrive at once, as soon as the question is shown (the fastest typist): the refusal
    comes after the second line was read, yet that line still answers the question."""
    async with deployment(model(), agent_settings={"STEPAGENT_APPROVAL": "get_time"}) as d:
        async with Client(d.settings, poll_interval=0.03) as client:
            await client.send(T, "what time is it?")
            async for _ in client.replies(T, timeout=60):
                pass
        out = _Screen()
        read_end, write_end = os.pipe()

        async def type_when_asked() -> None:
            await out.asked.wait()
            os.write(write_end, f'e {BAD_EDIT}\ne {{"timezone": "Europe/Paris"}}\n'.encode())
            os.close(write_end)

        async with Client(d.settings, poll_interval=0.03) as client:  # a new `stepagent chat T`
            typist = asyncio.create_task(type_when_asked())
            with os.fdopen(read_end, encoding="utf-8") as stdin:
                status = await asyncio.wait_for(chat(client, T, out=out, stdin=stdin, interactive=False), 120)
            await typist
            shown = out.getvalue()
            assert status == 0, shown
            assert "approval refused" in shown
            history = await client.history(T)
        assert [i["text"] for i in kinds(history, "user")] == ["what time is it?"], shown  # no stray message
        [decided] = [i for i in kinds(history, "tool_call") if "approval" in i]
        assert decided["approval"] == "edited" and decided["args"] == {"timezone": "Europe/Paris"}
        assert kinds(history, "assistant")[-1]["text"] == "Got the Paris time."


async def test_the_console_keeps_a_refused_edit_in_the_arguments_box() -> None:
    async with (
        deployment(model(), agent_settings={"STEPAGENT_APPROVAL": "get_time"}) as d,
        Client(d.settings, poll_interval=0.03) as client,
        aws_client("sqs") as sqs,
    ):
        await client.send(T, "what time is it?")
        [waiting] = [i async for i in client.replies(T, timeout=60) if i.get("approval") == "pending"]
        state = ConsoleState(client, DeadLetters(sqs, d.settings))
        transport = httpx.ASGITransport(app=build_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            edit = '{"timezone": "Mars/Olympus"}'
            posted = await http.post(
                f"/c/{T}/approval",
                data={
                    "csrf": state.csrf,
                    "thread": T,
                    "tool_call_id": waiting["tool_call_id"],
                    "decision": "edit",
                    "args": '{"timezone": 5}',
                },
                headers={"X-Requested-With": "fetch"},
            )
            assert posted.status_code == 200, posted.text
            [error] = [i async for i in client.replies(T, timeout=60) if i["kind"] == "error"]
            assert "approval refused" in error["text"]
            fragment = (await http.get(f"/c/{T}/fragment")).text
            assert "waits for your approval" in fragment  # still waiting
            assert "{&#34;timezone&#34;: 5}" in fragment or '{"timezone": 5}' in fragment, fragment
            # A non-JSON edit is refused by the console itself; it is kept too.
            bad = await http.post(
                f"/c/{T}/approval",
                data={
                    "csrf": state.csrf,
                    "thread": T,
                    "tool_call_id": waiting["tool_call_id"],
                    "decision": "edit",
                    "args": edit[:-1],
                },
                headers={"X-Requested-With": "fetch"},
            )
            assert bad.status_code == 400
            fragment = (await http.get(f"/c/{T}/fragment")).text
            assert "Mars/Olympus" in fragment


async def test_stepagent_approve_exits_non_zero_when_its_decision_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        deployment(model(), agent_settings={"STEPAGENT_APPROVAL": "get_time"}) as d,
        Client(d.settings, poll_interval=0.03) as client,
    ):
        await client.send(T, "what time is it?")
        [waiting] = [i async for i in client.replies(T, timeout=60) if i.get("approval") == "pending"]
        for key, value in d.env().items():
            monkeypatch.setenv(key, value)
        call_id = waiting["tool_call_id"]
        refused = await asyncio.to_thread(
            main, ["approve", T, call_id, "--edit", BAD_EDIT, "--timeout", "60"]
        )
        err = capsys.readouterr().err
        assert refused == 1 and "the decision was refused" in err and "get_time" in err
        assert await client.pending_approvals(T) != []  # nothing changed: it still waits
        approved = await asyncio.to_thread(main, ["approve", T, call_id, "--timeout", "60"])
        assert approved == 0, capsys.readouterr().err
        assert await client.pending_approvals(T) == []


async def test_tail_with_history_shows_a_waiting_call_once() -> None:
    async with deployment(model(), agent_settings={"STEPAGENT_APPROVAL": "get_time"}) as d:
        async with Client(d.settings, poll_interval=0.03) as client:
            await client.send(T, "what time is it?")
            async for _ in client.replies(T, timeout=60):
                pass
        out = io.StringIO()
        async with Client(d.settings, poll_interval=0.03) as client:  # a new `stepagent tail --history`
            status = await tail(client, T, history=True, until_idle=True, timeout=60, out=out)
        shown = out.getvalue()
        assert status == 0, shown
        assert shown.count("agent ⚙ get_time(") == 1, shown
        assert shown.count("get_time waits for a person: stepagent approve") == 1, shown
