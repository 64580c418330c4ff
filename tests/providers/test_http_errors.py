"""Retry classification and ``Retry-After`` parsing (pure), and the per-loop client holder."""

from __future__ import annotations

import asyncio
import email.utils

import httpx
import pytest

from stepagent.providers.http import (
    ClientHolder,
    api_error_message,
    error_from_response,
    error_from_transport,
    is_retryable_status,
    parse_retry_after,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(408, True), (409, True), (425, True), (429, True), (500, True), (502, True), (503, True), (504, True),
     (529, True), (400, False), (401, False), (403, False), (404, False), (413, False), (422, False)],
)  # fmt: skip
def test_status_classification(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable
    assert error_from_response("p", status, {}, b"").retryable is retryable


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Retry-After": "5"}, 5.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"Retry-After": " 12 "}, 12.0),
        ({"retry-after-ms": "1200"}, 1.2),
        ({"retry-after-ms": "300", "retry-after": "9"}, 0.3),  # the more precise one wins
        ({"retry-after-ms": "garbage", "retry-after": "9"}, 9.0),
        ({"Retry-After": "-3"}, None),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": email.utils.formatdate(NOW + 30, usegmt=True)}, 30.0),
        ({"Retry-After": email.utils.formatdate(NOW - 30, usegmt=True)}, 0.0),  # in the past: now
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00"}, None),  # no zone: not an HTTP date
    ],
)
def test_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == expected


def test_error_message_shapes() -> None:
    anthropic = b'{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}}'
    assert api_error_message(anthropic) == ("invalid_request_error", "max_tokens: too big")
    openai = b'{"error":{"message":"bad key","type":null,"code":"invalid_api_key"}}'
    assert api_error_message(openai) == ("invalid_api_key", "bad key")
    assert api_error_message(b"<html>502 Bad Gateway</html>") == (None, "<html>502 Bad Gateway</html>")
    assert api_error_message(b"") == (None, "(empty response body)")
    assert api_error_message(b'{"error":"plain"}') == (None, "plain")


def test_error_from_response_names_status_type_and_message() -> None:
    error = error_from_response(
        "anthropic", 400, {}, b'{"error":{"type":"invalid_request_error","message":"nope"}}'
    )
    assert str(error) == "anthropic API error 400 invalid_request_error: nope"
    assert error.status == 400 and not error.retryable


def test_transport_errors_are_retryable() -> None:
    assert error_from_transport("p", httpx.ConnectError("refused"), during_stream=False).retryable
    cut = error_from_transport("p", httpx.ReadError(""), during_stream=True)
    assert cut.retryable and "cut" in str(cut)


def test_one_client_per_event_loop() -> None:
    holder = ClientHolder()

    async def get() -> httpx.AsyncClient:
        return holder.get()

    first = asyncio.run(get())
    second = asyncio.run(get())  # a fresh loop (a new Lambda invocation): a fresh client
    assert first is not second

    async def twice() -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
        a, b = holder.get(), holder.get()
        await holder.aclose()
        return a, b

    a, b = asyncio.run(twice())
    assert a is b and a.is_closed


async def test_injected_client_is_always_used() -> None:
    client = httpx.AsyncClient()
    holder = ClientHolder(client)
    assert holder.get() is client
    await holder.aclose()
    assert not client.is_closed  # not ours to close
    await client.aclose()
