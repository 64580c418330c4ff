"""Streamed request bodies (``providers/json_body.py``): the pieces are exactly the SDK-style bytes of the
materialised object, every pass is identical, and what the HTTP providers send is those bytes with their
exact Content-Length."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx

from stepagent.history_items import AssistantText, UserItem
from stepagent.messages import TextContent
from stepagent.providers.anthropic import AnthropicProvider
from stepagent.providers.base import ModelInfo, ModelRequest, ToolSpec
from stepagent.providers.json_body import JsonArray, body_chunks, dump_json, http_content
from stepagent.providers.openai_compat import OpenAIProvider

TEXTS = ["", "a", "é", "😀", "\u2028", '"q"', "\\", "\ud800 lone", "κλ\n\t", "0"]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randrange(-(10**12), 10**12)
    if kind == 3:
        return rng.uniform(-1e6, 1e6)
    if kind == 4:
        return "".join(rng.choice(TEXTS) for _ in range(rng.randrange(4)))
    if kind in (5, 6):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {random_value(rng, 3) or "k": random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_body(rng: random.Random) -> dict[str, Any]:
    """A body whose arrays marked ``("lazy", items)`` are to become JsonArrays."""
    body: dict[str, Any] = {}
    for n in range(rng.randrange(6)):
        items = [random_value(rng) for _ in range(rng.randrange(5))]
        body[f"k{n}{rng.choice(TEXTS)}"] = ("lazy", items) if rng.random() < 0.5 else random_value(rng)
    return body


def split(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body twice: arrays marked ``("lazy", items)`` as JsonArray, and materialised."""
    lazy: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, tuple):
            items = value[1]
            lazy[key] = JsonArray(lambda items=items: iter(items))
            plain[key] = items
        else:
            lazy[key] = plain[key] = value
    return lazy, plain


def sdk_bytes(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
        "utf-8", errors="replace"
    )


def test_streamed_pieces_are_the_sdk_bytes_of_the_materialised_body() -> None:
    rng = random.Random(20261201)
    for _ in range(500):
        lazy, plain = split(random_body(rng))
        assert dump_json(lazy) == sdk_bytes(plain) == dump_json(plain)
        assert b"".join(body_chunks(lazy)) == b"".join(body_chunks(lazy))  # every pass is the same


def test_sdk_style_text_and_surrogates() -> None:
    body = {"t": '😀\u2028 "q" κ', "n": 1}
    assert dump_json(body) == '{"t":"😀\u2028 \\"q\\" κ","n":1}'.encode()
    assert dump_json({"t": "bad \ud800 surrogate"}) == b'{"t":"bad ? surrogate"}'
    assert dump_json({}) == b"{}"
    assert dump_json({"m": JsonArray(list)}) == b'{"m":[]}'


async def test_http_content_length_matches_the_streamed_bytes() -> None:
    body = {"model": "m", "messages": JsonArray(lambda: ({"n": n, "t": "é" * n} for n in range(50)))}
    length, chunks = http_content(body)
    sent = b"".join([chunk async for chunk in chunks])
    assert length == len(sent) and sent == dump_json(body)


class Recording(httpx.AsyncBaseTransport):
    """Reads the request body piece by piece as a server would; answers with an HTTP error so the step ends."""

    def __init__(self) -> None:
        self.pieces = 0
        self.body = b""
        self.headers: httpx.Headers | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.headers = request.headers
        assert isinstance(request.stream, httpx.AsyncByteStream)
        async for piece in request.stream:
            self.pieces += 1
            self.body += piece
        return httpx.Response(400, json={"error": {"message": "recorded"}})


async def test_the_http_providers_stream_the_body_they_would_dump() -> None:
    history = [
        UserItem(TextContent(text=f"question {n}")) if n % 2 == 0 else AssistantText(f"answer {n}")
        for n in range(41)
    ]
    request = ModelRequest(
        system="be brief", history=history, tools=[ToolSpec("t", "d", {})], model=ModelInfo("m")
    )
    for make in (
        lambda client: AnthropicProvider("m", api_key="k", info=ModelInfo("m"), http_client=client),
        lambda client: OpenAIProvider("m", api_key="k", info=ModelInfo("m"), http_client=client),
    ):
        transport = Recording()
        provider = make(httpx.AsyncClient(transport=transport))
        try:
            async for _ in provider.stream(request):
                pass
        except Exception as error:  # the recorded 400 ends the stream
            assert "recorded" in str(error)
        assert transport.body == provider.request_bytes(request)
        assert transport.headers is not None
        assert int(transport.headers["content-length"]) == len(transport.body)
        assert "transfer-encoding" not in transport.headers
        assert transport.pieces > 41  # one piece per message at least: never one body-sized object
