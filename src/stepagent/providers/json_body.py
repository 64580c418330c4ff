"""Request bodies serialised like the vendors' SDKs, and sent in pieces so a step never holds a second copy.

Guarantees:

- :func:`dump_json` gives the bytes the SDKs send: compact separators, raw UTF-8 (``ensure_ascii=False``),
  no NaN; a lone surrogate (only possible from already-broken tool output) is replaced by ``?``
  deterministically rather than failing the step.
- A body value may be a :class:`JsonArray`: an array produced element by element from a factory.
  :func:`body_chunks` yields exactly the bytes :func:`dump_json` gives for the same object with its arrays
  materialised, one element at a time, and every pass calls the factory again, so a retried request
  re-sends identical bytes.
- :func:`http_content` is what the HTTP providers send: the body's length from a first pass (each element
  encoded, counted and dropped) and an async stream of its chunks. A step therefore holds its history rows
  and one encoded element, never the whole body as one object beside them: the request is the only
  request-sized data a step may hold (``bench/memory.py`` gates a step's peak memory at 2x the request
  body + 8 MiB).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class JsonArray:
    """A JSON array whose elements ``factory()`` produces on each pass (it must be repeatable)."""

    __slots__ = ("factory",)

    def __init__(self, factory: Callable[[], Iterable[Any]]) -> None:
        self.factory = factory

    def __iter__(self) -> Iterator[Any]:
        return iter(self.factory())


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace")


def body_chunks(body: Mapping[str, Any]) -> Iterator[bytes]:
    """The UTF-8 JSON of ``body`` in pieces: one per plain field, one per element of a :class:`JsonArray`."""
    separator = "{"
    for key, value in body.items():
        head = separator + _ENCODER.encode(key) + ":"
        separator = ","
        if not isinstance(value, JsonArray):
            yield _utf8(head + _ENCODER.encode(value))
            continue
        element_separator = "["
        for element in value:
            yield _utf8(head + element_separator + _ENCODER.encode(element))
            head, element_separator = "", ","
        yield _utf8(head + "[]" if element_separator == "[" else "]")
    yield b"{}" if separator == "{" else b"}"


def dump_json(body: Mapping[str, Any]) -> bytes:
    """``body`` (whose values may be :class:`JsonArray`) as one bytes object, exactly as the SDKs send it."""
    return b"".join(body_chunks(body))


def http_content(body: Mapping[str, Any]) -> tuple[int, AsyncIterator[bytes]]:
    """``(Content-Length, chunks)`` for sending ``body`` without ever materialising it."""
    length = sum(len(chunk) for chunk in body_chunks(body))

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in body_chunks(body):
            yield chunk

    return length, chunks()
