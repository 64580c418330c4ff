"""The RAP callback receiver, as pure functions: an HTTP request in, a response plus what to enqueue out.

Nothing here does I/O. :func:`receive_callback` (and :func:`receive_function_url_event` for the Lambda
Function URL event shape) returns a :class:`ReceiverResult`: the HTTP status and JSON body to answer
with, the :class:`OutgoingInput` messages to put on the input queue (``sender.send(message, dedup_id)``)
and the :class:`ViewUpdate` s to publish as output events. The caller answers with the result's status
only after every send succeeded, and with 500 ``{"error": "Internal error"}`` otherwise, so the tool
retries and nothing is lost.

Guarantees:

- Authentication: every callback must carry ``?token=`` (see :mod:`stepagent.rap.tokens`) valid for the
  callback's ``group_id``, and — except ``view_update``, which names no call — issued for the call it
  names (``id``, or ``tool_call_id`` for events). Missing token → 401; a token for another thread or
  another call → 403. The body is parsed only after the token is seen, and the MAC is checked before
  anything is converted.
- Callback URLs expire for what must answer a waiting call: a ``tool_result``, ``oauth`` or
  ``user_choice`` whose token's expiry (:mod:`stepagent.rap.tokens`) has passed → 403. The same three
  carry :attr:`ReceiverResult.pending` (thread, call): the caller refuses them with 409 when that call is
  already answered (:func:`~stepagent.rap.receiver_app.deliver`), so a replayed callback can no longer
  put a stale sign-in link or question in front of the user. ``subscription_event`` (many per call, for
  as long as the subscription runs) and ``view_update`` are held to neither.
- Rejections are 4xx with a JSON ``{"error": "..."}`` built by ``json.dumps`` (never string formatting):
  405 for a method other than POST, 413 for a body over :data:`MAX_BODY_BYTES` (Lambda's 6 MB request
  limit), 400 for a missing, undecodable, non-JSON or schema-violating body (naming the field), and for
  one that breaks a rule of :mod:`stepagent.input_rules` (nesting, lone surrogates, ids): a body the worker
  would reject is never enqueued, and a deterministic problem is never a 5xx (which tells the tool to
  retry forever) or an exception (a 502 from Lambda).
- Conversion is the reference's ``prepare_callback``: a ``tool_result`` keeps its ``content`` items when
  there are any, else one text item from ``text`` (empty when both are absent); ``display_as`` and
  ``subscription`` pass through; an image keeps its data, and a ``mediaType`` the models do not know is
  dropped. A ``subscription_event`` becomes a tool result for the subscribe call with a synthetic
  ``subscription_event`` (``associative``/``final`` copied). ``oauth`` and ``user_choice`` become the
  notice contents. ``view_update`` never becomes agent input: it is an output event.
- Dedup ids are stable, so a tool's retried POST is one message: ``rap-tool-result-{id}``,
  ``rap-oauth-{id}``, ``rap-user-choice-{id}``. The reference gives each event a random id, so a retried
  event is delivered twice; here an event's id is ``rap-event-{call}-{event_id}`` when the tool names the
  event, else ``rap-event-{sha256 of (thread, call, text, associative, final)}``. Consequence: a tool that
  sends two events with identical text and flags for one subscription must tell them apart, by
  ``event_id`` or by putting a sequence number or timestamp in the text (it SHOULD be JSON anyway).
- Large results are passed on whole; the sender claim-checks bodies over the queue limit.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from pydantic import ValidationError

from stepagent.errors import InputError, classify
from stepagent.ids import derived_id
from stepagent.input_rules import check_json, load_json
from stepagent.messages import (
    ImageBlock,
    InputMessage,
    OAuthRequired,
    SubscriptionEvent,
    TextBlock,
    ToolResult,
    UserChoiceRequired,
    check_input_fields,
)
from stepagent.rap.function_url import FunctionUrlEvent, FunctionUrlResponse
from stepagent.rap.protocol import (
    CALLBACK_ADAPTER,
    IMAGE_MEDIA_TYPES,
    ImageItem,
    OAuthCallback,
    RapCallback,
    SubscriptionEventCallback,
    TextItem,
    ToolResultCallback,
    UserChoiceCallback,
    ViewUpdateCallback,
    describe_validation_error,
)
from stepagent.rap.tokens import verify_token


class ReceiverBody(TypedDict, total=False):
    """The JSON a callback is answered with: ``{"ok": true}``, or ``{"error": message}``."""

    ok: bool
    error: str


#: Lambda Function URLs accept request payloads up to 6 MB; larger bodies are refused the same way here.
MAX_BODY_BYTES = 6 * 1024 * 1024
OK_BODY: ReceiverBody = {"ok": True}
log = logging.getLogger(__name__)

INTERNAL_ERROR_BODY: ReceiverBody = {"error": "Internal error"}


@dataclass(frozen=True, slots=True)
class OutgoingInput:
    """A message for the input queue and its deterministic dedup id."""

    message: InputMessage
    dedup_id: str


@dataclass(frozen=True, slots=True)
class ViewUpdate:
    """The latest content of one view of a thread (``content`` ``None`` or ``{}``: clear the view)."""

    thread_id: str
    view_type: str
    content: dict[str, Any] | None

    def output_event(self) -> ViewUpdateOutput:
        """The output-queue event (the publisher adds ``thread_id``, ``root_thread_id`` and ``metadata``).
        ``event_id`` depends on the content, so a retried POST is one event and a new state is another."""
        digest = hashlib.sha256(_canonical(self.content).encode()).hexdigest()
        return {
            "type": "view_update",
            "event_id": derived_id("rap-view", self.thread_id, self.view_type, digest),
            "view_type": self.view_type,
            "content": self.content,
        }


class ViewUpdateOutput(TypedDict):
    """The ``view_update`` output event: a tool's live view of its work (``content`` is the tool's JSON)."""

    type: Literal["view_update"]
    event_id: str
    view_type: str
    content: Any


@dataclass(frozen=True, slots=True)
class ReceiverResult:
    """What to answer a callback with (``status`` and JSON ``body``), and what to enqueue and publish once
    that is done."""

    status: int
    body: ReceiverBody
    messages: tuple[OutgoingInput, ...] = ()
    views: tuple[ViewUpdate, ...] = field(default=())
    #: (thread, tool call) that must still be waiting for an answer for the messages to be sent.
    pending: tuple[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    def body_json(self) -> str:
        return json.dumps(self.body, ensure_ascii=False, separators=(",", ":"))


def reject(status: int, message: str) -> ReceiverResult:
    """A refusal: ``status`` with ``{"error": message}`` and nothing to send."""
    return ReceiverResult(status, {"error": message})


def _canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


# ----------------------------------------------------------------------------------------------------------
# Conversion (the reference's prepare_callback)


def _block(item: TextItem | ImageItem) -> TextBlock | ImageBlock:
    if isinstance(item, TextItem):
        return TextBlock(text=item.text)
    media_type = item.media_type if item.media_type in IMAGE_MEDIA_TYPES else None
    return ImageBlock(data=item.data, media_type=media_type)


def event_dedup_id(callback: SubscriptionEventCallback) -> str:
    """The dedup id of a subscription event: from the tool's ``event_id`` when it gives one, else a hash of
    the event's thread, call, text and flags."""
    if callback.event_id is not None:
        return f"rap-event-{callback.tool_call_id}-{callback.event_id}"
    identity = [callback.group_id, callback.tool_call_id, callback.text, callback.associative, callback.final]
    return f"rap-event-{hashlib.sha256(_canonical(identity).encode()).hexdigest()}"


