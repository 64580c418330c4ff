"""The client's backend over a deployment's HTTP API (``Client(api_url=..., token=...)``): no AWS credentials
needed.

Sends, approvals and the history are the API's JSON routes; :meth:`HttpBackend.replies` reads the event stream
and turns its events into the client's items (``assistant``, ``tool_call``, ``tool_result``, ``event``,
``error``, and ``partial`` for live text), ending when the stream does (after the root's
``turn_complete``). Per thread it keeps the stream's resume token, so each :meth:`replies` starts where
the last one (or, for a first :meth:`send`, the conversation as it was just before it) left off, and a
dropped connection is resumed with ``Last-Event-ID`` — nothing lost, nothing repeated. An error answer
raises :class:`ApiRequestError` with the API's message. The API has no routes for the tree's snapshot,
idleness, pending approvals or choices, nor for usage totals (its stream carries each turn's ``usage``):
:meth:`HttpBackend.usage` is ``None`` and the others raise :class:`~stepagent.client.backend.ClientError`
saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Literal, NotRequired, TypedDict, cast, get_args
from urllib.parse import quote

import httpx

from stepagent.backoff import Backoff
from stepagent.client.backend import ClientError
from stepagent.client.watch import Cursor
from stepagent.errors import StepagentError
from stepagent.history_items import ApprovalState
from stepagent.messages import ApprovalDecisionKind
from stepagent.transcript import Item, ItemKind
from stepagent.usage import UsageReport

#: A dropped event stream is reopened (from the last event id) after a jittered wait of 0.4 s, doubling up
#: to 5 s; six connection failures in a row end it.
RECONNECT_BACKOFF = Backoff(attempts=6, base=0.4, cap=5.0)

_KINDS: dict[str, Literal["assistant", "tool_call", "tool_result", "event"]] = {
    "text": "assistant",
    "tool_call": "tool_call",
    "tool_result": "tool_result",
    "event": "event",
}


class ApiRequestError(StepagentError):
    """The HTTP API refused a request (its status, code and message)."""

    default_disposition = "fatal"

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status} {code})")
        self.status, self.code = status, code


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:200]
    raise ApiRequestError(response.status_code, code, message)


def item_of(event: Mapping[str, Any]) -> Item | None:
    """The client item for one stream event (``None`` for those it does not report). The event's values
    are taken as the API sent them: its stream carries the runtime's output events (the types of
    :mod:`stepagent.outputs.events`, plus ``thread_id``) and its own ``text_delta``."""
    kind = event.get("type")
    thread = str(event.get("thread_id", ""))
    if kind in _KINDS:
        item: Item = {"thread_id": thread, "kind": _KINDS[str(kind)]}
        # Each value is kept only when it has its type (a value that does not is left out, not passed on).
        text, name, args, call_id = (event.get(key) for key in ("text", "name", "args", "tool_call_id"))
        if isinstance(text, str):
            item["text"] = text
        if isinstance(name, str):
            item["name"] = name
        if isinstance(args, dict):
            item["args"] = args
        if isinstance(call_id, str):
            item["tool_call_id"] = call_id
        return item
    if kind == "error":
        return {
            "thread_id": thread,
            "kind": "error",
            "text": str(event.get("message", "")),
            "retrying": bool(event.get("retrying")),
        }
    if kind == "approval":
        return _decision_item(thread, event)
    if kind == "text_delta":
        return {"thread_id": thread, "kind": "partial", "delta": str(event.get("text", ""))}
    if kind == "oauth_required":
        link, call_id = event.get("auth_url"), event.get("tool_call_id")
        signin: Item = {
            "thread_id": thread,
            "kind": "oauth",
            "auth_url": link if isinstance(link, str) else "",
        }
        if isinstance(call_id, str):
            signin["tool_call_id"] = call_id
        return signin
    if kind == "input_required":
        asked: Item = {"thread_id": thread, "kind": "input", "text": str(event.get("message", ""))}
        call_id, schema, url = (event.get(key) for key in ("tool_call_id", "requested_schema", "url"))
        if isinstance(call_id, str):
            asked["tool_call_id"] = call_id
        if isinstance(schema, dict):
            asked["requested_schema"] = schema
        if isinstance(url, str):
            asked["url"] = url
        return asked
    return None


def _decision_item(thread: str, event: Mapping[str, Any]) -> Item | None:
    """The ``approval`` item of a decision event, as the stores' replies give it."""
    call_id, decision, state = event.get("tool_call_id"), event.get("decision"), event.get("approval")
    if not isinstance(call_id, str) or decision not in _DECISIONS or state not in _STATES:
        return None
    item: Item = {
        "thread_id": thread,
        "kind": "approval",
        "tool_call_id": call_id,
        # Both checked above against their literal types.
        "decision": cast(ApprovalDecisionKind, decision),
        "approval": cast(ApprovalState, state),
    }
    args, message = event.get("args"), event.get("message")
    if isinstance(args, dict):
        item["args"] = args
    if isinstance(message, str):
        item["text"] = message
    return item


