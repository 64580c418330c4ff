"""Request peak memory gate: one step with N rows in context peaks at most 2x its model request body plus
8 MiB, for N = 10, 1,000 and 10,000 — the request body is the only request-sized data a step may hold
besides the rows it was built from.

One warm worker step (user text → model → commit → outputs) on a thread with ``rows`` stored rows of ~4 KB,
all in context (no summary; the model's window is larger than any history here, so nothing is truncated),
through a real HTTP provider (Anthropic Messages or OpenAI Chat Completions) whose transport reads the
request body piece by piece, as a server would, and answers with a short SSE stream. The peak is the
traced peak during the step minus the settled heap before it (``tracemalloc``; the store is
:mod:`bench.sqlite_store`, outside the traced heap, as DynamoDB would be). ``body`` is the number of bytes
the transport received.

The trap ``second-copy`` keeps the body the way an ordinary client builds it, serialised to one ``str``
and encoded to one ``bytes`` object, alive beside the rows while the request is sent (what this
runtime did before it streamed bodies). It must fail the same predicate at 10,000 rows.

Run as ``python -m bench.request_peak --rows 10000 --provider anthropic --out p.json`` (one measurement
per fresh process).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import tempfile
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bench.memory import PEAK_BOUND, CountingStore, seed, settled
from bench.sqlite_store import SqliteBackend, SqliteStateStore
from bench.workload import Workload
from stepagent.messages import InputMessage
from stepagent.providers import anthropic, openai_compat
from stepagent.providers.base import ModelInfo, ModelProvider, ModelRequest
from stepagent.providers.json_body import JsonArray

PROVIDERS = ("anthropic", "openai")
VARIANTS = ("normal", "second-copy")
#: Tokens: no history measured here comes near it, so the request carries every row.
WINDOW = 10**9

_ANTHROPIC_SSE = "".join(
    f"event: {kind}\ndata: {json.dumps(data)}\n\n"
    for kind, data in (
        (
            "message_start",
            {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}},
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        ),
        ("message_stop", {"type": "message_stop"}),
    )
).encode()
_OPENAI_SSE = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"ok"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)


class ReadingTransport(httpx.AsyncBaseTransport):
    """A model server in process: reads each request body piece by piece (keeping only its length) and
    answers with a one-word SSE stream."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.bodies: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        received = 0
        assert isinstance(request.stream, httpx.AsyncByteStream)
        async for piece in request.stream:
            received += len(piece)
        self.bodies.append(received)
        return httpx.Response(200, content=self.answer, headers={"content-type": "text/event-stream"})


def _second_copy(body: dict[str, Any]) -> tuple[str, bytes]:
    """The body as an ordinary client serialises it: one ``str``, then one ``bytes`` of it."""
    plain = {key: list(value) if isinstance(value, JsonArray) else value for key, value in body.items()}
    text = json.dumps(plain, ensure_ascii=False, separators=(",", ":"))
    return text, text.encode()


class SecondCopyAnthropic(anthropic.AnthropicProvider):
    """Trap: keeps the serialised body (``str`` and ``bytes``) alive while the request is sent."""

    held: tuple[str, bytes] | None = None

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        body = super().request_body(request)
        self.held = _second_copy(body)
        return body


class SecondCopyOpenAI(openai_compat.OpenAIProvider):
    """Trap: as :class:`SecondCopyAnthropic`, for Chat Completions."""

    held: tuple[str, bytes] | None = None

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        body = super().request_body(request)
        self.held = _second_copy(body)
        return body


def _provider(kind: str, variant: str, transport: ReadingTransport) -> ModelProvider:
    info = ModelInfo("m", context_window=WINDOW, max_output_tokens=1000)
    client = httpx.AsyncClient(transport=transport)
    if kind == "anthropic":
        cls: type[Any] = SecondCopyAnthropic if variant == "second-copy" else anthropic.AnthropicProvider
    else:
        cls = SecondCopyOpenAI if variant == "second-copy" else openai_compat.OpenAIProvider
    provider: ModelProvider = cls("m", api_key="key", info=info, http_client=client)
    return provider


@dataclass
class RequestPeak:
    """One measurement: the step's traced peak against its request body."""

    provider: str
    variant: str
    rows: int
    rows_read: int
    body: int
    peak: int
    bound: int
    within_bound: bool
    peak_per_body: float


async def request_peak(rows: int, provider: str = "anthropic", variant: str = "normal") -> RequestPeak:
    """Measure one step with ``rows`` rows in context (tracemalloc must be tracing)."""
    if provider not in PROVIDERS or variant not in VARIANTS:
        raise ValueError(f"unknown provider/variant {provider!r}/{variant!r}")
    with tempfile.TemporaryDirectory(prefix="stepagent-request-peak-") as folder:
        backend = SqliteBackend(os.path.join(folder, "store.sqlite"))
        conversation = CountingStore(backend)
        transport = ReadingTransport(_ANTHROPIC_SSE if provider == "anthropic" else _OPENAI_SSE)
        workload = Workload.build(
            conversation,
            SqliteStateStore(backend),
            compact_after_tokens=10**10,
            provider=_provider(provider, variant, transport),
        )
        await seed(conversation, "warm", 10, 10)
        await seed(conversation, "probe", rows, rows)
        await workload.queue.send(InputMessage.user_text("warm", "hello there", id="warm-1"), "warm-1")
        await workload.step()
        base = settled()
        tracemalloc.reset_peak()
        read_before = conversation.rows_read
        await workload.queue.send(InputMessage.user_text("probe", "hello there", id="probe-1"), "probe-1")
        await workload.step()
        peak = tracemalloc.get_traced_memory()[1] - base
        info = await conversation.get_thread("probe")
        if workload.queue.pending or info is None or info.tail != rows + 2 or len(transport.bodies) != 2:
            raise AssertionError(f"the probe step did not run as one plain model call: {info}")
        body = transport.bodies[-1]
        bound = 2 * body + PEAK_BOUND
        return RequestPeak(
            provider=provider,
            variant=variant,
            rows=rows,
            rows_read=conversation.rows_read - read_before,
            body=body,
            peak=peak,
            bound=bound,
            within_bound=peak <= bound,
            peak_per_body=round(peak / body, 3),
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.request_peak", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--provider", choices=PROVIDERS, default="anthropic")
    parser.add_argument("--variant", choices=VARIANTS, default="normal")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    logging.getLogger("stepagent").setLevel(logging.WARNING)
    tracemalloc.start()
    result = asyncio.run(request_peak(args.rows, args.provider, args.variant))
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(dataclasses.asdict(result), out)


if __name__ == "__main__":
    main()
