"""The seam under :class:`~stepagent.client.Client`: :class:`ClientBackend`, what a transport does for it.

:class:`~stepagent.client.Client` checks that it is open and hands every call to one backend, as an
``httpx.AsyncClient`` hands its requests to a transport; it never asks which backend it has. Two exist:
:class:`~stepagent.client.store_backend.StoreBackend` (a deployment's tables and input queue, read and
written directly: the default) and :class:`~stepagent.client.http.HttpBackend` (a deployment's HTTP API,
no AWS credentials). A backend keeps its own per-thread positions, so each ``replies`` starts where the
last ``send`` or ``replies`` of that thread left off; what a backend cannot do (the HTTP API has no
routes for choices or for a snapshot of the tree) raises :class:`ClientError` saying so.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol

from stepagent.client.watch import Cursor
from stepagent.errors import StepagentError
from stepagent.transcript import Item
from stepagent.usage import UsageReport


class ClientError(StepagentError):
    """The client could not do what was asked (no such choice, an answer the tool refused, ...)."""

    default_disposition = "fatal"


class ClientBackend(Protocol):
    """One deployment, reached one way. The methods are :class:`~stepagent.client.Client`'s, with its
    defaults filled in; the client calls them only between :meth:`open` and :meth:`close`."""

    #: The pause between two reads while following a thread (seconds), for a backend that polls.
    poll_interval: float

    async def open(self) -> None:
        """Resolve what the backend needs and open its connections."""
        ...

    async def close(self) -> None:
        """Close what :meth:`open` opened."""
        ...

    async def send(self, thread: str, text: str, metadata: Any) -> str: ...

    async def cursor(self, thread: str) -> Cursor: ...

    def replies(
        self,
        thread: str,
        after: Mapping[str, int] | None,
        *,
        partial: bool,
        follow: bool,
        timeout: float | None,
    ) -> AsyncGenerator[Item, None]: ...

    # One call that waits, with its own limit: the documented client signature.
    async def wait(self, thread: str, message_id: str, timeout: float) -> Any: ...  # noqa: ASYNC109

    async def idle(self, thread: str) -> bool: ...

    async def usage(self, thread: str) -> UsageReport | None: ...

    async def history(self, thread: str) -> list[Item]: ...

    async def approve(
        self,
        thread: str,
        tool_call_id: str,
        decision: str,
        args: dict[str, Any] | None,
        message: str | None,
        message_id: str | None,
    ) -> str: ...

    async def answer_input(
        self,
        thread: str,
        tool_call_id: str,
        action: str,
        content: dict[str, Any] | None,
        message_id: str | None,
    ) -> str: ...

    async def pending_approvals(self, thread: str) -> list[Item]: ...

    async def pending_choices(self, thread: str) -> list[Item]: ...

    async def answer_choice(self, thread: str, choice_id: str | None, selected: int | str | None) -> int: ...
