"""The RAP tool-server helper: manifest from type hints, acknowledgement, results and errors as
callbacks, callback retries, choices, lifecycle and authorisation (ASGI in process, callbacks mocked)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stepagent.errors import ToolError
from stepagent.rap.protocol import parse_manifest
from stepagent.rap.server import DEFERRED, RapCall, RapToolServer, Result, Subscription, current_call
from stepagent.tools.rap import MANIFEST_PATH

CALLBACK = "http://runtime.test/cb?token=t"


class Callbacks:
    """Receives the server's callbacks; ``statuses`` answers them in order (default 200)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.arrived = asyncio.Event()

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        self.arrived.set()
        return httpx.Response(self.statuses.pop(0) if self.statuses else 200, json={"ok": True})

    async def wait(self, count: int) -> list[dict[str, Any]]:
        async with asyncio.timeout(5):
            while len(self.bodies) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.bodies


def invocation(operation: str, arguments: Any = None, id: str = "tc-1") -> dict[str, Any]:
    return {
        "operation": operation,
        "arguments": arguments if arguments is not None else {},
        "id": id,
        "call_id": "c-1",
        "callback_url": CALLBACK,
        "group_id": "thread-1",
        "thread_ancestors": None,
    }


def build(callbacks: Callbacks, **options: Any) -> RapToolServer:
    http = httpx.AsyncClient(transport=httpx.MockTransport(callbacks.handler))
    server = RapToolServer(
        "test-tools", description="Tools under test", http=http, callback_backoff=0, **options
    )

    @server.tool
    def add(a: int, b: int = 1) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    @server.tool
    def explode() -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    @server.tool
    def refuse() -> str:
        """Fails with a message for the model."""
        raise ToolError("not today")

    @server.tool(timeout=0.05)
    async def slow() -> str:
        """Too slow."""
        await asyncio.sleep(5)
        return "late"

    @server.tool
    async def picture() -> Result:
        """A rich result."""
        return Result(text="a dot", content=[{"type": "image", "data": "iVBO", "mediaType": "image/png"}])

    @server.tool
    async def later() -> object:
        """Answers itself."""
        call = current_call()

        async def answer() -> None:
            await call.send_result("answered later")

        asyncio.get_running_loop().create_task(answer())
        return DEFERRED

    @server.tool
    async def stream(count: int) -> Subscription:
        """A subscription."""

        async def run(call: RapCall) -> None:
            for n in range(count):
                await call.send_event(str(n), event_id=str(n))
            await asyncio.sleep(10)  # until cancelled

        return Subscription("subscribed", run)

    return server


@pytest.fixture
async def setup() -> AsyncIterator[tuple[RapToolServer, Callbacks, httpx.AsyncClient]]:
    callbacks = Callbacks()
    server = build(callbacks)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://tools.test") as client:
        yield server, callbacks, client
    for tasks in list(server._work.values()):
        for task in tasks:
            task.cancel()


async def test_the_manifest_is_valid_and_built_from_type_hints(setup: Any) -> None:
    _, _, client = setup
    response = await client.get(MANIFEST_PATH)
    manifest = parse_manifest("http://tools.test", response.json())
    assert manifest.endpoint == "http://tools.test/invoke"
    add = next(t for t in manifest.tools if t.name == "add")
    assert add.description == "Add two numbers."
    assert add.input_schema["required"] == ["a"]
    assert add.input_schema["properties"]["a"] == {"type": "integer", "description": "The first number."}


async def test_a_call_is_acknowledged_then_answered_by_callback(setup: Any) -> None:
    _, callbacks, client = setup
    response = await client.post("/invoke", json=invocation("add", {"a": 2, "b": 3}))
    assert response.status_code == 200 and response.json() == {"ok": True}
    [body] = await callbacks.wait(1)
    assert body == {
        "type": "tool_result",
        "group_id": "thread-1",
        "id": "tc-1",
        "call_id": "c-1",
        "text": "5",
    }


@pytest.mark.parametrize(
    ("operation", "arguments", "expected"),
    [
        ("nope", {}, "Error: unknown operation 'nope' on RAP server 'test-tools'"),
        ("add", {"b": 2}, "Error: invalid arguments for tool 'add': missing required argument 'a'"),
        ("add", [1, 2], "Error: arguments for tool 'add' must be a JSON object"),
        ("explode", {}, "Error: RuntimeError: kaboom"),
        ("refuse", {}, "Error: not today"),
        ("slow", {}, "Error: tool 'slow' timed out after 0.05 s"),
    ],
)
async def test_every_accepted_call_ends_in_a_result_even_on_failure(
    setup: Any, operation: str, arguments: Any, expected: str
) -> None:
    _, callbacks, client = setup
    assert (await client.post("/", json=invocation(operation, arguments))).status_code == 200
    [body] = await callbacks.wait(1)
    assert body["text"] == expected and body["id"] == "tc-1"


