"""The synchronous client: :class:`SyncClient`, the same methods as :class:`~stepagent.client.Client`
for code without an event loop. Each client runs one private event loop in a daemon thread, behind anyio's
blocking portal (the HTTP clients and locks belong to the loop that made them); every call blocks until its
result is ready, and ``replies`` is a plain iterator."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar, TypeVarTuple

from anyio.from_thread import BlockingPortal, start_blocking_portal

from stepagent.aws.settings import Settings
from stepagent.client.api import Client
from stepagent.transcript import Item

T = TypeVar("T")
Args = TypeVarTuple("Args")


class SyncClient:
    """``with SyncClient(stack="name") as client: client.send(...)`` — see :class:`Client` for arguments."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        stack: str | None = None,
        environ: Mapping[str, str] | None = None,
        poll_interval: float = 0.25,
        api_url: str | None = None,
        token: str | None = None,
    ) -> None:
        self._client = Client(
            settings, stack=stack, environ=environ, poll_interval=poll_interval, api_url=api_url, token=token
        )
        self._portal_thread = contextlib.ExitStack()
        self._portal: BlockingPortal = self._portal_thread.enter_context(
            start_blocking_portal(name="stepagent-client")
        )
        self._closed = False

    @classmethod
    def from_stack(cls, name: str, **options: Any) -> SyncClient:
        return cls(stack=name, **options)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> SyncClient:
        return cls(environ=environ, **options)

    def _run(self, call: Callable[[*Args], Awaitable[T]], *args: *Args) -> T:
        """``await call(*args)`` on the client's loop, blocking until it is done."""
        if self._closed:
            raise RuntimeError("this SyncClient is closed")
        return self._portal.call(call, *args)

    def open(self) -> SyncClient:
        self._run(self._client.open)
        return self

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._client.close)
        finally:
            self._closed = True
            self._portal_thread.close()  # stops the portal's loop and joins its thread

    def __enter__(self) -> SyncClient:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def client(self) -> Client:
        """The asynchronous client underneath (for its settings and metrics)."""
        return self._client

    def send(self, thread: str, text: str, metadata: Any = None) -> str:
        return self._run(self._client.send, thread, text, metadata)

    def cursor(self, thread: str) -> dict[str, int]:
        return self._run(self._client.cursor, thread)

    def replies(
        self,
        thread: str,
        after: Mapping[str, int] | None = None,
        *,
        partial: bool = False,
        follow: bool = False,
        timeout: float | None = None,
    ) -> Iterator[Item]:
        items = self._client.replies(thread, after, partial=partial, follow=follow, timeout=timeout)
        try:
            while True:
                try:
                    yield self._run(items.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(items.aclose)  # type: ignore[attr-defined]

    def wait(self, thread: str, message_id: str, timeout: float = 300.0) -> Any:
        return self._run(self._client.wait, thread, message_id, timeout)

    def idle(self, thread: str) -> bool:
        return self._run(self._client.idle, thread)

    def history(self, thread: str) -> list[Item]:
        return self._run(self._client.history, thread)

    def pending_choices(self, thread: str) -> list[Item]:
        return self._run(self._client.pending_choices, thread)

    def answer_choice(
        self, thread: str, choice_id: str | None = None, selected: int | str | None = None
    ) -> int:
        return self._run(self._client.answer_choice, thread, choice_id, selected)

    def approve(
        self,
        thread: str,
        tool_call_id: str,
        decision: str = "approve",
        args: dict[str, Any] | None = None,
        message: str | None = None,
        *,
        message_id: str | None = None,
    ) -> str:
        return self._run(
            functools.partial(self._client.approve, message_id=message_id),
            thread,
            tool_call_id,
            decision,
            args,
            message,
        )

    def answer_input(
        self,
        thread: str,
        tool_call_id: str,
        action: str,
        content: dict[str, Any] | None = None,
        *,
        message_id: str | None = None,
    ) -> str:
        return self._run(
            functools.partial(self._client.answer_input, message_id=message_id),
            thread,
            tool_call_id,
            action,
            content,
        )

    def pending_approvals(self, thread: str) -> list[Item]:
        return self._run(self._client.pending_approvals, thread)
