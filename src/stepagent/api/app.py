"""The HTTP API's application (Starlette): what a web or mobile backend calls instead of SQS and DynamoDB.

========================================  ======================================================================
``POST /v1/threads/{thread}/messages``    ``{"text", "metadata"}`` → 202 ``{"message_id"}``; ``Idempotency-Key``
                                          is the logical message id, so a retried POST is processed once
``POST /v1/threads/{thread}/approvals``   an approval answer (``tool_call_id``, ``decision``, ``args``,
                                          ``message``) → 202 ``{"message_id"}``; ``.../elicitations``: an
                                          answer to a tool's question (``tool_call_id``, ``action``,
                                          ``content``) → 202 ``{"message_id"}``
``GET /v1/threads/{thread}``              the tree's items, as ``stepagent history --json``
``GET /v1/threads/{thread}/events``       Server-Sent Events (:mod:`stepagent.api.events`): ``Last-Event-ID``
                                          or ``?after=`` resumes, ``?follow=1`` never ends
``GET /``                                 the chat page
========================================  ======================================================================

Every ``/v1`` route authenticates the caller (:mod:`stepagent.api.auth`) and checks the thread's owner
(:mod:`stepagent.api.ownership`). Errors are ``{"error": {"code", "message"}}``: 400 ``bad_request``
(malformed JSON, a body that breaks the input message rules, a bad resume token), 401 ``unauthorized``, 404
``not_found`` (unknown, or someone else's), 413 ``too_large`` (a body over the input message's 16 MiB, or
metadata over 256 KiB), 429 ``too_many_requests`` (too many open streams for one subject, or the store or
queue throttled us; with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stepagent.api.auth import Unauthorized, Verifier
from stepagent.api.events import BadToken, SharedReads, TreeEvents, decode_token
from stepagent.api.ownership import Ownership
from stepagent.client import Client
from stepagent.errors import InputError, MalformedMessageError, PayloadTooLargeError, TransientError
from stepagent.input_rules import MAX_MESSAGE_BYTES, check_id, check_json, check_metadata, load_json
from stepagent.messages import ApprovalDecision, ElicitationAnswer, InputMessage
from stepagent.transcript import tree_items

#: Seconds of silence after which an event stream sends a comment, so proxies keep it open.
HEARTBEAT_S = 15.0
#: Open event streams one subject may hold on one server.
MAX_STREAMS_PER_SUBJECT = 64


class ApiError(Exception):
    """An answer other than success: its HTTP status, code and message."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class MessageBody(BaseModel):
    """``POST .../messages``."""

    model_config = ConfigDict(extra="forbid")
    text: str
    metadata: Any = None


class ApprovalBody(ApprovalDecision):
    """``POST .../approvals``: the ``approval`` input content, with unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ElicitationBody(ElicitationAnswer):
    """``POST .../elicitations``: the ``elicitation`` input content, with unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(slots=True)
class ApiState:
    """What the application needs: an open client (stores and sender), the verifier, shared reads."""

    client: Client
    verifier: Verifier
    heartbeat_s: float = HEARTBEAT_S
    max_streams: int | None = MAX_STREAMS_PER_SUBJECT
    streams: dict[str, int] = field(default_factory=dict)
    reads: SharedReads = field(init=False)
    owners: Ownership = field(init=False)

    def __post_init__(self) -> None:
        reader = self.client.reader
        self.reads = SharedReads(reader)
        self.owners = Ownership(reader.io, reader.state_table, reader.conversation)


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


Handler = Callable[[Request, ApiState, str, str], Awaitable[Response]]


