"""The RAP receiver as a Starlette app, for local mode and tests (the Lambda uses ``handlers/rap_receiver.py``).

Every request goes through :func:`~stepagent.rap.receiver.receive_callback` (same authentication,
validation and conversion as the Lambda). Messages are sent with ``sender.send(message, dedup_id)`` and
view updates handed to ``on_view``; only when all of that succeeded is the answer 200, otherwise 500
``{"error": "Internal error"}`` so the tool server retries.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

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
from stepagent.senders.base import InputSender
from stepagent.tracing import TRACEPARENT, continuing

log = logging.getLogger(__name__)

OnView = Callable[[ViewUpdate], Awaitable[None]]


async def deliver(result: ReceiverResult, sender: InputSender, on_view: OnView | None) -> ReceiverResult:
    """Send what ``result`` carries; a failure turns it into a 500 (nothing is acknowledged unsent)."""
    try:
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
    path: str = "/",
    max_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """An ASGI app answering RAP callbacks at ``path`` (any method reaches it, so others get a 405)."""

    async def endpoint(request: Request) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            result = ReceiverResult(413, {"error": f"the callback body is over the {max_bytes}-byte limit"})
        else:
            body = await request.body()
            token = request.query_params.get("token")
            result = receive_callback(body, token, secret, method=request.method, max_bytes=max_bytes)
            if result.ok:
                # A callback that carries a trace context (the one its call was sent with) continues it.
                with continuing(request.headers.get(TRACEPARENT)):
                    result = await deliver(result, sender, on_view)
        return Response(result.body_json(), status_code=result.status, media_type="application/json")

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route(path, endpoint, methods=methods)])
