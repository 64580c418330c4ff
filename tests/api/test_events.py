"""The event stream over real HTTP (a loopback server on a deployment-shaped stack): committed events in
order with the output queue's ids, live ``text_delta``, resuming after a cut at random points with nothing
lost or repeated, heartbeats, and the end after the root's ``turn_complete``."""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from typing import Any

import httpx

from stepagent.api.auth import ApiAuthSettings
from tests.api.helpers import Sse, SseParser, api_stack, new_thread
from tests.client.deployment import FunctionModel, Gate, say
from tests.console.helpers import scripted_model

NONE = ApiAuthSettings(mode="none")


async def read_stream(
    http: httpx.AsyncClient,
    path: str,
    *,
    after: str | None = None,
    cut_after_bytes: int | None = None,
    until: Any = None,
) -> tuple[list[Sse], bool]:
    """Events of one connection: until the server ends it, ``until(event)`` holds, or ``cut_after_bytes``
    bytes arrived (then the connection is dropped, possibly mid-event). Returns (events, ended)."""
    headers = {"Last-Event-ID": after} if after else {}
    parser = SseParser()
    received = 0
    async with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for chunk in response.aiter_text():
            for sse in parser.feed(chunk):
                if until is not None and until(sse):
                    return [e for e in parser.events if e.data is not None], False
            received += len(chunk)
            if cut_after_bytes is not None and received >= cut_after_bytes:
                return [e for e in parser.events if e.data is not None], False
    return [e for e in parser.events if e.data is not None], True


def committed(events: list[Sse]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.event != "text_delta"]


