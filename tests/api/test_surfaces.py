"""One set of facts on every surface: what the HTTP API streams is what the output queue carries (the typed
answer, the bill, the cache tokens), a refused decision reaches every surface with its call, and a stream
asked for one message's turn shows exactly that turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx

from stepagent.api.auth import ApiAuthSettings
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.outputs.build import event_id
from stepagent.providers.factory import make_provider
from tests.api.helpers import ApiStack, api_stack, new_thread
from tests.api.test_events import output_events, read_stream, settle
from tests.client.deployment import deployment
from tests.console.helpers import scripted_model
from tests.integration.aws_helpers import script_file

NONE = ApiAuthSettings(mode="none")
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
    "required": ["city", "temp_c"],
}
SCRIPT = {
    "rules": [
        # The first answer fails the schema; the model's second answer (after the feedback) fits it.
        {"when": "did not match|schema", "reply": [{"output": {"city": "Paris", "temp_c": 14}}]},
        {"when": "weather", "reply": [{"text": "It is nice."}]},
    ],
    "default": [{"text": "Hello."}],
}


@asynccontextmanager
async def priced_stack(script: dict[str, Any], **settings: str) -> AsyncIterator[ApiStack]:
    """A deployment running ``script`` with a price for its model and ``settings``, and the API over it."""
    model = make_provider(f"scripted:{script_file(script)}")
    prices = {model.info.name: {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}}
    async with AsyncExitStack() as stack:
        d = await stack.enter_async_context(
            deployment(model, agent_settings=settings, prices=json.dumps(prices))
        )
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, NONE, port=0))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield ApiStack(d, client, url, http)


async def test_the_api_stream_carries_turn_complete_as_the_output_queue_does_and_wait_returns_the_output() -> (
    None
):
    async with priced_stack(SCRIPT, STEPAGENT_OUTPUT_SCHEMA=json.dumps(WEATHER)) as api:
        thread = new_thread("weather")
        async with Client(api_url=api.url, token=None) as remote:
            message_id = await remote.send(thread, "what is the weather?")
            assert await remote.wait(thread, message_id, timeout=60) == {"city": "Paris", "temp_c": 14}
        streamed, ended = await read_stream(api.http, f"/v1/threads/{thread}/events")
        assert ended
        queued = await queued_until(api, thread, lambda got: any(e["type"] == "turn_complete" for e in got))
        [turn] = [e.data for e in streamed if e.event == "turn_complete"]
        [published] = [e for e in queued if e["type"] == "turn_complete"]
        assert turn == published
        assert turn["output"] == {"city": "Paris", "temp_c": 14}
        assert set(turn["usage"]) == {
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "cost_usd",
        }
        assert turn["usage"]["cost_usd"] > 0
        # Every committed event the queue carried is streamed with the same keys and values.
        committed = [e.data for e in streamed if e.event != "text_delta"]
        assert committed == [e for e in queued if e["type"] in {x["type"] for x in committed}]


async def test_a_stream_for_a_message_shows_exactly_the_turn_it_began_even_opened_before_the_worker_took_it() -> (
    None
):
    async with api_stack(scripted_model(), NONE) as api:
        thread = new_thread("demo")
        first = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "plan the day"})
        assert first.status_code == 202
        await asyncio.wait_for(settle(api, thread), 60)  # a turn with a tool and a child, all done
        # The store is settled; the queue gets each step's events just after its commit: drain it up to the
        # root's last turn_complete, so none of this turn's events is left to be counted in the next.
        head = await api.client.conversation.get_thread(thread)
        assert head is not None
        last = event_id(thread, f"v{head.version}", "turn_complete")
        before = await queued_until(api, thread, lambda got: any(e["event_id"] == last for e in got))
        assert len({e["thread_id"] for e in before}) == 2
        second = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "hello"})
        message_id = second.json()["message_id"]
        streamed, ended = await asyncio.wait_for(
            read_stream(api.http, f"/v1/threads/{thread}/events?message_id={message_id}"), 60
        )
        assert ended
        events = [e.data for e in streamed if e.event != "text_delta"]
        assert [(e["thread_id"], e["type"], e.get("text")) for e in events] == [
            (thread, "text", "Hello back, friend."),
            (thread, "turn_complete", None),
        ]
        # The same events, with the same values, as the output queue carried for that turn.
        queued = await queued_until(api, thread, lambda got: any(e["type"] == "turn_complete" for e in got))
        assert events == [e for e in queued if e["thread_id"] == thread]
        # A client waiting for its message over the API follows that turn only.
        async with Client(api_url=api.url, token=None) as remote:
            third = await remote.send(thread, "hello")
            assert await remote.wait(thread, third, timeout=60) is None


async def queued_until(api: Any, thread: str, done: Any) -> list[dict[str, Any]]:
    """The output queue's events of ``thread``'s tree, read (and removed) until ``done(events)`` holds."""
    got: list[dict[str, Any]] = []
    for _ in range(1200):
        got += [e for e in await output_events(api) if e["root_thread_id"] == thread]
        if done(got):
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"the output queue never had what was waited for: {got}")


def published_all(streamed: list[dict[str, Any]]) -> Any:
    """Whether the queue has carried every event of ``streamed`` (a step publishes just after its commit,
    which the stream may already have read)."""
    wanted = {e["event_id"] for e in streamed}
    return lambda got: wanted <= {e["event_id"] for e in got}


ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
CONVERSATION = {
    "rules": [
        {
            "when": "^what time",
            "on": ["user"],
            "reply": [
                {"text": "Let me check."},
                {"tool_call": {"name": "get_time", "arguments": {"timezone": "UTC"}}},
            ],
        },
        {
            "when": "Europe/Paris",
            "on": ["tool_result"],
            "reply": [
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "count to three", "child_of": "{thread_stack}"},
                    }
                }
            ],
        },
        {"when": "successfully spawned", "reply": [{"output": {"answer": "spawned"}}]},
        {
            "when": "You are now INSIDE",
            "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "one two three"}}}],
        },
        {
            "when": "Report sent to parent",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {"thread_id": "{thread_id}", "report_to_parent": "counted"},
                    }
                }
            ],
        },
        {"when": "has shut down", "reply": [{"output": {"answer": "child done"}}]},
        {"when": "Report from child thread", "reply": [{"output": {"answer": "one two three"}}]},
    ],
    "default": [{"output": {"answer": "?"}}],
}


async def test_one_conversation_tells_the_same_facts_on_the_queue_the_stream_and_the_history() -> None:
    settings = {"STEPAGENT_OUTPUT_SCHEMA": json.dumps(ANSWER), "STEPAGENT_APPROVAL": "get_time"}
    async with priced_stack(CONVERSATION, **settings) as api:
        thread = new_thread("parity")
        events_path = f"/v1/threads/{thread}/events"
        fresh: list[Any] = []
        done = asyncio.Event()

        async def follow() -> None:
            # A stream opened before the conversation starts, read while it happens.
            def over(sse: Any) -> bool:
                if sse.data is not None:
                    fresh.append(sse)
                return done.is_set() and sse.comment is not None

            await read_stream(api.http, f"{events_path}?follow=1", until=over)

        sent = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "what time is it?"})
        assert sent.status_code == 202
        following = asyncio.create_task(follow())  # from the start, then live
        asked, _ = await asyncio.wait_for(
            read_stream(api.http, f"{events_path}?follow=1", until=lambda e: e.event == "approval_required"),
            60,
        )
        call_id = asked[-1].data["tool_call_id"]

        async def decide(body: dict[str, Any]) -> None:
            response = await api.http.post(f"/v1/threads/{thread}/approvals", json=body)
            assert response.status_code == 202, response.text

        await decide({"tool_call_id": "call-nope", "decision": "approve"})  # not waiting: refused
        await decide(
            {"tool_call_id": call_id, "decision": "edit", "args": {"timezone": 5}}
        )  # invalid: refused
        await decide({"tool_call_id": call_id, "decision": "edit", "args": {"timezone": "Europe/Paris"}})
        for _ in range(600):
            replay, ended = await read_stream(api.http, events_path)
            outputs = [e.data.get("output") for e in replay if e.event == "turn_complete"]
            if ended and {"answer": "child done"} in outputs and {"answer": "one two three"} in outputs:
                break
            await asyncio.sleep(0.05)
        await asyncio.wait_for(settle(api, thread), 60)
        replay, ended = await read_stream(api.http, events_path)
        assert ended
        streamed = [e.data for e in replay if e.event != "text_delta"]
        done.set()
        await asyncio.wait_for(following, 60)

        # The output queue and the stream from the start: the same events, with the same values, in each
        # thread's order (threads of a tree interleave as they were observed).
        queued = await queued_until(api, thread, published_all(streamed))
        assert by_thread(streamed) == by_thread(queued)
        # The stream read while it happened, and resumed after every single event.
        assert by_thread([e.data for e in fresh if e.event != "text_delta"]) == by_thread(streamed)
        for index, event in enumerate(replay):
            rest, ended = await read_stream(api.http, events_path, after=event.id)
            assert ended and [e.data for e in rest if e.event != "text_delta"] == streamed[index + 1 :]

        # What the conversation holds: a priced model, a typed answer, both refusals with their calls, the
        # edited decision, a child.
        turns = [e for e in queued if e["type"] == "turn_complete" and e["thread_id"] == thread]
        assert all(t["usage"]["cost_usd"] > 0 and "output" in t for t in turns)
        errors = [e for e in queued if e["type"] == "error"]
        assert [e["tool_call_id"] for e in errors] == ["call-nope", call_id]
        assert all(e["retrying"] is False for e in errors)
        [decided] = [e for e in queued if e["type"] == "approval"]
        assert (decided["decision"], decided["args"]) == ("edit", {"timezone": "Europe/Paris"})
        assert len({e["thread_id"] for e in queued}) == 2

        # history --json (and GET /v1/threads/{t}): the same facts, as the model saw them.
        history = await api.client.history(thread)
        assert (await api.http.get(f"/v1/threads/{thread}")).json() == history
        assert [
            (i["thread_id"], i["text"], i.get("tool_call_id")) for i in history if i["kind"] == "error"
        ] == [(e["thread_id"], e["message"], e["tool_call_id"]) for e in errors]
        edits = {e["tool_call_id"]: e["args"] for e in queued if e["type"] == "approval" and "args" in e}
        assert [
            (i["thread_id"], i["name"], i["tool_call_id"], i["args"])
            for i in history
            if i["kind"] == "tool_call"
        ] == [
            (e["thread_id"], e["name"], e["tool_call_id"], edits.get(e["tool_call_id"], e["args"]))
            for e in queued
            if e["type"] == "tool_call"
        ]
        [call] = [i for i in history if i["kind"] == "tool_call" and i["tool_call_id"] == call_id]
        assert call["approval"] == "edited"
        for kind, item_kind in (("text", "assistant"), ("tool_result", "tool_result"), ("event", "event")):
            assert [(i["thread_id"], i["text"]) for i in history if i["kind"] == item_kind] == [
                (e["thread_id"], e["text"]) for e in queued if e["type"] == kind
            ]


def by_thread(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        out.setdefault(event["thread_id"], []).append(event)
    return out


async def test_a_limit_stop_is_kept_with_the_thread_the_stream_and_the_history_show_it() -> None:
    looping = {
        "rules": [],
        "default": [{"text": "Checking."}, {"tool_call": {"name": "get_time", "arguments": {}}}],
    }
    async with priced_stack(looping, STEPAGENT_MAX_MODEL_CALLS_PER_TURN="2") as api:
        thread = new_thread("loop")
        sent = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "loop"})
        assert sent.status_code == 202
        for _ in range(600):
            replay, ended = await read_stream(api.http, f"/v1/threads/{thread}/events")
            if ended and any(e.event == "limit_reached" for e in replay):
                break
            await asyncio.sleep(0.05)
        streamed = [e.data for e in replay if e.event != "text_delta"]
        queued = await queued_until(api, thread, published_all(streamed))
        assert streamed == queued
        assert [e["type"] for e in streamed][-2:] == ["limit_reached", "turn_complete"]
        [limit] = [e for e in streamed if e["type"] == "limit_reached"]
        assert (limit["limit"], limit["value"], limit["used"]) == ("model_calls_per_turn", 2, 2)
        history = await api.client.history(thread)
        assert history[-1]["kind"] == "limit" and "model_calls_per_turn" in history[-1]["text"]
