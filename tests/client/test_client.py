"""``stepagent.client`` against a deployment-shaped stack on moto (tests/client/deployment.py): everything
the test learns about the conversation comes through the client — never the output queue or the stores.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stepagent.client import Client, ClientError, SyncClient
from stepagent.errors import ConfigurationError
from stepagent.providers.base import ModelRequest
from tests.client.deployment import FunctionModel, Gate, Step, call, deployment, say

T = "conv-client"


def committed(items: list[dict[str, Any]]) -> list[tuple[str, str, int, str]]:
    """(thread, kind, order, text or tool name) of the committed items."""
    return [
        (i["thread_id"], i["kind"], i["order"], i.get("text") or i.get("name", ""))
        for i in items
        if "order" in i
    ]


def weather_and_color(gate: Gate) -> FunctionModel:
    def reply(text: str, request: ModelRequest) -> list[Step]:
        if text == "weather in Paris?":
            # Streams a first chunk, then waits at the gate: the live text is visible, nothing committed.
            return call("get_weather", "call-weather", "Let me check ", gate, "the weather.", city="Paris")
        if text.startswith("Sunny in"):
            return say("It is sunny in Paris.")
        if text == "pick a color":
            return call("pick_color", "call-color")
        if text.startswith("The user picked"):
            return say(f"Noted: {text.removeprefix('The user picked ').rstrip('.')}.")
        if text == "connect my account":
            return call("connect_account", "call-oauth")
        if text == "Account connected.":
            return say("Connected.")
        return say(f"ack: {text}")

    return FunctionModel(reply)


async def test_send_live_text_a_tool_call_and_a_choice_all_through_the_client() -> None:
    gate = Gate()
    async with deployment(weather_and_color(gate)) as d, Client(d.settings, poll_interval=0.05) as client:
        # Turn 1: the model streams, pauses, then calls a function tool (run by the tool runner).
        await client.send(T, "weather in Paris?")
        seen: list[dict[str, Any]] = []
        partial_before_commit = None
        async for item in client.replies(T, partial=True, timeout=60):
            seen.append(item)
            if item["kind"] == "partial" and item["text"] == "Let me check " and not gate._open.is_set():
                # The model is paused mid-stream: the text is live, and nothing of the turn is committed
                # (the user's message is committed with the turn: this thread has no row yet).
                partial_before_commit = item
                assert committed(seen) == []
                assert await client.history(T) == []
                gate.open()
        assert partial_before_commit is not None, "the partial text was never seen before the commit"
        assert partial_before_commit["after"] == 0 and partial_before_commit["phase"] == "writing"
        assert committed(seen) == [
            (T, "user", 1, "weather in Paris?"),
            (T, "assistant", 2, "Let me check the weather."),
            (T, "tool_call", 3, "get_weather"),
            (T, "tool_result", 4, "Sunny in Paris"),
            (T, "assistant", 5, "It is sunny in Paris."),
        ]
        # The partial text ended (phase None) and was never reported as a committed item.
        assert [i["phase"] for i in seen if i["kind"] == "partial"][-1] is None
        assert all(i["kind"] != "partial" for i in await client.history(T))
        assert await client.idle(T)

        # Turn 2: a RAP tool asks the user; the answer goes through the client.
        await client.send(T, "pick a color")
        second: list[dict[str, Any]] = []
        async for item in client.replies(T, timeout=60):
            second.append(item)
            if item["kind"] == "choice":
                assert item["prompt"] == "Which color?" and item["choices"] == ["red", "green", "blue"]
                assert not await client.idle(T)  # waiting for the answer is not idle
                assert await client.answer_choice(T, item["choice_id"], "blue") == 2
        assert [i["kind"] for i in second if "order" not in i] == ["choice"]
        assert committed(second)[-2:] == [
            (T, "tool_result", 8, "The user picked blue."),
            (T, "assistant", 9, "Noted: blue."),
        ]

        # Turn 3: an OAuth link is an item too (the tool then answers as if the user had authorised).
        await client.send(T, "connect my account")
        third = [item async for item in client.replies(T, timeout=60)]
        assert [i for i in third if i["kind"] == "oauth"] == [
            {
                "thread_id": T,
                "kind": "oauth",
                "tool_call_id": "call-oauth",
                "auth_url": "https://example.com/oauth/authorize?demo=1",
            }
        ]
        assert committed(third)[-1] == (T, "assistant", 13, "Connected.")

        # Turn 4: wait() for one message, then read the transcript.
        message_id = await client.send(T, "thanks")
        await client.wait(T, message_id, timeout=60)
        history = await client.history(T)
        assert [i["order"] for i in history] == list(range(1, 16))
        assert history[-1] == {"thread_id": T, "order": 15, "kind": "assistant", "text": "ack: thanks"}

        # The live text cost: at least one write of the partial turn and one clear, all UpdateItems.
        assert set(d.live_metrics.calls) == {"UpdateItem"}
        assert d.live_metrics.calls["UpdateItem"] >= 2


async def test_replies_wait_for_a_child_s_report_and_close_notice() -> None:
    """The tree is idle only once the parent has processed what its closed child sent it (the inbox)."""

    def reply(text: str, request: ModelRequest) -> list[Step]:
        thread = request.thread_stack[-1]
        if thread == T:
            if text == "delegate":
                return call("spawn_thread", "call-spawn", instructions="report", child_of=[T])
            if text.startswith("Child thread is successfully spawned"):
                return say("Spawned.")
            if "Report from child thread: halfway" in text:
                return say("Got the report.")
            if "has shut down" in text:
                return say("Child finished.")
            return say("?")
        if text.startswith("You are now INSIDE"):
            return call("report_to_parent", "call-report", report="halfway")
        return call("close_thread", "call-close", thread_id=thread, report_to_parent="done")

    async with deployment(FunctionModel(reply)) as d, Client(d.settings, poll_interval=0.02) as client:
        await client.send(T, "delegate")
        items = [item async for item in client.replies(T, timeout=60)]
        root_texts = [i["text"] for i in items if i["thread_id"] == T and i["kind"] == "assistant"]
        assert root_texts[-1] == "Child finished.", root_texts
        assert {"Spawned.", "Got the report."} <= set(root_texts)
        children = {i["thread_id"] for i in items} - {T}
        assert len(children) == 1
        assert await client.idle(T)


async def test_live_text_off_writes_nothing_and_replies_still_end() -> None:
    async with (
        deployment(FunctionModel(lambda text, _: say("one ", "two")), live_text=False) as d,
        Client(d.settings, poll_interval=0.05) as client,
    ):
        await client.send(T, "hi")
        items = [item async for item in client.replies(T, partial=True, timeout=60)]
        assert [i["kind"] for i in items] == ["user", "assistant"]
        assert d.live_metrics.calls == {}


async def test_the_sync_client_from_code_without_an_event_loop() -> None:
    async with deployment(FunctionModel(lambda text, _: say(f"echo {text}"))) as d:

        def conversation() -> list[dict[str, Any]]:
            with SyncClient(d.settings, poll_interval=0.05) as client:
                client.send(T, "hello")
                replies = list(client.replies(T, timeout=60))
                assert client.idle(T)
                with pytest.raises(ClientError, match="no pending choice"):
                    client.answer_choice(T)
                return replies

        replies = await asyncio.to_thread(conversation)
        assert committed(replies) == [(T, "user", 1, "hello"), (T, "assistant", 2, "echo hello")]


async def test_a_client_from_the_environment_and_clear_errors() -> None:
    async with (
        deployment(FunctionModel(lambda text, _: say("ok"))) as d,
        Client(environ=d.env(), poll_interval=0.05) as client,
    ):
        await client.send(T, "hi")
        await client.wait(T, await client.send(T, "again"), timeout=60)
        assert [i["text"] for i in await client.history(T)][-1] == "ok"
    with pytest.raises(ConfigurationError, match=r"^missing required settings STEPAGENT_CONVERSATION_TABLE"):
        async with Client(environ={}):
            pass
    with pytest.raises(ClientError, match="not open"):
        await Client(environ={}).send(T, "x")