_DECISIONS = frozenset(get_args(ApprovalDecisionKind))
_STATES = frozenset(get_args(ApprovalState))
_ITEM_KINDS = frozenset(get_args(ItemKind))


def _is_item(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("thread_id"), str)
        and value.get("kind") in _ITEM_KINDS
    )


class _ApprovalBody(TypedDict):
    """The body of ``POST /v1/threads/{thread}/approvals``."""

    tool_call_id: str
    decision: str
    args: NotRequired[dict[str, Any]]
    message: NotRequired[str]


class HttpBackend:
    """One API base URL and bearer token (see the module docstring)."""

    def __init__(
        self,
        api_url: str,
        token: str | None,
        http: httpx.AsyncClient | None = None,
        *,
        poll_interval: float = 0.25,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.AsyncClient(base_url=api_url.rstrip("/"), headers=headers, timeout=30)
        self._owns = http is None
        self.tokens: dict[str, str | None] = {}
        #: Kept for the client's attribute; the API's stream pushes its events, nothing is polled.
        self.poll_interval = poll_interval

    async def open(self) -> None:
        """Nothing to resolve: the HTTP client opens its connections on the first request."""

    async def close(self) -> None:
        if self._owns:
            await self.http.aclose()

    @staticmethod
    def _path(thread: str, suffix: str = "") -> str:
        return f"/v1/threads/{quote(thread, safe='')}{suffix}"

    async def send(self, thread: str, text: str, metadata: Any = None, message_id: str | None = None) -> str:
        if thread not in self.tokens:
            self.tokens[thread] = await self._position(thread)
        key = message_id or str(uuid.uuid4())
        response = await self.http.post(
            self._path(thread, "/messages"),
            json={"text": text, "metadata": metadata},
            headers={"Idempotency-Key": key},
        )
        _raise_for(response)
        return str(response.json()["message_id"])

    async def approve(
        self,
        thread: str,
        tool_call_id: str,
        decision: str = "approve",
        args: dict[str, Any] | None = None,
        message: str | None = None,
        message_id: str | None = None,
    ) -> str:
        body: _ApprovalBody = {"tool_call_id": tool_call_id, "decision": decision}
        if args is not None:
            body["args"] = args
        if message is not None:
            body["message"] = message
        return await self._answer(
            thread, "/approvals", body, message_id or f"approval-{tool_call_id}-{uuid.uuid4()}"
        )

    async def answer_input(
        self,
        thread: str,
        tool_call_id: str,
        action: str,
        content: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        body: dict[str, Any] = {"tool_call_id": tool_call_id, "action": action}
        if content is not None:
            body["content"] = content
        key = message_id or f"elicitation-{tool_call_id}-{uuid.uuid4()}"
        return await self._answer(thread, "/elicitations", body, key)

    async def _answer(self, thread: str, route: str, body: Mapping[str, Any], key: str) -> str:
        """POST a person's answer to a waiting call (``route``: ``/approvals`` or ``/elicitations``) once
        per idempotency ``key``; the message id the API gave it."""
        response = await self.http.post(
            self._path(thread, route), json=dict(body), headers={"Idempotency-Key": key}
        )
        _raise_for(response)
        return str(response.json()["message_id"])

    async def history(self, thread: str) -> list[Item]:
        response = await self.http.get(self._path(thread))
        _raise_for(response)
        items = response.json()
        if not isinstance(items, list) or not all(map(_is_item, items)):
            raise ApiRequestError(
                response.status_code,
                "bad_response",
                "the API's history is not a JSON list of items (each with a thread_id and a known kind)",
            )
        # Each item's thread_id and kind are checked; its other keys are the API's own transcript, built as
        # ``stepagent history --json`` builds it (the same Item type).
        return cast(list[Item], items)

    async def _position(self, thread: str) -> str | None:
        """The resume token of the conversation as it is now (``None``: it does not exist yet)."""
        last: str | None = None
        try:
            async for token, _ in self._events(thread, None, follow=False):
                last = token
        except ApiRequestError as error:
            if error.status == 404:
                return None
            raise
        return last

    async def replies(
        self,
        thread: str,
        after: Mapping[str, int] | None = None,
        *,
        partial: bool = False,
        follow: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the public replies() signature
    ) -> AsyncGenerator[Item, None]:
        """New items of the tree until the stream ends (see the module docstring); the stream's own resume
        token is the position, so ``after`` does not apply. ``TimeoutError`` after ``timeout`` seconds."""
        events = self._events(thread, self.tokens.get(thread), follow=follow)
        # Closed with this iterator, so a caller that stops reading lets the connection go at once.
        async with asyncio.timeout(timeout), contextlib.aclosing(events):
            async for token, event in events:
                self.tokens[thread] = token
                item = item_of(event)
                if item is not None and (partial or item["kind"] != "partial"):
                    yield item

    async def wait(
        self,
        thread: str,
        message_id: str | None = None,
        timeout: float = 300.0,  # noqa: ASYNC109 - the public wait() signature
    ) -> Any:
        """Follow the stream until it ends; the structured output of the root's last ``turn_complete``
        (``None`` without an output schema). With ``message_id``: the stream of the turn that message
        began (``?message_id=``, waiting for it if the worker has not taken it yet), which ends with that
        turn; without it, from this client's last position until the root's turn is complete."""
        output: Any = None
        after = None if message_id is not None else self.tokens.get(thread)
        async with asyncio.timeout(timeout):
            async for token, event in self._events(thread, after, follow=False, message_id=message_id):
                if message_id is None:
                    self.tokens[thread] = token
                if event.get("type") == "turn_complete" and event.get("thread_id") == thread:
                    output = event.get("output")
        return output

    async def usage(self, thread: str) -> UsageReport | None:
        """``None``: the API has no usage route (its stream carries each turn's ``usage`` instead)."""
        return None

    async def cursor(self, thread: str) -> Cursor:
        raise _not_over_http("cursor()", "the stream's resume token is the position")

    async def idle(self, thread: str) -> bool:
        raise _not_over_http("idle()", "wait() returns when the turn is over")

    async def pending_approvals(self, thread: str) -> list[Item]:
        raise _not_over_http("pending_approvals()", "replies() shows each call waiting for a decision")

    async def pending_choices(self, thread: str) -> list[Item]:
        raise _not_over_http("pending_choices()", "a client with the deployment's settings answers choices")

    async def answer_choice(self, thread: str, choice_id: str | None, selected: int | str | None) -> int:
        raise _not_over_http("answer_choice()", "a client with the deployment's settings answers choices")

    async def _events(
        self, thread: str, after: str | None, *, follow: bool, message_id: str | None = None
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """``(token, event)`` of the stream; a dropped connection is resumed from the last token."""
        params = {"follow": "1"} if follow else {}
        if message_id is not None:
            params["message_id"] = message_id
        failures = 0
        while True:
            headers = {"Last-Event-ID": after} if after else {}
            try:
                async with self.http.stream(
                    "GET", self._path(thread, "/events"), params=params, headers=headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        _raise_for(response)
                    async for token, event in _parse(response):
                        after = token
                        failures = 0
                        yield token, event
                return
            except (httpx.TransportError, httpx.RemoteProtocolError):
                failures += 1
                delay = RECONNECT_BACKOFF.delay(failures)
                if not RECONNECT_BACKOFF.allows(failures, delay):
                    raise
                await asyncio.sleep(delay)


async def _parse(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    event_id: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data and event_id is not None:
                yield event_id, json.loads("\n".join(data))
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def _not_over_http(method: str, instead: str) -> ClientError:
    return ClientError(f"{method} is not available over the HTTP API (api_url): {instead}")