def _route(state: ApiState, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Authentication, the thread id's rules and the error mapping around one ``/v1`` handler."""

    async def endpoint(request: Request) -> Response:
        try:
            try:
                subject = await state.verifier.subject(request.headers.get("authorization"))
            except Unauthorized as error:
                raise ApiError(401, "unauthorized", str(error), {"WWW-Authenticate": "Bearer"}) from None
            thread = request.path_params["thread"]
            try:
                check_id(thread, "thread")
            except InputError as error:
                raise ApiError(400, "bad_request", str(error)) from None
            return await handler(request, state, subject, thread)
        except ApiError as error:
            return _error(error.status, error.code, error.message, error.headers)
        except TransientError as error:
            return _error(429, "too_many_requests", f"try again shortly: {error}", {"Retry-After": "1"})

    return endpoint


async def _body(request: Request) -> Any:
    """The request's JSON body, at most the input message's size, checked by the input message rules."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_MESSAGE_BYTES:
        raise ApiError(413, "too_large", f"the body is over the {MAX_MESSAGE_BYTES}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_MESSAGE_BYTES:
            raise ApiError(413, "too_large", f"the body is over the {MAX_MESSAGE_BYTES}-byte limit")
        chunks.append(chunk)
    try:
        value = load_json(b"".join(chunks), "request body")
        check_json(value, "request body")
    except MalformedMessageError as error:
        raise ApiError(400, "bad_request", str(error)) from None
    if not isinstance(value, dict):
        raise ApiError(400, "bad_request", "the request body must be a JSON object")
    return value


def _parse(model: type[BaseModel], value: Any) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in error.errors()
        )
        raise ApiError(400, "bad_request", f"invalid request body: {problems}") from None


def _message_id(request: Request) -> str:
    key = request.headers.get("idempotency-key")
    if key is None:
        return str(uuid.uuid4())
    try:
        if not key.strip():
            raise MalformedMessageError("the Idempotency-Key header is empty")
        check_id(key, "Idempotency-Key")
    except InputError as error:
        raise ApiError(400, "bad_request", str(error)) from None
    return key


async def _claim(state: ApiState, thread: str, subject: str) -> None:
    if not await state.owners.claim(thread, subject):
        raise ApiError(404, "not_found", f"no thread {thread!r}")


async def _readable(state: ApiState, thread: str, subject: str) -> None:
    if not await state.owners.may_read(thread, subject):
        raise ApiError(404, "not_found", f"no thread {thread!r}")


async def send_message(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """Put the user's message on the input queue (once per ``Idempotency-Key``)."""
    body = _parse(MessageBody, await _body(request))
    try:
        check_metadata(body.metadata)
    except PayloadTooLargeError as error:
        raise ApiError(413, "too_large", str(error)) from None
    message_id = _message_id(request)
    await _claim(state, thread, subject)
    message = InputMessage.user_text(thread, body.text, id=message_id, metadata=body.metadata)
    await state.client.sender.send(message, message_id)
    return JSONResponse({"message_id": message_id}, 202)


async def send_approval(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """Send a person's decision on a waiting tool call as an input message."""
    body = _parse(ApprovalBody, await _body(request))
    message_id = _message_id(request)
    await _readable(state, thread, subject)
    # The client routes the decision to whichever thread of the tree waits on the call (a child's, too).
    await state.client.approve(
        thread, body.tool_call_id, body.decision, body.args, body.message, message_id=message_id
    )
    return JSONResponse({"message_id": message_id}, 202)


async def send_elicitation(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """Send a person's answer to a tool's question (``input_required``) as an input message."""
    body = _parse(ElicitationBody, await _body(request))
    message_id = _message_id(request)
    await _readable(state, thread, subject)
    await state.client.answer_input(
        thread, body.tool_call_id, body.action, body.content, message_id=message_id
    )
    return JSONResponse({"message_id": message_id}, 202)


async def get_history(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """The tree's stored items (``stepagent history --json``), streamed: memory stays bounded by a row."""
    await _readable(state, thread, subject)
    items = tree_items(state.client.conversation, thread)
    first = await anext(items, None)  # a store failure answers an error, not a broken 200

    async def body() -> AsyncIterator[bytes]:
        if first is None:
            yield b"[]"
            return
        yield b"[" + _json(first)
        async for item in items:
            yield b"," + _json(item)
        yield b"]"

    return StreamingResponse(body(), media_type="application/json")


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


async def get_events(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """The tree's events as Server-Sent Events, from the resume token if one is given."""
    token = request.headers.get("last-event-id") or request.query_params.get("after")
    follow = request.query_params.get("follow", "") in ("1", "true", "yes")
    try:
        positions = decode_token(token, thread) if token else None
    except BadToken as error:
        raise ApiError(400, "bad_request", str(error)) from None
    await _readable(state, thread, subject)
    limit = state.max_streams if state.verifier.settings.mode == "jwt" else None
    if limit is not None and state.streams.get(subject, 0) >= limit:
        raise ApiError(
            429, "too_many_requests", f"at most {limit} open event streams per user", {"Retry-After": "5"}
        )
    tree = TreeEvents(state.reads, thread, positions, follow=follow)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        _sse(state, subject, tree), media_type="text/event-stream; charset=utf-8", headers=headers
    )


async def _sse(state: ApiState, subject: str, tree: TreeEvents) -> AsyncIterator[bytes]:
    """The stream: events as they are found, a heartbeat comment after each quiet ``heartbeat_s``."""
    state.streams[subject] = state.streams.get(subject, 0) + 1
    try:
        yield b": stepagent events\nretry: 1000\n\n"
        quiet_since = time.monotonic()
        while True:
            async for token, event in tree.poll():
                data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
                yield f"id: {token}\nevent: {event['type']}\ndata: {data}\n\n".encode()
                quiet_since = time.monotonic()
            if tree.ended:
                return
            pause = tree.interval
            heartbeat_at = quiet_since + state.heartbeat_s
            now = time.monotonic()
            if heartbeat_at <= now + pause:
                await asyncio.sleep(max(0.0, heartbeat_at - now))
                yield b": heartbeat\n\n"
                quiet_since = time.monotonic()
                pause = max(0.0, pause - (quiet_since - now))
            await asyncio.sleep(pause)
    finally:
        left = state.streams.get(subject, 1) - 1
        if left:
            state.streams[subject] = left
        else:
            state.streams.pop(subject, None)


_PAGE_SECURITY = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATIC = {
    "/": ("chat.html", "text/html; charset=utf-8"),
    "/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/chat.css": ("chat.css", "text/css; charset=utf-8"),
}


STATIC_PATHS = tuple(_STATIC)


async def static(request: Request) -> Response:
    """The chat page and its script and style."""
    name, media_type = _STATIC[request.url.path]
    body = resources.files("stepagent.api").joinpath("static", name).read_bytes()
    return Response(body, media_type=media_type, headers=_PAGE_SECURITY)


async def not_found(request: Request, exc: Exception) -> Response:
    """An unknown route, as a JSON error."""
    return _error(404, "not_found", f"no route {request.method} {request.url.path}")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    """A route asked with the wrong method, as a JSON error."""
    return _error(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}")


def build_app(state: ApiState) -> Starlette:
    """The application over ``state``."""
    base = "/v1/threads/{thread}"
    routes = [
        Route(base + "/messages", _route(state, send_message), methods=["POST"]),
        Route(base + "/approvals", _route(state, send_approval), methods=["POST"]),
        Route(base + "/elicitations", _route(state, send_elicitation), methods=["POST"]),
        Route(base + "/events", _route(state, get_events), methods=["GET"]),
        Route(base, _route(state, get_history), methods=["GET"]),
        *(Route(path, static, methods=["GET"]) for path in _STATIC),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: method_not_allowed})
