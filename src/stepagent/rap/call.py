"""One RAP invocation as a tool server sees it (:class:`RapCall`), and what a tool function may return.

A :class:`RapCall` answers its invocation through callbacks to the invocation's ``callback_url``: the
result, subscription events, an OAuth link, a question for the user, view updates. Inside a tool function
served by :class:`~stepagent.rap.server.RapToolServer`, :func:`current_call` returns it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Protocol

from stepagent.rap.protocol import RapInvocation


class CallbackHost(Protocol):
    """What a call needs from its server: callback delivery and the table of open questions."""

    choices: dict[str, tuple[str, int, asyncio.Future[int]]]

    async def post_callback(self, url: str, body: dict[str, Any]) -> None: ...


_current: ContextVar[RapCall] = ContextVar("stepagent_rap_call")
DEFERRED: Final = object()


def current_call() -> RapCall:
    """The invocation being served (inside a tool function, or a subscription's ``run``)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_call() is only available while a RAP tool call is served") from None


@dataclass(frozen=True, slots=True)
class Result:
    """A rich result: ``content`` items (``{"type": "text"|"image", ...}``) win over ``text`` for the model;
    ``display_as`` segments are for UIs."""

    text: str | None = None
    content: list[dict[str, Any]] | None = None
    display_as: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Subscription:
    """Return this to start a subscription: ``text`` is the call's result, ``run`` sends the events."""

    text: str
    run: Callable[[RapCall], Coroutine[Any, Any, None]]


@dataclass(slots=True)
class RapCall:
    """One invocation, with the means to answer it."""

    invocation: RapInvocation
    server: CallbackHost
    base_url: str

    @property
    def id(self) -> str:
        return self.invocation.id

    @property
    def thread_id(self) -> str:
        return self.invocation.group_id

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"type": kind, "group_id": self.invocation.group_id}

    async def send_result(
        self,
        text: str | None = None,
        *,
        content: list[dict[str, Any]] | None = None,
        display_as: list[dict[str, Any]] | None = None,
        subscription: bool = False,
    ) -> None:
        body = {
            **self._envelope("tool_result"),
            "id": self.id,
            "call_id": self.invocation.call_id,
            "text": text,
        }
        if content is not None:
            body["content"] = content
        if display_as is not None:
            body["display_as"] = display_as
        if subscription:
            body["subscription"] = True
        await self.server.post_callback(self.invocation.callback_url, body)

    async def send_error(self, message: str) -> None:
        await self.send_result(f"Error: {message}")

    async def send_event(
        self, text: str, *, associative: bool = False, final: bool = False, event_id: str | None = None
    ) -> None:
        body = {**self._envelope("subscription_event"), "tool_call_id": self.id, "text": text}
        body.update(associative=associative, final=final)
        if event_id is not None:
            body["event_id"] = event_id
        await self.server.post_callback(self.invocation.callback_url, body)

    async def send_oauth(self, auth_url: str) -> None:
        body = {
            **self._envelope("oauth"),
            "id": self.id,
            "call_id": self.invocation.call_id,
            "auth_url": auth_url,
        }
        await self.server.post_callback(self.invocation.callback_url, body)

    async def send_view_update(self, view_type: str, content: dict[str, Any] | None) -> None:
        """Show the latest state of this call's work to the people watching the thread, never to the model.

        ``view_type`` names the view (``"progress"``, say) and ``content`` is its whole new state, any JSON
        object; ``None`` or ``{}`` clears it. The runtime's RAP receiver publishes it on the output queue
        as a ``view_update`` event of the thread (``view_type``, ``content``; its ``event_id`` follows the
        content, so a retried POST is one event); ``stepagent run`` only logs it. It never becomes agent
        input, needs no answer, and may be sent at any time, before or after the result, while the thread
        exists (for a thread the receiver does not know it answers 404, raised here as
        :class:`~stepagent.errors.CallbackRefusedError`)."""
        body = {**self._envelope("view_update"), "view_type": view_type, "content": content}
        await self.server.post_callback(self.invocation.callback_url, body)

    async def ask_user(self, prompt: str, choices: list[str], default: int = 0) -> int:
        """Ask the user to pick one of ``choices``; returns the chosen index (``default`` on dismissal)."""
        key = secrets.token_urlsafe(24)
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.server.choices[key] = (self.id, len(choices), answer)
        try:
            body = {
                **self._envelope("user_choice"),
                "id": self.id,
                "call_id": self.invocation.call_id,
                "prompt": prompt,
                "choices": choices,
                "default": default,
                "response_url": f"{self.base_url}/choices/{key}",
            }
            await self.server.post_callback(self.invocation.callback_url, body)
            return await answer
        finally:
            self.server.choices.pop(key, None)
