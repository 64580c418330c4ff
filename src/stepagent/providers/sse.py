"""Server-sent events (SSE) decoding, as the WHATWG HTML spec defines it, over raw bytes.

Guarantees:

- Lines end at CR, LF or CRLF and nowhere else. In particular U+2028/U+2029 and other Unicode line
  breaks inside a JSON payload never split a line (``str.splitlines`` would), and a CRLF split across two
  network chunks is one line end, not two.
- A multi-byte UTF-8 character split across chunks is decoded whole: lines are cut on bytes first and
  decoded afterwards (invalid UTF-8 becomes U+FFFD instead of failing the stream).
- An event is dispatched only at its terminating blank line. An event still incomplete when the stream ends
  is dropped (as the spec says), so a connection cut in the middle of an event never yields half of it;
  callers detect the cut because the provider's own terminal event never arrived.
- Comments (``:`` lines), ``id`` and ``retry`` fields are handled per spec; unknown fields are ignored.

The decoder is pure (``feed``/``close``); :func:`aiter_sse` adapts it to an async byte stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. ``event`` defaults to ``"message"`` like a browser's EventSource."""

    event: str
    data: str
    id: str | None = None


class SSEDecoder:
    """Incremental SSE decoder: ``feed`` bytes as they arrive, ``close`` at the end of the stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._has_data = False
        self._last_id: str | None = None
        self._first_line = True

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer.extend(chunk)
        return self._drain(final=False)

    def close(self) -> list[SSEEvent]:
        """End of stream: a last line without a terminator still counts, an undispatched event does not."""
        events = self._drain(final=True)
        if self._buffer:
            line = bytes(self._buffer)
            self._buffer.clear()
            event = self._line(line)
            if event is not None:
                events.append(event)
        # Whatever is still accumulated never saw its blank line: discard it (spec: "incomplete event").
        self._reset_event()
        return events

    def _drain(self, *, final: bool) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        buffer = self._buffer
        start = 0
        length = len(buffer)
        while start < length:
            cr = buffer.find(b"\r", start)
            lf = buffer.find(b"\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr + 1 == length and not final:
                    break  # a CR at the end of the chunk may be the first half of a CRLF
                end = cr
                next_start = cr + 2 if cr + 1 < length and buffer[cr + 1] == 0x0A else cr + 1
            else:
                end = lf
                next_start = lf + 1
            event = self._line(bytes(buffer[start:end]))
            if event is not None:
                events.append(event)
            start = next_start
        del buffer[:start]
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        line = raw.decode("utf-8", errors="replace")
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "id" and "\0" not in value:
            self._last_id = value
        # "retry" and unknown fields do not affect the events we hand out.
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._has_data:
            self._reset_event()
            return None
        event = SSEEvent(event=self._event or "message", data="\n".join(self._data), id=self._last_id)
        self._reset_event()
        return event

    def _reset_event(self) -> None:
        self._event = ""
        self._data = []
        self._has_data = False


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[SSEEvent]:
    """Decode an async byte stream into events. Transport errors from ``chunks`` propagate unchanged."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.close():
        yield event
