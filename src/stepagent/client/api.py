"""The asynchronous client: :class:`Client`. See :mod:`stepagent.client` for the guarantees."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from stepagent.aws.clients import aws_session, client
from stepagent.aws.settings import Settings
from stepagent.client.watch import Cursor, StoreReader, TreeWatch
from stepagent.errors import ChoiceAnswerError, ConfigurationError, StepagentError
from stepagent.messages import InputMessage, UserChoiceRequired
from stepagent.rap.choices import answer_user_choice
from stepagent.senders.sqs import SqsSender
from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore, dynamo_stores
from stepagent.stores.dynamodb_io import DynamoIo
from stepagent.stores.dynamodb_live import decode_live
from stepagent.stores.metrics import StoreMetrics
from stepagent.transcript import tree_items

Item = dict[str, Any]

#: What a client needs of a deployment.
REQUIRED_SETTINGS = ("STEPAGENT_CONVERSATION_TABLE", "STEPAGENT_STATE_TABLE", "STEPAGENT_INPUT_QUEUE_URL")


class ClientError(StepagentError):
    """The client could not do what was asked (no such choice, an answer the tool refused, ...)."""

    default_disposition = "fatal"


class Client:
    """Talk to one stepagent deployment. ``async with Client(stack="name") as client: ...``

    Give exactly one of ``settings`` (explicit), ``stack`` (a CloudFormation stack's outputs, read when the
    client opens) or neither (the ``STEPAGENT_*`` settings and ``AWS_ENDPOINT_URL`` of ``environ``, by
    default the process environment). ``poll_interval`` is the pause between two reads while following a
    thread (seconds).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        stack: str | None = None,
        environ: Mapping[str, str] | None = None,
        poll_interval: float = 0.25,
    ) -> None:
        if settings is not None and stack is not None:
            raise ConfigurationError("give the client settings or a stack name, not both")
        self._given = settings
        self._stack_name = stack
        self._environ = dict(os.environ if environ is None else environ)
        self.poll_interval = poll_interval
        #: Every read and write the client made (requests, bytes), as the stores count them.
        self.metrics = StoreMetrics()
        self._exit: contextlib.AsyncExitStack | None = None
        self._cursors: dict[str, Cursor] = {}
        self._notice_seqs: dict[str, dict[str, int]] = {}
        self._awaited: dict[str, set[str]] = {}

    @classmethod
    def from_stack(cls, name: str, **options: Any) -> Client:
        """A client for the deployed stack ``name`` (its outputs are read when the client opens)."""
        return cls(stack=name, **options)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> Client:
        """A client from ``STEPAGENT_*`` settings and ``AWS_ENDPOINT_URL`` (moto, LocalStack)."""
        return cls(environ=environ, **options)

    # ---- lifecycle ------------------------------------------------------------------------------------

    async def open(self) -> Client:
        """Resolve the settings and open the AWS clients (done by ``async with``)."""
        if self._exit is not None:
            return self
        settings = self._given
        if settings is None:
            env = dict(self._environ)
            if self._stack_name is not None:
                from stepagent.aws.stack_outputs import stack_environment

                env.update(await stack_environment(self._stack_name, Settings.from_env(env)))
            settings = Settings.from_env(env)
        settings.require(*REQUIRED_SETTINGS)
        self.settings = settings
        exit_stack = contextlib.AsyncExitStack()
        try:
            session = aws_session(settings)
            dynamodb = await exit_stack.enter_async_context(client(session, "dynamodb", settings))
            sqs = await exit_stack.enter_async_context(client(session, "sqs", settings))
            s3 = (
                await exit_stack.enter_async_context(client(session, "s3", settings))
                if settings.blob_bucket
                else None
            )
        except BaseException:
            await exit_stack.aclose()
            raise
        self._exit = exit_stack
        self.conversation, self.state = dynamo_stores(
            dynamodb,
            conversation_table=str(settings.conversation_table),
            state_table=str(settings.state_table),
            s3_client=s3,
            bucket=settings.blob_bucket,
            metrics=self.metrics,
        )
        self._reader = StoreReader(
            self.conversation, self.state, DynamoIo(dynamodb, None, None, self.metrics)
        )
        self._sender = SqsSender(
            sqs, str(settings.input_queue_url), s3_client=s3, bucket=settings.blob_bucket
        )
        return self

    async def close(self) -> None:
        if self._exit is not None:
            exit_stack, self._exit = self._exit, None
            await exit_stack.aclose()

    async def __aenter__(self) -> Client:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _require_open(self) -> None:
        if self._exit is None:
            raise ClientError(
                "the client is not open: use `async with Client(...) as client` or `await client.open()`"
            )

    # ---- talking --------------------------------------------------------------------------------------

    async def send(self, thread: str, text: str, metadata: Any = None) -> str:
        """Put a user message for ``thread`` on the input queue; returns its message id. The next
        :meth:`replies` of this thread starts from just before this message."""
        self._require_open()
        if thread not in self._cursors:
            self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        message_id = str(uuid.uuid4())
        message = InputMessage.user_text(thread, text, id=message_id, metadata=metadata)
        await self._sender.send(message, message_id)
        self._awaited.setdefault(thread, set()).add(message_id)
        return message_id

    async def cursor(self, thread: str) -> Cursor:
        """Where the thread tree is now (per thread, its last order), which also becomes where the next
        :meth:`replies` of this thread starts: call it before something happens that you want to see."""
        self._require_open()
        self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        return dict(self._cursors[thread])

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
        (a question to answer with :meth:`answer_choice`), ``oauth`` (a link to open), ``error``, and with
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
        if after is not None:
            cursor, seqs = dict(after), self._notice_seqs.get(thread, {})
        elif thread in self._cursors:
            cursor, seqs = self._cursors[thread], self._notice_seqs.get(thread, {})
        else:
            cursor, seqs = await self._snapshot(thread)
        self._cursors[thread] = cursor
        awaited = self._awaited.setdefault(thread, set())
        watch = TreeWatch(self._reader, thread, cursor, awaited=awaited, partial=partial, notice_seq=seqs)
        try:
            async for item in watch.replies(interval=self.poll_interval, follow=follow, limit=timeout):
                yield item
        finally:
            self._notice_seqs[thread] = {
                t: view.notice_seq for t, view in watch.threads.items() if view.notice_seq is not None
            }

    # One call that waits, with its own limit: the documented client signature, kept as it is.
    async def wait(self, thread: str, message_id: str, timeout: float = 300.0) -> None:  # noqa: ASYNC109
        """Return once ``thread`` has processed ``message_id`` and its tree is idle again (the turn that
        message started is over); ``TimeoutError`` after ``timeout`` seconds."""
        self._require_open()
        cursor, seqs = await self._snapshot(thread)
        watch = TreeWatch(self._reader, thread, cursor, awaited={message_id}, notice_seq=seqs)
        async for _ in watch.replies(interval=self.poll_interval, limit=timeout):
            pass

    async def idle(self, thread: str) -> bool:
        """Whether the thread tree is idle now (nothing running, nothing on its way), by two reads."""
        self._require_open()
        cursor, seqs = await self._snapshot(thread)
        watch = TreeWatch(self._reader, thread, cursor, notice_seq=seqs)
        await watch.poll()
        if not watch.looks_idle:
            return False
        await asyncio.sleep(self.poll_interval)
        _, idle = await watch.poll()
        return idle

    async def history(self, thread: str) -> list[Item]:
        """The stored transcript of the thread and its descendants (``stepagent history --json``)."""
        self._require_open()
        return [item async for item in tree_items(self.conversation, thread)]

    # ---- choices ----------------------------------------------------------------------------------------

    async def pending_choices(self, thread: str) -> list[Item]:
        """Questions a tool of ``thread`` is waiting for the user to answer (``choice`` items)."""
        self._require_open()
        return [_choice_item(thread, c) for c in await self.state.pending_choices(thread)]

    async def answer_choice(
        self, thread: str, choice_id: str | None = None, selected: int | str | None = None
    ) -> int:
        """Answer a pending choice of ``thread`` (``choice_id``; may be left out when there is one):
        ``selected`` is the index, the choice's text, or ``None`` for its default. Returns the index sent.
        The tool that asked gets the answer and sends its result, which the thread then processes."""
        self._require_open()
        pending = await self.state.pending_choices(thread)
        choice = _find_choice(thread, pending, choice_id)
        index = _choice_index(choice, selected)
        try:
            return await answer_user_choice(choice, index)
        except ChoiceAnswerError as error:
            raise ClientError(str(error)) from None

    # ---- helpers ----------------------------------------------------------------------------------------

    async def _snapshot(self, thread: str) -> tuple[Cursor, dict[str, int]]:
        """Where the tree is now: each thread's last order and how many notices it has had."""
        cursor: Cursor = {}
        pending = [thread]
        while pending:
            current = pending.pop(0)
            info = await self.conversation.get_thread(current)
            if info is None:
                continue
            cursor[current] = info.tail
            pending.extend(child.thread_id for child in await self.conversation.children(current))
        heads = await self._reader.heads_and_live([thread, *cursor])
        seqs = {t: decode_live(live).notice_seq for t, (_, live) in heads.items()}
        return cursor, seqs

    @property
    def stores(self) -> tuple[DynamoConversationStore, DynamoStateStore]:
        self._require_open()
        return self.conversation, self.state

    @property
    def reader(self) -> StoreReader:
        """The reads a watch makes: :meth:`StoreReader.heads_and_live` reads the heads and ``LIVE`` items
        of many threads in one request (the web console's poll)."""
        self._require_open()
        return self._reader


