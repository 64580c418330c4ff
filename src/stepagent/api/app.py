"""The HTTP API's application (Starlette): what a web or mobile backend calls instead of SQS and DynamoDB.

========================================  ======================================================================
``POST /v1/threads``                      ``{"text", "metadata"}`` → 201 ``{"thread_id", "message_id"}``: a new
                                          conversation under an id the server makes (unguessable; with an
                                          ``Idempotency-Key`` a retry gets the same id)
``POST /v1/threads/{thread}/messages``    ``{"text", "metadata"}`` → 202 ``{"message_id"}``; ``Idempotency-Key``
                                          is the logical message id, so a retried POST is processed once
``POST /v1/threads/{thread}/approvals``   an approval answer (``tool_call_id``, ``decision``, ``args``,
                                          ``message``) → 202 ``{"message_id"}``; ``.../elicitations``: an
                                          answer to a tool's question (``tool_call_id``, ``action``,
                                          ``content``) → 202 ``{"message_id"}``
``GET /v1/threads/{thread}``              the tree's items, as ``stepagent history --json``
``GET /v1/threads/{thread}/events``       Server-Sent Events (:mod:`stepagent.api.events`): ``Last-Event-ID``
                                          or ``?after=`` resumes, ``?follow=1`` never ends,
                                          ``?message_id=M`` streams the turn ``M`` began, then ends
``GET /v1/oauth/callback``                where an MCP server's sign-in returns the browser (``code``,
                                          ``state``; no bearer token: the single-use state authenticates
                                          it): the tokens are stored and the waiting call resumes
                                          (:mod:`stepagent.tools.mcp_oauth`); a small HTML page answers
``GET /``                                 the chat page
========================================  ======================================================================

Every ``/v1`` route authenticates the caller (:mod:`stepagent.api.auth`) and checks the thread's owner
(:mod:`stepagent.api.ownership`); what a message may say about its sender is :mod:`stepagent.api.policy`'s
decision. Before a 202 the input is checked with the worker's own rules (the message it becomes is parsed
as the worker parses it) and the thread id with SQS's ``MessageGroupId`` rule, so nothing accepted here is
dead-lettered there. Errors are ``{"error": {"code", "message"}}``: 400 ``bad_request`` (malformed JSON, a
body that breaks the input message rules, an empty message, a bad thread id, a reserved metadata key, a bad
resume token), 401 ``unauthorized``, 404 ``not_found`` (unknown, or someone else's), 413 ``too_large`` (a
body over the input message's 16 MiB, or metadata over 256 KiB), 415 ``unsupported_media_type`` (a POST
body that is not ``application/json``), 422 ``idempotency_key_reused`` (the key was used for another
request) or ``profile_not_allowed``, 429 ``too_many_requests`` (a per-subject quota of :mod:`stepagent.api.quotas`, or the
store or queue throttled us; with ``Retry-After``), 503 ``unavailable`` (the identity provider cannot be
reached; with ``Retry-After``). Every answer carries
``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stepagent.api.auth import Unauthorized, Verifier
from stepagent.api.events import BadToken, ResumeTokens, SharedReads, TreeEvents, tree_positions
from stepagent.api.idempotency import IdempotencyKeys, KeyReused, request_digest
from stepagent.api.jwks import ProviderUnavailable
from stepagent.api.keys import ApiKeys
from stepagent.api.ownership import Ownership
from stepagent.api.policy import ApiPolicy, MetadataRefused
from stepagent.api.quotas import ApiLimits, QuotaExceeded, Quotas
from stepagent.client import Client
from stepagent.errors import InputError, MalformedMessageError, PayloadTooLargeError, TransientError
from stepagent.input_rules import MAX_MESSAGE_BYTES, check_group_id, check_id, check_json, load_json
from stepagent.messages import ApprovalDecision, ElicitationAnswer, InputMessage, parse_input_message
from stepagent.stores.dynamodb.quotas import Lease, SubjectCounters
from stepagent.tools.mcp_oauth import OAuthServices, SignInError, SignInRefused, complete_sign_in
from stepagent.transcript import tree_items

#: The longest ``?message_id=`` a stream accepts (SQS's own limit on a deduplication id).
MAX_MESSAGE_ID_CHARS = 128
#: Seconds of silence after which an event stream sends a comment, so proxies keep it open.
HEARTBEAT_S = 15.0


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
    """What the application needs: an open client (stores and sender), the verifier, the deployment's
    keys (:mod:`stepagent.api.keys`; every instance must have the same: the default, random keys, suits
    one local process only) and metadata policy, shared reads, the per-subject quotas (``clock``:
    wall-clock seconds, for their windows and leases)."""

    client: Client
    verifier: Verifier
    keys: ApiKeys = field(default_factory=ApiKeys.generate)
    policy: ApiPolicy = field(default_factory=ApiPolicy)
    heartbeat_s: float = HEARTBEAT_S
    limits: ApiLimits = field(default_factory=ApiLimits)
    clock: Callable[[], float] = time.time
    #: Finishes users' sign-ins to ``"auth": "oauth"`` MCP servers (``None``: not configured here).
    oauth: OAuthServices | None = None
    reads: SharedReads = field(init=False)
    owners: Ownership = field(init=False)
    tokens: ResumeTokens = field(init=False)
    idempotency: IdempotencyKeys = field(init=False)
    quotas: Quotas = field(init=False)
    _closing: set[asyncio.Future[None]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        reader = self.client.reader
        self.reads = SharedReads(reader)
        self.owners = Ownership(
            reader.io, reader.state_table, reader.conversation, open_access=not self.authenticates
        )
        self.tokens = ResumeTokens(self.keys.resume)
        self.idempotency = IdempotencyKeys(reader.io, reader.state_table)
        self.quotas = Quotas(SubjectCounters(reader.io, reader.state_table), self.limits, self.clock)

    @property
    def authenticates(self) -> bool:
        """Whether callers prove who they are (``jwt``); without (``none``) nobody has an identity."""
        return self.verifier.settings.mode != "none"

    @property
    def limited(self) -> bool:
        """Whether quotas apply (authenticated callers; without authentication there is one local user)."""
        return self.authenticates


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


#: On every answer of the API: a JSON body is never sniffed as something else, nor kept by a cache.
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


class SecurityHeaders:
    """ASGI middleware: :data:`SECURITY_HEADERS` on every response that does not set them itself (a pure
    ASGI wrapper, so streamed answers stay streamed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.lower().encode() not in present:
                        headers.append((name.lower().encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


Handler = Callable[[Request, ApiState, str, str], Awaitable[Response]]


async def _authenticated(request: Request, state: ApiState) -> str:
    try:
        return await state.verifier.subject(request.headers.get("authorization"))
    except Unauthorized as error:
        raise ApiError(401, "unauthorized", str(error), {"WWW-Authenticate": "Bearer"}) from None
    except ProviderUnavailable as error:
        # The token may be valid: say "later", never "unauthorized" (nor why the provider failed).
        raise ApiError(
            503,
            "unavailable",
            "the identity provider cannot be reached to check the token; try again shortly",
            {"Retry-After": str(error.retry_after)},
        ) from None


def _errors(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The error mapping around one ``/v1`` endpoint."""

    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as error:
            return _error(error.status, error.code, error.message, error.headers)
        except QuotaExceeded as error:
            return _error(429, "too_many_requests", str(error), {"Retry-After": str(error.retry_after)})
        except TransientError as error:
            return _error(429, "too_many_requests", f"try again shortly: {error}", {"Retry-After": "1"})

    return answer


def _check_thread_id(thread: str) -> None:
    """The worker's id rule and SQS's ``MessageGroupId`` rule (a thread id is the group id)."""
    try:
        check_group_id(thread, "thread id")
        check_id(thread, "thread")
    except InputError as error:
        raise ApiError(400, "bad_request", str(error)) from None


def _route(state: ApiState, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Authentication, the thread id's rules and the error mapping around one ``/v1/threads/{thread}``
    handler."""

    async def endpoint(request: Request) -> Response:
        subject = await _authenticated(request, state)
        thread = request.path_params["thread"]
        _check_thread_id(thread)
        return await handler(request, state, subject, thread)

    return _errors(endpoint)


def _is_json(content_type: str | None) -> bool:
    # The media type is what comes before any parameter (``application/json; charset=utf-8``).
    return (content_type or "").partition(";")[0].strip().lower() == "application/json"


async def _body(request: Request) -> Any:
    """The request's JSON body, at most the input message's size, checked by the input message rules."""
    if not _is_json(request.headers.get("content-type")):
        raise ApiError(
            415,
            "unsupported_media_type",
            "the request body must be JSON, sent with 'Content-Type: application/json'",
        )
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


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    try:
        if not key.strip():
            raise MalformedMessageError("the Idempotency-Key header is empty")
        check_id(key, "Idempotency-Key")
    except InputError as error:
        raise ApiError(400, "bad_request", str(error)) from None
    return key


def _as_the_worker_reads_it(message: InputMessage) -> None:
    """Parse ``message`` as the worker will: what it would dead-letter is refused here instead."""
    try:
        parse_input_message(message.model_dump())
    except PayloadTooLargeError as error:
        raise ApiError(413, "too_large", str(error)) from None
    except MalformedMessageError as error:
        raise ApiError(400, "bad_request", str(error)) from None


async def _claim(state: ApiState, thread: str, subject: str) -> None:
    if not await state.owners.claim(thread, subject):
        raise ApiError(404, "not_found", f"no thread {thread!r}")


async def _readable(state: ApiState, thread: str, subject: str) -> None:
    if not await state.owners.may_read(thread, subject):
        raise ApiError(404, "not_found", f"no thread {thread!r}")


async def _same_request(state: ApiState, thread: str, key: str | None, route: str, body: Any) -> None:
    """Record what ``key`` means in ``thread`` (422 if it meant another request)."""
    if key is None:
        return
    try:
        await state.idempotency.use(thread, key, request_digest(route, body))
    except KeyReused as error:
        raise ApiError(422, "idempotency_key_reused", str(error)) from None


async def _send_text(
    request: Request, state: ApiState, subject: str, thread: str, *, new_thread: bool | None, route: str
) -> str:
    """Check, claim and send one user message to ``thread`` (``new_thread``: whether the store lacks it,
    ``None``: read it if it matters); its message id."""
    raw = await _body(request)
    body = _parse(MessageBody, raw)
    if not body.text.strip():
        raise ApiError(
            400, "bad_request", "the message is empty: 'text' needs at least one visible character"
        )
    key = _idempotency_key(request)
    message_id = key or str(uuid.uuid4())
    if new_thread is None and body.metadata is None and state.authenticates:
        new_thread = await state.client.conversation.get_thread(thread) is None
    try:
        metadata = state.policy.metadata(
            body.metadata, subject if state.authenticates else None, new_thread=bool(new_thread)
        )
    except MetadataRefused as error:
        raise ApiError(error.status, error.code, error.message) from None
    message = InputMessage.user_text(thread, body.text, id=message_id, metadata=metadata)
    _as_the_worker_reads_it(message)
    if state.limited:
        # A new conversation is one nobody owns yet (a minted id always is), whether or not the worker has
        # stored the thread already.
        unclaimed = route == "threads" or await state.owners.unclaimed(thread, subject)
        await state.quotas.message(subject, new_thread=unclaimed)
    await _claim(state, thread, subject)
    await _same_request(state, thread, key, route, raw)
    await state.client.sender.send(message, message_id)
    state.reads.expect(thread)  # this process's streams of the tree poll at the busy pace until it starts
    return message_id


async def send_message(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """Put the user's message on the input queue (once per ``Idempotency-Key``)."""
    message_id = await _send_text(request, state, subject, thread, new_thread=None, route="messages")
    return JSONResponse({"message_id": message_id}, 202)


def _new_thread_id(state: ApiState, subject: str, key: str | None) -> str:
    """An id nobody can guess: random, or — for an ``Idempotency-Key`` — the HMAC of the subject and the
    key under the deployment's key, so a retry names the same thread and another user's key another."""
    if key is None:
        return "t-" + secrets.token_urlsafe(24)
    digest = hmac.new(state.keys.thread_ids, f"{subject}\x00{key}".encode(), hashlib.sha256).digest()
    return "t-" + base64.urlsafe_b64encode(digest[:24]).decode()


def _threads_route(state: ApiState) -> Callable[[Request], Awaitable[Response]]:
    async def create_thread(request: Request) -> Response:
        """Start a conversation under a thread id the server makes."""
        subject = await _authenticated(request, state)
        thread = _new_thread_id(state, subject, _idempotency_key(request))
        message_id = await _send_text(request, state, subject, thread, new_thread=True, route="threads")
        return JSONResponse({"thread_id": thread, "message_id": message_id}, 201)

    return _errors(create_thread)


async def send_approval(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """Send a person's decision on a waiting tool call as an input message."""
    raw = await _body(request)
    body = _parse(ApprovalBody, raw)
    key = _idempotency_key(request)
    message_id = key or str(uuid.uuid4())
    _as_the_worker_reads_it(
        InputMessage.approval(
            thread, body.tool_call_id, body.decision, args=body.args, message=body.message, id=message_id
        )
    )
    await _readable(state, thread, subject)
    await _same_request(state, thread, key, "approvals", raw)
    if state.limited:
        await state.quotas.message(subject, new_thread=False)
    # The client routes the decision to whichever thread of the tree waits on the call (a child's, too).
    await state.client.approve(
        thread, body.tool_call_id, body.decision, body.args, body.message, message_id=message_id
    )
    state.reads.expect(thread)
    return JSONResponse({"message_id": message_id}, 202)


async def send_elicitation(request: Request, state: ApiState, subject: str, thread: str) -> Response:
    """Send a person's answer to a tool's question (``input_required``) as an input message."""
    raw = await _body(request)
    body = _parse(ElicitationBody, raw)
    key = _idempotency_key(request)
    message_id = key or str(uuid.uuid4())
    _as_the_worker_reads_it(
        InputMessage.elicitation(thread, body.tool_call_id, body.action, body.content, id=message_id)
    )
    await _readable(state, thread, subject)
    await _same_request(state, thread, key, "elicitations", raw)
    if state.limited:
        await state.quotas.message(subject, new_thread=False)
    await state.client.answer_input(
        thread, body.tool_call_id, body.action, body.content, message_id=message_id
    )
    state.reads.expect(thread)
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
        positions = state.tokens.decode(token, thread) if token else None
    except BadToken as error:
        raise ApiError(400, "bad_request", str(error)) from None
    await _readable(state, thread, subject)
    if positions is not None:
        positions = await tree_positions(state.reads.reader, thread, positions)
    message_id = request.query_params.get("message_id") or None
    if message_id is not None and len(message_id) > MAX_MESSAGE_ID_CHARS:
        raise ApiError(400, "bad_request", f"message_id is longer than {MAX_MESSAGE_ID_CHARS} characters")
    # One lease per open stream, counted across every instance of the API (a 429 over the limit).
    lease = await state.quotas.open_stream(subject) if state.limited else None
    tree = TreeEvents(
        state.reads, thread, positions, tokens=state.tokens, follow=follow, message_id=message_id
    )
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        _sse(state, lease, tree), media_type="text/event-stream; charset=utf-8", headers=headers
    )


async def _sse(state: ApiState, lease: Lease | None, tree: TreeEvents) -> AsyncIterator[bytes]:
    """The stream: events as they are found, a heartbeat comment after each quiet ``heartbeat_s``; it
    renews its lease as it goes and ends if the lease was lost (the client resumes with its token)."""
    try:
        yield b": stepagent events\nretry: 1000\n\n"
        quiet_since = time.monotonic()
        while True:
            if lease is not None:
                lease = await _renewed(state, lease)
                if lease is None:
                    return
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
        if lease is not None:
            # The stream may be ending by cancellation (the client left): free the slot in a task of its own.
            closing = asyncio.ensure_future(state.quotas.close_stream(lease))
            state._closing.add(closing)
            closing.add_done_callback(state._closing.discard)


async def _renewed(state: ApiState, lease: Lease) -> Lease | None:
    """``lease`` kept alive; ``None`` once it is lost (or has run out while the store could not be reached)."""
    try:
        return await state.quotas.keep(lease)
    except TransientError:
        return lease if state.clock() < lease.expires else None


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


_SIGN_IN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>
<body><p>{text}</p></body></html>
"""


def _sign_in_page(status: int, text: str) -> Response:
    import html

    body = _SIGN_IN_PAGE.format(title="Sign-in", text=html.escape(text))
    return Response(body, status, media_type="text/html; charset=utf-8", headers=_PAGE_SECURITY)


def _oauth_route(state: ApiState) -> Callable[[Request], Awaitable[Response]]:
    async def oauth_callback(request: Request) -> Response:
        """The browser's return from an MCP server's sign-in: tokens stored, the waiting call resumed."""
        if state.oauth is None:
            return _sign_in_page(404, "Sign-ins to MCP servers are not configured on this deployment.")
        query = request.query_params
        try:
            server, signed_in = await complete_sign_in(
                state.oauth,
                query.get("state"),
                query.get("code"),
                query.get("error"),
                state.client.sender.send,
            )
        except SignInRefused as error:
            return _sign_in_page(400, f"Sign-in failed: {error}.")
        except SignInError as error:
            return _sign_in_page(502, f"Sign-in failed: {error}.")
        except TransientError:
            return _sign_in_page(
                503, "Sign-in could not be completed just now; reload this page to try again."
            )
        if signed_in:
            return _sign_in_page(200, f"Signed in to {server}. You can close this tab.")
        return _sign_in_page(200, f"You declined to sign in to {server}. You can close this tab.")

    return oauth_callback


def build_app(state: ApiState) -> Starlette:
    """The application over ``state``."""
    base = "/v1/threads/{thread}"
    routes = [
        Route("/v1/threads", _threads_route(state), methods=["POST"]),
        Route(base + "/messages", _route(state, send_message), methods=["POST"]),
        Route(base + "/approvals", _route(state, send_approval), methods=["POST"]),
        Route(base + "/elicitations", _route(state, send_elicitation), methods=["POST"]),
        Route(base + "/events", _route(state, get_events), methods=["GET"]),
        Route(base, _route(state, get_history), methods=["GET"]),
        Route("/v1/oauth/callback", _oauth_route(state), methods=["GET"]),
        *(Route(path, static, methods=["GET"]) for path in _STATIC),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: method_not_allowed},
        middleware=[Middleware(SecurityHeaders)],
    )
