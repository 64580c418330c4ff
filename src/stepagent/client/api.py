"""The asynchronous client: :class:`Client`. See :mod:`stepagent.client` for the guarantees.

:class:`Client` checks its arguments and that it is open, then hands each call to its backend
(:mod:`stepagent.client.backend`): the deployment's stores and queue, or its HTTP API with ``api_url``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from stepagent.aws.settings import Settings
from stepagent.client.backend import ClientBackend, ClientError
from stepagent.client.http import HttpBackend
from stepagent.client.store_backend import StoreBackend
from stepagent.client.watch import Cursor, StoreReader
from stepagent.errors import ConfigurationError
from stepagent.senders.sqs import SqsSender
from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore
from stepagent.stores.metrics import StoreMetrics
from stepagent.transcript import Item
from stepagent.usage import UsageReport

__all__ = ["REQUIRED_SETTINGS", "Client", "ClientError"]

#: What a client needs of a deployment.
REQUIRED_SETTINGS = ("STEPAGENT_CONVERSATION_TABLE", "STEPAGENT_STATE_TABLE", "STEPAGENT_INPUT_QUEUE_URL")


class Client:
    """Talk to one stepagent deployment. ``async with Client(stack="name") as client: ...``

    Give exactly one of ``settings`` (explicit), ``stack`` (a CloudFormation stack's outputs, read when the
    client opens) or neither (the ``STEPAGENT_*`` settings and ``AWS_ENDPOINT_URL`` of ``environ``, by
    default the process environment). ``poll_interval`` is the pause between two reads while following a
    thread (seconds). ``require`` narrows the settings opening insists on (the CLI's ``send`` needs only
    the input queue, its ``history`` only the tables); what is not configured is not opened, and a
    method that needs it then fails.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        stack: str | None = None,
        environ: Mapping[str, str] | None = None,
        poll_interval: float = 0.25,
        api_url: str | None = None,
        token: str | None = None,
        require: tuple[str, ...] = REQUIRED_SETTINGS,
    ) -> None:
        if settings is not None and stack is not None:
            raise ConfigurationError("give the client settings or a stack name, not both")
        if api_url is not None and (settings is not None or stack is not None):
            raise ConfigurationError("give the client an api_url, or settings or a stack name, not both")
        #: Every read and write the client made (requests, bytes), as the stores count them.
        self.metrics = StoreMetrics()
        # The one place the transport is chosen: ``api_url`` speaks HTTP to the deployment's API instead of
        # reading AWS directly.
        self._backend: ClientBackend = (
            HttpBackend(api_url, token, poll_interval=poll_interval)
            if api_url is not None
            else StoreBackend(
                settings,
                stack=stack,
                environ=os.environ if environ is None else environ,
                poll_interval=poll_interval,
                require=require,
                metrics=self.metrics,
            )
        )
        self._open = False

    @classmethod
    def from_stack(cls, name: str, **options: Any) -> Client:
        """A client for the deployed stack ``name`` (its outputs are read when the client opens)."""
        return cls(stack=name, **options)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> Client:
        """A client from ``STEPAGENT_*`` settings and ``AWS_ENDPOINT_URL`` (moto, LocalStack)."""
        return cls(environ=environ, **options)

    @property
    def poll_interval(self) -> float:
        """The pause between two reads while following a thread (seconds)."""
        return self._backend.poll_interval

    @poll_interval.setter
    def poll_interval(self, seconds: float) -> None:
        self._backend.poll_interval = seconds

    # ---- lifecycle ------------------------------------------------------------------------------------

    async def open(self) -> Client:
        """Resolve the settings and open the AWS clients (done by ``async with``)."""
        if not self._open:
            await self._backend.open()
            self._open = True
        return self

    async def close(self) -> None:
        if self._open:
            self._open = False
            await self._backend.close()

    async def __aenter__(self) -> Client:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _require_open(self) -> None:
        if not self._open:
            raise ClientError(
                "the client is not open: use `async with Client(...) as client` or `await client.open()`"
            )

    # ---- talking --------------------------------------------------------------------------------------

    async def send(self, thread: str, text: str, metadata: Any = None) -> str:
        """Put a user message for ``thread`` on the input queue; returns its message id. The next
        :meth:`replies` of this thread starts from just before this message."""
        self._require_open()
        return await self._backend.send(thread, text, metadata)

    async def cursor(self, thread: str) -> Cursor:
        """Where the thread tree is now (per thread, its last order), which also becomes where the next
        :meth:`replies` of this thread starts: call it before something happens that you want to see."""
        self._require_open()
        return await self._backend.cursor(thread)

    def replies(
        self,
        thread: str,
        after: Mapping[str, int] | None = None,
        *,
        partial: bool = False,
        follow: bool = False,
        timeout: float | None = None,
    ) -> AsyncIterator[Item]:
        """The thread tree's new items, ending when the tree is idle again (``follow``: never ending).

        New means after ``after`` (per thread, the last order already seen; threads it does not name from
        their first row), else after where the last :meth:`send` to or :meth:`replies` of this thread
        left off, else after the tree as it is now. Items have the shape of ``stepagent history --json``
        (``thread_id``, ``kind``, ``order``, ``text``, ...), plus notices without an ``order``: ``choice``
        (a question to answer with :meth:`answer_choice`), ``oauth`` (a link to open), ``input`` (a tool's
        question during a call — ``text``, ``requested_schema`` or ``url`` — to answer with
        :meth:`answer_input`; the tree counts as idle while it waits for you), ``error``, and with
        ``partial=True`` ``partial`` (the text a completion has streamed so far, never committed; ``phase``
        ``None`` when it is over). ``timeout`` (seconds) raises ``TimeoutError`` if the tree is still busy.
        """
        return self._replies(thread, after, partial=partial, follow=follow, timeout=timeout)

    async def _replies(
        self,
        thread: str,
        after: Mapping[str, int] | None,
        *,
        partial: bool,
        follow: bool,
        timeout: float | None,  # noqa: ASYNC109 - the public replies() signature
    ) -> AsyncIterator[Item]:
        self._require_open()
        items = self._backend.replies(thread, after, partial=partial, follow=follow, timeout=timeout)
        # Closed with this iterator, so the backend's position is kept (and a stream let go) at once.
        async with contextlib.aclosing(items):
            async for item in items:
                yield item

    # One call that waits, with its own limit: the documented client signature.
    async def wait(self, thread: str, message_id: str, timeout: float = 300.0) -> Any:  # noqa: ASYNC109
        """Return once ``thread`` has processed ``message_id`` and its tree is idle again (the turn that
        message started is over); ``TimeoutError`` after ``timeout`` seconds. Returns the turn's structured
        output (``turn_complete.output``) when an output schema is configured, else ``None``."""
        self._require_open()
        return await self._backend.wait(thread, message_id, timeout)

    async def idle(self, thread: str) -> bool:
        """Whether the thread tree is idle now (nothing running, nothing on its way), by two reads."""
        self._require_open()
        return await self._backend.idle(thread)

    async def usage(self, thread: str) -> UsageReport | None:
        """The tokens and dollars the thread tree has spent (``stepagent usage``); ``None`` for a thread that
        does not exist, and over HTTP (the API's stream carries each turn's ``usage`` instead)."""
        self._require_open()
        return await self._backend.usage(thread)

    async def history(self, thread: str) -> list[Item]:
        """The stored transcript of the thread and its descendants (``stepagent history --json``)."""
        self._require_open()
        return await self._backend.history(thread)

    # ---- approvals --------------------------------------------------------------------------------------

    async def approve(
        self,
        thread: str,
        tool_call_id: str,
        decision: str = "approve",
        args: dict[str, Any] | None = None,
        message: str | None = None,
        *,
        message_id: str | None = None,
    ) -> str:
        """Decide a tool call that waits for approval: ``approve`` (run it as made), ``edit`` (run it with
        ``args``, checked against the tool's schema by the runtime), ``reject`` (the model is told a person
        declined it, plus ``message``) or ``respond`` (the model gets ``message`` as the call's result).
        ``thread`` is the conversation (its root) or the thread that made the call; the decision goes to
        whichever thread of the tree is waiting on ``tool_call_id``. Returns the decision's message id; the
        next :meth:`replies` of ``thread`` waits until the decision is processed. A call that is not waiting
        gets an ``error`` reply from the runtime, and nothing changes. ``message_id`` (default: a new one) makes
        a retried call send the same message, which the runtime then absorbs."""
        self._require_open()
        return await self._backend.approve(thread, tool_call_id, decision, args, message, message_id)

    async def answer_input(
        self,
        thread: str,
        tool_call_id: str,
        action: str,
        content: dict[str, Any] | None = None,
        *,
        message_id: str | None = None,
    ) -> str:
        """Answer a tool's question to the user during call ``tool_call_id`` (an ``input_required`` event):
        ``accept`` (with the form's ``content``), ``decline`` or ``cancel``. ``thread`` is the thread that
        made the call. Returns the answer's message id; the next :meth:`replies` of ``thread`` waits until it
        is processed. A call that is not waiting for an answer gets an ``error`` reply from the runtime."""
        self._require_open()
        return await self._backend.answer_input(thread, tool_call_id, action, content, message_id)

    async def pending_approvals(self, thread: str) -> list[Item]:
        """The tool calls of the thread tree that wait for a person's decision: ``thread_id``,
        ``tool_call_id``, ``name``, ``args`` (``approval`` is ``pending``)."""
        self._require_open()
        return await self._backend.pending_approvals(thread)

    # ---- choices ----------------------------------------------------------------------------------------

    async def pending_choices(self, thread: str) -> list[Item]:
        """Questions a tool of ``thread`` is waiting for the user to answer (``choice`` items)."""
        self._require_open()
        return await self._backend.pending_choices(thread)

    async def answer_choice(
        self, thread: str, choice_id: str | None = None, selected: int | str | None = None
    ) -> int:
        """Answer a pending choice of ``thread`` (``choice_id``; may be left out when there is one):
        ``selected`` is the index, the choice's text, or ``None`` for its default. Returns the index sent.
        The tool that asked gets the answer and sends its result, which the thread then processes."""
        self._require_open()
        return await self._backend.answer_choice(thread, choice_id, selected)

    # ---- the stores, for the console and the HTTP API (the store backend only) ---------------------------

    def _store_backend(self) -> StoreBackend:
        if not isinstance(self._backend, StoreBackend):
            raise ClientError(
                "a client over the HTTP API (api_url) has no stores, queue or settings of its own: "
                "give it the deployment's settings or stack name instead"
            )
        return self._backend

    @property
    def settings(self) -> Settings:
        """The deployment's settings, resolved when the client opened."""
        return self._store_backend().settings

    @property
    def conversation(self) -> DynamoConversationStore:
        return self._store_backend().conversation

    @property
    def state(self) -> DynamoStateStore:
        return self._store_backend().state

    @property
    def stores(self) -> tuple[DynamoConversationStore, DynamoStateStore]:
        self._require_open()
        return self._store_backend().stores

    @property
    def sender(self) -> SqsSender:
        """The input queue's sender (the HTTP API sends through it)."""
        self._require_open()
        return self._store_backend().sender

    @property
    def reader(self) -> StoreReader:
        """The reads a watch makes: :meth:`StoreReader.heads_and_live` reads the heads and ``LIVE`` items
        of many threads in one request (the web console's poll)."""
        self._require_open()
        return self._store_backend().reader