def convert_callback(callback: RapCallback) -> OutgoingInput | ViewUpdate:
    """One validated callback as input-queue message (with its dedup id) or view update."""
    if isinstance(callback, ToolResultCallback):
        blocks = [_block(item) for item in callback.content or []]
        result = ToolResult(
            id=callback.id,
            call_id=callback.call_id,
            content=blocks or [TextBlock(text=callback.text or "")],
        )
        message = InputMessage(
            content=result,
            group_id=callback.group_id,
            display_as=callback.display_as,
            subscription=callback.subscription,
        )
        return OutgoingInput(message, f"rap-tool-result-{callback.id}")
    if isinstance(callback, SubscriptionEventCallback):
        message = InputMessage(
            content=ToolResult.text(callback.tool_call_id, callback.text),
            group_id=callback.group_id,
            synthetic=SubscriptionEvent(
                tool_call_id=callback.tool_call_id, associative=callback.associative, final=callback.final
            ),
        )
        return OutgoingInput(message, event_dedup_id(callback))
    if isinstance(callback, OAuthCallback):
        notice = OAuthRequired(id=callback.id, call_id=callback.call_id, auth_url=callback.auth_url)
        return OutgoingInput(
            InputMessage(content=notice, group_id=callback.group_id), f"rap-oauth-{callback.id}"
        )
    if isinstance(callback, UserChoiceCallback):
        choice = UserChoiceRequired(
            id=callback.id,
            call_id=callback.call_id,
            prompt=callback.prompt,
            choices=callback.choices,
            default=callback.default,
            response_url=callback.response_url,
        )
        message = InputMessage(content=choice, group_id=callback.group_id)
        return OutgoingInput(message, f"rap-user-choice-{callback.id}")
    return ViewUpdate(callback.group_id, callback.view_type, callback.content)


def _named_call(callback: RapCallback) -> str | None:
    if isinstance(callback, SubscriptionEventCallback):
        return callback.tool_call_id
    if isinstance(callback, ViewUpdateCallback):
        return None
    return callback.id


# ----------------------------------------------------------------------------------------------------------
# Requests