def _choice_item(thread: str, choice: UserChoiceRequired) -> Item:
    return {
        "thread_id": thread,
        "kind": "choice",
        "choice_id": choice.id,
        "prompt": choice.prompt,
        "choices": list(choice.choices),
        "default": choice.default,
    }


def _find_choice(thread: str, pending: list[UserChoiceRequired], choice_id: str | None) -> UserChoiceRequired:
    if choice_id is not None:
        for choice in pending:
            if choice.id == choice_id:
                return choice
        raise ClientError(f"thread {thread} has no pending choice {choice_id!r} (answered already?)")
    if len(pending) == 1:
        return pending[0]
    if not pending:
        raise ClientError(f"thread {thread} has no pending choice")
    ids = ", ".join(c.id for c in pending)
    raise ClientError(f"thread {thread} has {len(pending)} pending choices ({ids}): say which one")


def _choice_index(choice: UserChoiceRequired, selected: int | str | None) -> int | None:
    if selected is None or (isinstance(selected, int) and not isinstance(selected, bool)):
        index = selected
    else:
        text = str(selected).strip()
        if text.isdigit():
            index = int(text)
        else:
            lowered = [c.lower() for c in choice.choices]
            if text.lower() not in lowered:
                raise ClientError(
                    f"{text!r} is not one of the choices: "
                    + ", ".join(f"{i}: {c}" for i, c in enumerate(choice.choices))
                )
            index = lowered.index(text.lower())
    if index is not None and not 0 <= index < len(choice.choices):
        raise ClientError(f"choice {index} is out of range: pick 0..{len(choice.choices) - 1}")
    return index