async def test_rich_and_deferred_results(setup: Any) -> None:
    _, callbacks, client = setup
    await client.post("/invoke", json=invocation("picture", id="p"))
    await client.post("/invoke", json=invocation("later", id="l"))
    bodies = {b["id"]: b for b in await callbacks.wait(2)}
    assert bodies["p"]["content"] == [{"type": "image", "data": "iVBO", "mediaType": "image/png"}]
    assert bodies["l"]["text"] == "answered later"


async def test_invalid_invocations_are_400(setup: Any) -> None:
    _, callbacks, client = setup
    assert (await client.post("/invoke", content=b"nope")).status_code == 400
    broken = invocation("add", {"a": 1})
    del broken["callback_url"]
    response = await client.post("/invoke", json=broken)
    assert response.status_code == 400 and "callback_url" in response.json()["error"]
    assert callbacks.bodies == []


async def test_a_subscription_sends_its_result_first_then_events_until_cancelled(setup: Any) -> None:
    server, callbacks, client = setup
    await client.post("/invoke", json=invocation("stream", {"count": 2}, id="sub"))
    first, *events = await callbacks.wait(3)
    assert first["type"] == "tool_result" and first["subscription"] is True and first["text"] == "subscribed"
    assert [(e["type"], e["tool_call_id"], e["text"], e["event_id"]) for e in events] == [
        ("subscription_event", "sub", "0", "0"),
        ("subscription_event", "sub", "1", "1"),
    ]
    assert events[0]["associative"] is False and events[0]["final"] is False
    assert ("thread-1", "sub") in server._work
    response = await client.post("/cancel_tool_call", json={"thread_id": "thread-1", "tool_call_id": "sub"})
    assert response.status_code == 200 and server.cancelled == [("thread-1", "sub")]
    await asyncio.sleep(0.01)
    assert ("thread-1", "sub") not in server._work


async def test_close_thread_cancels_all_of_its_work(setup: Any) -> None:
    server, callbacks, client = setup
    await client.post("/invoke", json=invocation("stream", {"count": 0}, id="s1"))
    await callbacks.wait(1)
    assert (await client.post("/close_thread", json={"thread_id": "thread-1"})).status_code == 200
    await asyncio.sleep(0.01)
    assert server.closed == ["thread-1"] and server._work == {}


async def test_callbacks_retry_5xx_but_not_4xx(setup: Any) -> None:
    _, callbacks, client = setup
    callbacks.statuses = [503, 502, 200]
    await client.post("/invoke", json=invocation("add", {"a": 1}))
    bodies = await callbacks.wait(3)
    assert bodies[0] == bodies[1] == bodies[2]
    callbacks.statuses = [403]
    await client.post("/invoke", json=invocation("add", {"a": 1}, id="x"))
    await callbacks.wait(4)
    await asyncio.sleep(0.05)
    assert len(callbacks.bodies) == 4


async def test_choice_answers_are_validated() -> None:
    callbacks = Callbacks()
    server = build(callbacks)

    @server.tool
    async def choose() -> str:
        """Ask."""
        return str(await current_call().ask_user("?", ["a", "b"], default=1))

    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://tools.test") as client:
        await client.post("/invoke", json=invocation("choose", id="ch"))
        [asked] = await callbacks.wait(1)
        assert asked["type"] == "user_choice" and asked["default"] == 1 and asked["choices"] == ["a", "b"]
        url = asked["response_url"]
        assert url.startswith("http://tools.test/choices/")
        assert (await client.post("/choices/unknown", json={"id": "ch", "selected": 0})).status_code == 404
        assert (await client.post(url, json={"id": "other", "selected": 0})).status_code == 400
        assert (await client.post(url, json={"id": "ch", "selected": 2})).status_code == 400
        assert (await client.post(url, json={"id": "ch", "selected": True})).status_code == 400
        assert (await client.post(url, json={"id": "ch", "selected": 0})).status_code == 200
        _, answer = await callbacks.wait(2)
        assert answer["text"] == "0"
        assert (await client.post(url, json={"id": "ch", "selected": 0})).status_code == 404  # answered


async def test_authorize_guards_invocations_and_lifecycle() -> None:
    callbacks = Callbacks()

    async def authorize(request: Any) -> bool:
        return bool(request.headers.get("x-key") == "k")

    server = build(callbacks, authorize=authorize)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://tools.test") as client:
        assert (await client.post("/invoke", json=invocation("add", {"a": 1}))).status_code == 401
        assert (await client.post("/close_thread", json={"thread_id": "t"})).status_code == 401
        ok = await client.post("/invoke", json=invocation("add", {"a": 1}), headers={"x-key": "k"})
        assert ok.status_code == 200
        await callbacks.wait(1)


def test_current_call_outside_a_call_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="only available"):
        current_call()