def receive_callback(
    body: bytes | str | None,
    token: str | None,
    secret: str,
    *,
    method: str = "POST",
    max_bytes: int = MAX_BODY_BYTES,
    now: float | None = None,
) -> ReceiverResult:
    """Authenticate, validate and convert one callback request (``now``: Unix seconds, for the token's
    expiry). Never raises: an error the tree classifies as bad input (:func:`~stepagent.errors.classify`)
    is a 400, any other a 500 (the server retries)."""
    try:
        when = time.time() if now is None else now
        return _receive_callback(body, token, secret, method=method, max_bytes=max_bytes, now=when)
    except Exception as exc:
        if classify(exc) == "reject":
            return reject(400, f"the callback cannot be processed: {type(exc).__name__}: {exc}")
        log.exception("RAP callback failed unexpectedly")
        return ReceiverResult(500, INTERNAL_ERROR_BODY)


def _receive_callback(
    body: bytes | str | None,
    token: str | None,
    secret: str,
    *,
    method: str,
    max_bytes: int,
    now: float,
) -> ReceiverResult:
    if method.upper() != "POST":
        return reject(405, f"method {method.upper()} is not allowed; RAP callbacks are POSTed")
    raw = body.encode() if isinstance(body, str) else body
    if raw is not None and len(raw) > max_bytes:
        return reject(413, f"the callback body is {len(raw)} bytes, over the {max_bytes}-byte limit")
    if not token:
        return reject(401, "missing callback token (the callback URL's 'token' query parameter)")
    if not raw:
        return reject(400, "the request has no body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return reject(400, "the body is not valid UTF-8")
    try:
        data = load_json(text, "callback body")
        if isinstance(data, dict):
            check_json(data, "callback")
    except InputError as exc:
        return reject(400, str(exc))
    if not isinstance(data, dict):
        return reject(400, "the body must be a JSON object")
    try:
        callback = CALLBACK_ADAPTER.validate_python(data)
    except ValidationError as exc:
        if data.get("type") not in (
            "tool_result",
            "subscription_event",
            "oauth",
            "user_choice",
            "view_update",
        ):
            return reject(400, f"unknown callback type {data.get('type')!r}")
        return reject(400, f"invalid {data['type']} callback: {describe_validation_error(exc)}")
    refused = _refusal(callback, token, secret, now)
    if refused is not None:
        return refused
    converted = convert_callback(callback)
    if isinstance(converted, ViewUpdate):
        return ReceiverResult(200, OK_BODY, views=(converted,))
    try:
        check_input_fields(converted.message)  # the worker's rules: what is enqueued will be accepted
    except InputError as exc:
        return reject(400, str(exc))
    named = _named_call(callback)
    pending = (callback.group_id, named) if named is not None and _answers_call(callback) else None
    return ReceiverResult(200, OK_BODY, messages=(converted,), pending=pending)


def _answers_call(callback: RapCallback) -> bool:
    """Whether ``callback`` is for a call still waiting (its result, or a sign-in or question on the way)."""
    return isinstance(callback, ToolResultCallback | OAuthCallback | UserChoiceCallback)


def _refusal(callback: RapCallback, token: str | None, secret: str, now: float) -> ReceiverResult | None:
    """Why ``token`` does not authorise ``callback`` (403), or ``None`` when it does."""
    grant = verify_token(secret, callback.group_id, token)
    if grant is None:
        return reject(403, f"the callback token is not valid for thread {callback.group_id!r}")
    named = _named_call(callback)
    if named is not None and named != grant.tool_call_id:
        return reject(403, f"the callback token was not issued for tool call {named!r}")
    if _answers_call(callback) and grant.expired(now):
        return reject(403, f"the callback URL of tool call {named!r} has expired")
    return None


def receive_function_url_event(
    event: FunctionUrlEvent, secret: str, *, max_bytes: int = MAX_BODY_BYTES, now: float | None = None
) -> ReceiverResult:
    """:func:`receive_callback` for a Lambda Function URL (payload format 2.0) event."""
    context = event.get("requestContext")
    http = context.get("http") if isinstance(context, Mapping) else None
    method = http.get("method") if isinstance(http, Mapping) else None
    method = str(method or event.get("httpMethod") or "POST")
    query = event.get("queryStringParameters") or {}
    token = query.get("token") if isinstance(query, Mapping) else None
    if token is not None and not isinstance(token, str):
        token = None  # not a token: the callback is refused as unauthenticated
    body = event.get("body")
    if body is not None and not isinstance(body, str):
        return reject(400, "the request body must be a string")
    if body is not None and event.get("isBase64Encoded"):
        # Base64 grows data by 4/3: refuse an oversized body before decoding it.
        if len(body) > max_bytes * 4 // 3 + 4:
            return reject(413, f"the callback body is over the {max_bytes}-byte limit")
        try:
            decoded: bytes | None = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return reject(400, "the body is flagged base64 but is not valid base64")
    else:
        decoded = body.encode() if body is not None else None
    return receive_callback(decoded, token, secret, method=method, max_bytes=max_bytes, now=now)


def function_url_response(result: ReceiverResult) -> FunctionUrlResponse:
    """The Lambda Function URL response for ``result``."""
    return {
        "statusCode": result.status,
        "headers": {"content-type": "application/json"},
        "body": result.body_json(),
    }
