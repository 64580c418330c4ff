"""Thin HTTP plumbing shared by the HTTP providers: error classification, ``Retry-After``, SSE over httpx.

Guarantees:

- Every failure leaves as a :class:`~stepagent.errors.ProviderError` with ``retryable`` set: 408, 409, 425,
  429, 5xx (incl. Anthropic's 529 "overloaded"), connection/timeout errors and streams cut mid-way are
  retryable; every other 4xx (400, 401, 403, 404, 413, 422, ...) is not. The message carries the API's own
  error message (``error.message`` of the JSON body) so a bad request is diagnosable from the log.
- ``retry_after`` comes from ``retry-after-ms`` (milliseconds) or ``Retry-After`` (delta-seconds or an
  HTTP date), never negative; ``None`` when absent or unparseable.
- No retries happen here: the engine's RetryPolicy owns them, and because translation is deterministic a
  retry re-sends identical bytes.
- One ``httpx.AsyncClient`` per provider and event loop (a client's connection pool is bound to the loop
  that created it; the Lambda handlers keep one loop per process, a caller that runs ``asyncio.run`` per
  request does not). An injected client is used
  as is and never closed by us.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx

from stepagent.errors import ProviderError
from stepagent.providers.json_body import http_content
from stepagent.providers.sse import SSEEvent, aiter_sse

RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
_MESSAGE_LIMIT = 2000

# Reading a model stream can pause for a long time between chunks (long thinking, big tool arguments);
# Anthropic sends pings, OpenAI-compatible servers may not. Connecting should be quick.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth retrying: :data:`RETRYABLE_STATUS` or any 5xx."""
    return status in RETRYABLE_STATUS or status >= 500


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait as the server asked: ``retry-after-ms`` first (more precise), then ``Retry-After``
    as seconds or as an HTTP date (relative to ``now``, default the wall clock)."""
    lowered = {key.lower(): value for key, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis.strip()) / 1000.0
        except ValueError:
            value = float("nan")
        if value == value and value >= 0 and value != float("inf"):
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if seconds == seconds:  # not NaN: delta-seconds
        return seconds if 0 <= seconds != float("inf") else None
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None  # HTTP dates are GMT; a date without a zone is not one
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def api_error_message(body: bytes | str) -> tuple[str | None, str]:
    """``(error type, message)`` from an API error body (Anthropic and OpenAI shapes), else the raw text."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            message = error.get("message")
            kind = error.get("type") or error.get("code")
            if isinstance(message, str) and message:
                return (str(kind) if kind is not None else None), message
        elif isinstance(error, str) and error:
            return None, error
    stripped = text.strip()
    if len(stripped) > _MESSAGE_LIMIT:
        stripped = stripped[:_MESSAGE_LIMIT] + "…"
    return None, stripped or "(empty response body)"


def error_from_response(
    provider: str, status: int, headers: Mapping[str, str], body: bytes, *, now: float | None = None
) -> ProviderError:
    """The ProviderError for a non-2xx response."""
    kind, message = api_error_message(body)
    label = f"{status} {kind}" if kind else str(status)
    return ProviderError(
        f"{provider} API error {label}: {message}",
        retryable=is_retryable_status(status),
        status=status,
        retry_after=parse_retry_after(headers, now),
    )


def error_from_transport(provider: str, error: BaseException, *, during_stream: bool) -> ProviderError:
    """Connection failures, timeouts and cut streams: always retryable (the request never completed)."""
    where = "the response stream was cut" if during_stream else "the request failed"
    detail = str(error) or type(error).__name__
    return ProviderError(f"{provider}: {where}: {detail}", retryable=True)


def stream_cut(provider: str, missing: str) -> ProviderError:
    """The stream ended cleanly at the transport level but without the provider's terminal event."""
    return ProviderError(f"{provider}: the response stream ended before {missing}", retryable=True)


class ClientHolder:
    """One ``httpx.AsyncClient`` per event loop, unless one was injected (then always that one)."""

    def __init__(self, injected: httpx.AsyncClient | None = None) -> None:
        self._injected = injected
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        if self._injected is not None:
            return self._injected
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            # The previous loop is gone (or never existed); its client cannot be reused or closed here.
            self._client = httpx.AsyncClient(timeout=DEFAULT_TIMEOUT)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None
        self._loop = None


async def post_sse(
    client: httpx.AsyncClient,
    provider: str,
    url: str,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
) -> AsyncGenerator[SSEEvent, None]:
    """POST the JSON ``body`` and yield the SSE events of a 2xx answer; raise ProviderError for anything else.

    The body is streamed in pieces with its exact ``Content-Length`` (:func:`~stepagent.providers.json_body.http_content`),
    so it never exists as one object beside the history it was built from.

    Transport errors before the response become retryable errors "the request failed"; errors while
    reading the body become retryable "the response stream was cut"."""
    length, content = http_content(body)
    request = client.build_request(
        "POST", url, headers={**headers, "content-length": str(length)}, content=content
    )
    try:
        response = await client.send(request, stream=True)
    except httpx.RequestError as exc:
        raise error_from_transport(provider, exc, during_stream=False) from exc
    try:
        if not 200 <= response.status_code < 300:
            try:
                error_body = await response.aread()
            except (httpx.RequestError, httpx.StreamError):
                error_body = b""
            raise error_from_response(provider, response.status_code, response.headers, error_body)
        try:
            async for event in aiter_sse(response.aiter_bytes()):
                yield event
        except (httpx.RequestError, httpx.StreamError) as exc:
            # RequestError covers transport failures and content-decoding errors of a cut body.
            raise error_from_transport(provider, exc, during_stream=True) from exc
    finally:
        await response.aclose()
