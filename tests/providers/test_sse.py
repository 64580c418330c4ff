"""The SSE decoder: line ends, chunk boundaries, Unicode line separators, comments, incomplete events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stepagent.providers.sse import SSEDecoder, SSEEvent, aiter_sse

FIXTURES = Path(__file__).parent / "fixtures"


def decode_chunks(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.close())
    return events


def test_basic_fields_and_default_event_name() -> None:
    events = decode_chunks([b"event: ping\ndata: {}\n\ndata: a\ndata: b\nid: 7\n\n"])
    assert events == [SSEEvent("ping", "{}"), SSEEvent("message", "a\nb", "7")]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending(newline: bytes) -> None:
    raw = newline.join([b"event: x", b"data: 1", b"", b"data: 2", b"", b""])
    assert decode_chunks([raw]) == [SSEEvent("x", "1"), SSEEvent("message", "2")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    # "\r" ends one chunk and "\n" starts the next: one line end, so no spurious blank line dispatches.
    events = decode_chunks([b"data: a\r", b"\ndata: b\r\n\r\n"])
    assert events == [SSEEvent("message", "a\nb")]


def test_unicode_line_separators_do_not_split_lines() -> None:
    text = 'data: {"t":"a\u2028b\u2029c\x85d\x0be"}\n\n'
    assert decode_chunks([text.encode()]) == [SSEEvent("message", '{"t":"a\u2028b\u2029c\x85d\x0be"}')]


def test_multibyte_characters_split_byte_by_byte() -> None:
    raw = "event: t\ndata: 😀 日本語 \u2028\n\n".encode()
    events = decode_chunks([raw[i : i + 1] for i in range(len(raw))])
    assert events == [SSEEvent("t", "😀 日本語 \u2028")]


def test_comments_bom_and_unknown_fields() -> None:
    raw = "\ufeff: keep-alive\nretry: 100\nfoo: bar\ndata:no-space\n\n".encode()
    assert decode_chunks([raw]) == [SSEEvent("message", "no-space")]


def test_incomplete_event_at_end_of_stream_is_dropped() -> None:
    assert decode_chunks([b"data: complete\n\ndata: half"]) == [SSEEvent("message", "complete")]
    assert decode_chunks([b"data: complete\n\ndata: half\n"]) == [SSEEvent("message", "complete")]


def test_event_without_data_is_not_dispatched() -> None:
    assert decode_chunks([b"event: nothing\n\n"]) == []


@pytest.mark.parametrize("size", [1, 7, 64, 4096])
def test_fixture_decodes_the_same_at_any_chunk_size(size: int) -> None:
    raw = (FIXTURES / "anthropic_thinking_tool.sse").read_bytes()
    whole = decode_chunks([raw])
    assert len(whole) == 18
    assert decode_chunks([raw[i : i + size] for i in range(0, len(raw), size)]) == whole


async def test_async_adapter() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: 1\n"
        yield b"\ndata: 2\n\n"

    assert [e.data async for e in aiter_sse(chunks())] == ["1", "2"]
