"""Approval of tool calls through :mod:`stepagent.client` against a deployment-shaped stack on moto (the real
worker, tool runner, RAP receiver and demo RAP server): ``STEPAGENT_APPROVAL`` makes the RAP tool
``get_time`` wait for a person, in the root and in a child thread; an edit, a respond, a decision for a call
already decided, the ``approval_required`` output event and the ``history`` marks — all as a user of the
client sees them (the other decisions and bad inputs: ``tests/engine/test_approval.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from typing import Any

import httpx
import pytest

from stepagent.cli import main
from stepagent.client import Client
from stepagent.client.terminal import chat
from stepagent.console.app import ConsoleState, build_app
from stepagent.console.dead_letters import DeadLetters
from stepagent.providers.base import ModelRequest
from tests.client.deployment import Deployment, FunctionModel, Step, call, deployment, say
from tests.conftest import aws_client

T = "conv-approval"


def model() -> FunctionModel:
    def reply(text: str, request: ModelRequest) -> list[Step]:
        thread = request.thread_stack[-1]
        if thread != T:  # the child
            if text.startswith("You are now INSIDE"):
                return call("get_time", "call-child-time", timezone="UTC")
            return call("close_thread", "call-close", thread_id=thread, report_to_parent=f"child: {text}")
        if text == "what time is it?":
            return call("get_time", "call-time", timezone="UTC")
        if "Europe/Paris" in text:
            return say("Got the Paris time.")
        if text == "delegate":
            return call("spawn_thread", "call-spawn", instructions="ask the time", child_of=[T])
        if text.startswith("Child thread is successfully spawned"):
            return say("Spawned.")
        if "has shut down" in text:
            return say("Child finished.")
        return say("?")

    return FunctionModel(reply)


async def replies(client: Client) -> list[dict[str, Any]]:
    return [item async for item in client.replies(T, timeout=60)]


def kinds(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [i for i in items if i["kind"] == kind]


async def output_events(d: Deployment) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with aws_client("sqs") as sqs:
        while True:
            got = await sqs.receive_message(
                QueueUrl=str(d.settings.output_queue_url), MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            if not got.get("Messages"):
                return events
            for message in got["Messages"]:
                events.append(json.loads(message["Body"]))
                await sqs.delete_message(
                    QueueUrl=str(d.settings.output_queue_url), ReceiptHandle=message["ReceiptHandle"]
                )


async def test_approvals_through_the_client_the_terminal_and_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {"STEPAGENT_APPROVAL": "get_time"}
    async with (
        deployment(model(), agent_settings=settings) as d,
        Client(d.settings, poll_interval=0.03) as client,
    ):
        # The call waits: the replies end (nothing runs), the call is marked pending, no tool result.
        await client.send(T, "what time is it?")
        first = await replies(client)
        [waiting] = kinds(first, "tool_call")
        assert waiting["approval"] == "pending" and waiting["args"] == {"timezone": "UTC"}
        assert kinds(first, "tool_result") == []
        assert await client.pending_approvals(T) == [
            {
                "thread_id": T,
                "kind": "tool_call",
                "tool_call_id": "call-time",
                "name": "get_time",
                "args": {"timezone": "UTC"},
                "approval": "pending",
            }
        ]
        [asked] = [e for e in await output_events(d) if e["type"] == "approval_required"]
        assert (asked["thread_id"], asked["name"], asked["tool_call_id"]) == (T, "get_time", "call-time")
        assert not any(e["type"] == "turn_complete" for e in await output_events(d))

        # edit: the RAP tool runs with the person's arguments; the model continues.
        await client.approve(T, "call-time", "edit", args={"timezone": "Europe/Paris"})
        second = await replies(client)
        [decided] = kinds(second, "approval")
        assert decided["approval"] == "edited" and decided["args"] == {"timezone": "Europe/Paris"}
        [result] = kinds(second, "tool_result")
        assert "Europe/Paris" in result["text"]
        assert kinds(second, "assistant")[-1]["text"] == "Got the Paris time."

        # A second decision for the decided call: an error reply, nothing changes.
        before = await client.history(T)
        await client.approve(T, "call-time", "approve")
        third = await replies(client)
        [error] = kinds(third, "error")
        assert "already decided" in error["text"] and error["retrying"] is False
        # Nothing changes in the conversation; the refusal is kept with it, naming the call.
        after = await client.history(T)
        assert [i for i in after if i["kind"] != "error"] == before
        [kept] = [i for i in after if i["kind"] == "error"]
        assert kept["tool_call_id"] == "call-time" and kept["text"] == error["text"]

        # In a child: the child's call waits; the decision, addressed to the conversation, goes to the
        # child's group; the child answers its parent.
        await client.send(T, "delegate")
        spawned = await replies(client)
        [child_call] = [i for i in kinds(spawned, "tool_call") if i.get("approval") == "pending"]
        child = child_call["thread_id"]
        assert child != T
        [child_asked] = [
            e
            for e in await output_events(d)
            if e["type"] == "approval_required" and e["tool_call_id"] == "call-child-time"
        ]
        assert child_asked["thread_id"] == child and child_asked["root_thread_id"] == T
        await client.approve(T, "call-child-time", "respond", message="It is noon.")
        finished = await replies(client)
        assert [i["text"] for i in kinds(finished, "assistant") if i["thread_id"] == T][
            -1
        ] == "Child finished."

        marks = {
            i["tool_call_id"]: (i["thread_id"], i["approval"], i["args"])
            for i in await client.history(T)
            if "approval" in i
        }
        assert marks == {
            "call-time": (T, "edited", {"timezone": "Europe/Paris"}),
            "call-child-time": (child, "responded", {"timezone": "UTC"}),
        }
        assert await client.pending_approvals(T) == []

        # The terminal chat (what `stepagent run` and `chat` show) asks inline; with --say the answer is
        # read from standard input.
        out = io.StringIO()
        stdin = io.StringIO('e {"timezone": "Europe/Paris"}\n')
        status = await chat(client, T, say=["what time is it?"], timeout=60, out=out, stdin=stdin)
        shown = out.getvalue()
        assert status == 0, shown
        assert '⏸ get_time({"timezone":"UTC"})  approve? [y]es [n]o [e]dit [r]espond' in shown
        assert "✎ edited" in shown and "agent > Got the Paris time." in shown

        # `stepagent approve` and `stepagent history --json`, as a user runs them.
        await client.send(T, "what time is it?")
        [cli_call] = [i for i in kinds(await replies(client), "tool_call") if i.get("approval") == "pending"]
        for key, value in d.env().items():
            monkeypatch.setenv(key, value)
        code, printed = await run_cli(["approve", T, cli_call["tool_call_id"], "--reject", "too late"])
        assert code == 0 and f"sent reject for get_time ({cli_call['tool_call_id']})" in printed
        declined = await replies(client)
        assert kinds(declined, "approval")[0]["approval"] == "rejected"
        code, printed = await run_cli(["history", T, "--json"])
        listed = {i["tool_call_id"]: i["approval"] for i in json.loads(printed) if "approval" in i}
        assert listed[cli_call["tool_call_id"]] == "rejected" and listed["call-time"] == "edited"
        assert not any(i["kind"] == "approval" for i in json.loads(printed))  # decisions are not items

        # The console shows a form on the waiting call; its POST decides it.
        await client.send(T, "what time is it?")
        [web_call] = [i for i in kinds(await replies(client), "tool_call") if i.get("approval") == "pending"]
        async with aws_client("sqs") as sqs:
            state = ConsoleState(client, DeadLetters(sqs, d.settings))
            transport = httpx.ASGITransport(app=build_app(state))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                page = (await http.get(f"/c/{T}")).text
                assert 'class="approval"' in page and "waits for your approval" in page
                assert "waiting for approval" in page  # the status badge
                posted = await http.post(
                    f"/c/{T}/approval",
                    data={
                        "csrf": state.csrf,
                        "thread": T,
                        "tool_call_id": web_call["tool_call_id"],
                        "decision": "edit",
                        "args": '{"timezone": "Europe/Paris"}',
                    },
                    headers={"X-Requested-With": "fetch"},
                )
                assert posted.status_code == 200 and posted.json()["ok"], posted.text
                by_web = await replies(client)
                assert kinds(by_web, "assistant")[-1]["text"] == "Got the Paris time."
                refused = await http.post(
                    f"/c/{T}/approval",
                    data={"csrf": state.csrf, "tool_call_id": web_call["tool_call_id"], "decision": "maybe"},
                    headers={"X-Requested-With": "fetch"},
                )
                assert refused.status_code == 400 and "invalid approval" in refused.json()["error"]


async def run_cli(argv: list[str]) -> tuple[int, str]:
    """``stepagent ARGV`` in this process (its own event loop, in a thread), with its standard output."""
    buffer = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(buffer):
            return main(argv)

    code = await asyncio.to_thread(run)
    return code, buffer.getvalue()
