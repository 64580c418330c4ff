"""The RAP receiver as a Starlette app, for local mode and tests (the Lambda uses ``handlers/rap_receiver.py``).

Every request goes through :func:`~stepagent.rap.receiver.receive_callback` (same authentication,
validation and conversion as the Lambda). Messages are sent with ``sender.send(message, dedup_id)`` and
view updates handed to ``on_view``; only when all of that succeeded is the answer 200, otherwise 500
``{"error": "Internal error"}`` so the tool server retries. A result, sign-in link or question for a call
that is already answered (``answered``, over the state store) is refused with 409 and nothing is sent.

Before reading a body the app checks that a well-formed token is there (401 otherwise: the MAC itself
needs the body's thread id), then reads the body chunk by chunk and answers 413 as soon as it passes
``max_bytes`` — a chunked upload without a length is never buffered past the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from stepagent.errors import PayloadTooLargeError
from stepagent.rap.receiver import (
    INTERNAL_ERROR_BODY,
    MAX_BODY_BYTES,
    ReceiverResult,
    ViewUpdate,
    receive_callback,
)
from stepagent.rap.tokens import well_formed
from stepagent.senders.base import InputSender
from stepagent.stores.base import StateStore
from stepagent.tracing import TRACEPARENT, continuing

log = logging.getLogger(__name__)

OnView = Callable[[ViewUpdate], Awaitable[None]]
#: The subset of a thread's tool call ids that are answered (:meth:`StateStore.filter_answered`).
Answered = Callable[[str, Sequence[str]], Awaitable[set[str]]]


def answered_in(state: StateStore) -> Answered:
    """The answered-call check of a state store."""
    return state.filter_answered


async def deliver(
    result: ReceiverResult, sender: InputSender, on_view: OnView | None, answered: Answered
) -> ReceiverResult:
    """Send what ``result`` carries, unless it answers a call that is answered already (409); a failure
    turns it into a 500 (nothing is acknowledged unsent)."""
    try:
        if result.pending is not None:
            thread, call = result.pending
            if await answered(thread, [call]):
                return ReceiverResult(
                    409, {"error": f"tool call {call!r} is no longer waiting for an answer"}
                )
        for outgoing in result.messages:
            await sender.send(outgoing.message, outgoing.dedup_id)
        for view in result.views:
            if on_view is not None:
                await on_view(view)
    except PayloadTooLargeError as exc:  # no retry can fix it: say so instead of inviting retries
        return ReceiverResult(413, {"error": str(exc)})
    except Exception:
        log.exception("could not deliver a RAP callback")
        return ReceiverResult(500, INTERNAL_ERROR_BODY)
    return result


def receiver_app(
    secret: str,
    sender: InputSender,
    on_view: OnView | None = None,
    *,
    answered: Answered,
    path: str = "/",
    max_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """An ASGI app answering RAP callbacks at ``path`` (any method reaches it, so others get a 405)."""

    async def endpoint(request: Request) -> Response:
        body = await _read(request, max_bytes)
        if isinstance(body, ReceiverResult):
            result = body
        else:
            token = request.query_params.get("token")
            result = receive_callback(body, token, secret, method=request.method, max_bytes=max_bytes)
            if result.ok:
                # A callback that carries a trace context (the one its call was sent with) continues it.
                with continuing(request.headers.get(TRACEPARENT)):
                    result = await deliver(result, sender, on_view, answered)
        return Response(result.body_json(), status_code=result.status, media_type="application/json")

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route(path, endpoint, methods=methods)])


async def _read(request: Request, max_bytes: int) -> bytes | ReceiverResult:
    """The body, at most ``max_bytes`` of it, read after checking that a token is there; or the refusal."""
    if request.method.upper() != "POST":
        return b""  # receive_callback answers 405 without reading a body
    if not well_formed(request.query_params.get("token")):
        return ReceiverResult(
            401, {"error": "missing or malformed callback token (the 'token' query parameter)"}
        )
    too_large = ReceiverResult(413, {"error": f"the callback body is over the {max_bytes}-byte limit"})
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        return too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            return too_large
        chunks.append(chunk)
    return b"".join(chunks)