def per_thread(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for event in events:
        out[event["thread_id"]].append(event["event_id"])
    return dict(out)


async def test_a_turn_with_a_tool_and_a_child_cut_at_random_points_resumes_with_nothing_lost_or_repeated() -> (
    None
):
    async with api_stack(scripted_model(), NONE, heartbeat_s=0.05) as api:
        thread = new_thread("plan")
        path = f"/v1/threads/{thread}/events?follow=1"
        sent = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "plan the day"})
        assert sent.status_code == 202
        # Followed streams, read while the turn runs; each stops once it holds every event of the turn
        # (known only when the tree has settled: `target`), checked on each event or heartbeat.
        target: set[str] = set()

        def complete(events: list[Sse]) -> bool:
            ids = {e.data["event_id"] for e in events if e.data is not None and e.event != "text_delta"}
            return bool(target) and target <= ids

        async def uncut() -> list[Sse]:
            events, _ = await read_stream(api.http, path, until=lambda _: complete(parser_events(_)))
            return events

        uncut_seen: list[Sse] = []

        def parser_events(sse: Sse) -> list[Sse]:
            if sse.data is not None:
                uncut_seen.append(sse)
            return uncut_seen

        async def cut() -> tuple[list[Sse], int]:
            rng = random.Random(28)
            union: list[Sse] = []
            token: str | None = None
            cuts = 0
            while not complete(union):
                events, _ = await read_stream(
                    api.http,
                    path,
                    after=token,
                    cut_after_bytes=rng.randint(1, 700),
                    until=lambda sse: complete([*union, sse]),
                )
                union.extend(events)
                if events:
                    token = events[-1].id
                cuts += 1
                assert cuts < 300, "the cut stream never caught up"
            return union, cuts

        uncut_task = asyncio.create_task(uncut())
        cut_task = asyncio.create_task(cut())
        # The canonical record: a stream of the finished tree from the start (it ends by itself). The turn
        # is over when the root has answered both the child's report and its shutdown.
        for _ in range(600):
            replay, ended = await read_stream(api.http, f"/v1/threads/{thread}/events")
            texts = {e["text"] for e in committed(replay) if e["thread_id"] == thread and e["type"] == "text"}
            if {"Got the report.", "Child finished."} <= texts and ended:
                break
            await asyncio.sleep(0.05)
        await asyncio.wait_for(settle(api, thread), 60)
        replay, ended = await read_stream(api.http, f"/v1/threads/{thread}/events")
        assert ended
        target.update(e["event_id"] for e in committed(replay))
        union, cuts = await asyncio.wait_for(cut_task, 60)
        whole = await asyncio.wait_for(uncut_task, 60)

        union_ids = [e.data["event_id"] for e in union if e.event != "text_delta"]
        assert len(union_ids) == len(set(union_ids)), "an event was repeated after a resume"
        assert cuts >= 5

        def shape(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
            return [(e["thread_id"][:6], e["type"], e.get("text", "")[:20]) for e in events]

        for t in per_thread(committed(replay)):
            replayed = shape([e for e in committed(replay) if e["thread_id"] == t])
            assert shape([e for e in committed(union) if e["thread_id"] == t]) == replayed
            assert shape([e for e in committed(whole) if e["thread_id"] == t]) == replayed
        assert per_thread(committed(union)) == per_thread(committed(whole)) == per_thread(committed(replay))
        # The independent oracle: what the worker published on the output queue, in its order.
        published = [e for e in await output_events(api) if e["root_thread_id"] == thread]
        published = [e for e in published if e["type"] in STREAM_KINDS]
        assert [
            (e["type"], e.get("text", "")[:25]) for e in committed(replay) if e["thread_id"] == thread
        ] == [(e["type"], e.get("text", "")[:25]) for e in published if e["thread_id"] == thread]
        assert [(e["type"], e["event_id"]) for e in committed(replay) if e["thread_id"] == thread] == [
            (e["type"], e["event_id"]) for e in published if e["thread_id"] == thread
        ]
        assert per_thread(committed(replay)) == per_thread(published)
        threads = per_thread(committed(replay))
        assert len(threads) == 2, "the child thread's events are in the stream"
        kinds = [e["type"] for e in committed(replay) if e["thread_id"] == thread]
        assert kinds[:3] == ["text", "tool_call", "tool_result"] and kinds.count("turn_complete") >= 2
        assert kinds[-1] == "turn_complete"
        first = committed(replay)[0]
        assert set(first) >= {"type", "event_id", "thread_id", "root_thread_id", "metadata"}
        assert first["root_thread_id"] == thread


STREAM_KINDS = {"text", "tool_call", "tool_result", "event", "turn_complete", "error"}


async def output_events(api: Any) -> list[dict[str, Any]]:
    sqs = api.deployment.services.runtime.sqs
    url = str(api.deployment.settings.output_queue_url)
    out: list[dict[str, Any]] = []
    while True:
        found = await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        if not found.get("Messages"):
            return out
        for message in found["Messages"]:
            out.append(json.loads(message["Body"]))
            await sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


async def settle(api: Any, thread: str) -> None:
    async for _ in api.client.replies(thread, after={}, timeout=60):
        pass


async def test_live_text_deltas_resume_mid_reply_then_the_committed_text_and_the_end() -> None:
    gate = Gate()
    model = FunctionModel(lambda text, request: say("Hello, ", "this is ", gate, "the rest."))
    async with api_stack(model, NONE, heartbeat_s=0.05) as api:
        thread = new_thread("delta")
        await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "hi"})
        path = f"/v1/threads/{thread}/events"
        before, _ = await read_stream(api.http, path, until=lambda e: e.event == "text_delta")
        deltas = [e.data["text"] for e in before if e.event == "text_delta"]
        assert "".join(deltas) == "Hello, this is "
        assert before[-1].data["thread_id"] == thread
        # Resumed from the delta: nothing of it again; heartbeats keep the quiet connection alive.
        parser_events: list[Sse] = []

        async def resumed() -> tuple[list[Sse], bool]:
            return await read_stream(api.http, path, after=before[-1].id)

        task = asyncio.create_task(resumed())
        await asyncio.sleep(0)
        gate.open()
        after, ended = await asyncio.wait_for(task, 60)
        parser_events.extend(after)
        assert ended, "the stream ends after the root's turn_complete"
        kinds = [e.event for e in after]
        assert kinds[-2:] == ["text", "turn_complete"], kinds
        assert after[-2].data["text"] == "Hello, this is the rest."
        assert all(e.data["text"] != "Hello, this is " for e in after if e.event == "text_delta")

        # A quiet followed stream sends heartbeat comments.
        async with api.http.stream("GET", path + "?follow=1") as response:
            parser = SseParser()
            async for chunk in response.aiter_text():
                parser.feed(chunk)
                if any(e.comment == "heartbeat" for e in parser.events):
                    break
        # A bad resume token is a 400.
        bad = await api.http.get(path, headers={"Last-Event-ID": "garbage!"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_request"
