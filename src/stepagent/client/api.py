"""The asynchronous client: :class:`Client`. See :mod:`stepagent.client` for the guarantees."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pydantic import ValidationError

from stepagent.aws.clients import aws_session, client
from stepagent.aws.settings import Settings
from stepagent.aws.transient import retry_transient
from stepagent.client.http import HttpApi
from stepagent.client.watch import Cursor, StoreReader, TreeWatch
from stepagent.errors import ChoiceAnswerError, ConfigurationError, StepagentError
from stepagent.history_items import ToolCallItem, waiting_for_approval
from stepagent.messages import ApprovalDecision, InputMessage, UserChoiceRequired
from stepagent.rap.choices import answer_user_choice
from stepagent.senders.sqs import SqsSender
from stepagent.stores.base import tree_threads
from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore, dynamo_stores
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.dynamodb.live import decode_live
from stepagent.stores.metrics import StoreMetrics
from stepagent.transcript import Item, choice_item, tree_items
from stepagent.usage import UsageReport, thread_usage

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
        #: Set by ``api_url``: the client speaks HTTP to a deployment's API instead of reading AWS directly.
        self._http: HttpApi | None = HttpApi(api_url, token) if api_url is not None else None
        self._given = settings
        self._stack_name = stack
        self._environ = dict(os.environ if environ is None else environ)
        self._required = require
        self._reads = False
        self.poll_interval = poll_interval
        #: Every read and write the client made (requests, bytes), as the stores count them.
        self.metrics = StoreMetrics()
        self._exit: contextlib.AsyncExitStack | None = None
        self._cursors: dict[str, Cursor] = {}
        self._notice_seqs: dict[str, dict[str, int]] = {}
        self._awaited: dict[str, set[str]] = {}
        self._awaited_in: dict[str, set[tuple[str, str]]] = {}
        self._announced: dict[str, set[tuple[str, str]]] = {}

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
        if self._http is not None:
            self._exit = contextlib.AsyncExitStack()
            self._exit.push_async_callback(self._http.close)
            return self
        settings = self._given
        if settings is None:
            env = dict(self._environ)
            if self._stack_name is not None:
                from stepagent.aws.stack_outputs import stack_environment

                env.update(await stack_environment(self._stack_name, Settings.from_env(env)))
            settings = Settings.from_env(env)
        settings.require(*self._required)
        self.settings = settings
        tables = bool(settings.conversation_table and settings.state_table)
        exit_stack = contextlib.AsyncExitStack()
        try:
            session = aws_session(settings)
            dynamodb = (
                await exit_stack.enter_async_context(client(session, "dynamodb", settings))
                if tables
                else None
            )
            sqs = (
                await exit_stack.enter_async_context(client(session, "sqs", settings))
                if settings.input_queue_url
                else None
            )
            s3 = (
                await exit_stack.enter_async_context(client(session, "s3", settings))
                if settings.blob_bucket
                else None
            )
        except BaseException:
            await exit_stack.aclose()
            raise
        self._exit = exit_stack
        if dynamodb is not None:
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
        self._reads = dynamodb is not None
        if sqs is not None:
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
        if self._http is not None:
            return await self._http.send(thread, text, metadata)
        # Where the tree was before this message, so replies() shows its answer (a send-only client
        # follows nothing).
        if self._reads and thread not in self._cursors:
            self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        message_id = str(uuid.uuid4())
        message = InputMessage.user_text(thread, text, id=message_id, metadata=metadata)
        # The same message id on every try: the runtime absorbs a copy an earlier, failed-looking try sent.
        await retry_transient(functools.partial(self._sender.send, message, message_id))
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
        if self._http is not None:
            # Over HTTP the stream's own resume token is the position (``after`` does not apply).
            async with asyncio.timeout(timeout):
                async for item in self._http.replies(thread, partial=partial, follow=follow):
                    yield item
            return
        if after is not None:
            cursor, seqs = dict(after), self._notice_seqs.get(thread, {})
        elif thread in self._cursors:
            cursor, seqs = self._cursors[thread], self._notice_seqs.get(thread, {})
        else:
            cursor, seqs = await self._snapshot(thread)
        self._cursors[thread] = cursor
        awaited = self._awaited.setdefault(thread, set())
        awaited_in = self._awaited_in.setdefault(thread, set())
        watch = TreeWatch(
            self._reader,
            thread,
            cursor,
            awaited=awaited,
            partial=partial,
            notice_seq=seqs,
            awaited_in=awaited_in,
            announced=self._announced.setdefault(thread, set()),
        )
        try:
            async for item in watch.replies(interval=self.poll_interval, follow=follow, limit=timeout):
                yield item
        finally:
            self._notice_seqs[thread] = {
                t: view.notice_seq for t, view in watch.threads.items() if view.notice_seq is not None
            }

    # One call that waits, with its own limit: the documented client signature.
    async def wait(self, thread: str, message_id: str, timeout: float = 300.0) -> Any:  # noqa: ASYNC109
        """Return once ``thread`` has processed ``message_id`` and its tree is idle again (the turn that
        message started is over); ``TimeoutError`` after ``timeout`` seconds. Returns the turn's structured
        output (``turn_complete.output``) when an output schema is configured, else ``None``."""
        self._require_open()
        if self._http is not None:
            return await self._http.wait(thread, timeout, message_id=message_id)
        cursor, seqs = await self._snapshot(thread)
        watch = TreeWatch(self._reader, thread, cursor, awaited={message_id}, notice_seq=seqs)
        async for _ in watch.replies(interval=self.poll_interval, limit=timeout):
            pass
        return await self._turn_output(thread, message_id)

    async def _turn_output(self, thread: str, message_id: str) -> Any:
        """The structured output of the turn ``message_id`` started: the first completed turn's record at
        or after the record of the step that answered it (one bounded read of recent usage records);
        ``None`` when the model never answered that message (e.g. a limit stopped it) or gave no output."""
        info = await self.conversation.get_thread(thread)
        if info is None:
            return None
        started = False
        async for record in self.conversation.usage_records(thread, after_version=max(0, info.version - 200)):
            started = started or record.step_id == message_id
            if started and record.turn_complete:
                return None if record.output is None else json.loads(record.output)
        return None

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

    async def usage(self, thread: str) -> UsageReport | None:
        """The tokens and dollars the thread tree has spent (``stepagent usage``); ``None`` for a thread that
        does not exist, and over HTTP (the API's stream carries each turn's ``usage`` instead)."""
        self._require_open()
        if self._http is not None:
            return None
        return await thread_usage(self.conversation, thread, self.settings.prices)

    async def history(self, thread: str) -> list[Item]:
        """The stored transcript of the thread and its descendants (``stepagent history --json``)."""
        self._require_open()
        if self._http is not None:
            return await self._http.history(thread)

        async def read() -> list[Item]:
            return [item async for item in tree_items(self.conversation, thread)]

        return await retry_transient(read)

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
        if self._http is not None:
            return await self._http.approve(thread, tool_call_id, decision, args, message, message_id)
        try:
            body = ApprovalDecision.model_validate(
                {"tool_call_id": tool_call_id, "decision": decision, "args": args, "message": message}
            )
        except ValidationError as error:
            reason = error.errors()[0]["msg"]
            raise ClientError(f"invalid approval for {tool_call_id}: {reason}") from None
        target = (
            await retry_transient(functools.partial(self._waiting_thread, thread, tool_call_id)) or thread
        )
        if thread not in self._cursors:
            self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        message_id = message_id or str(uuid.uuid4())
        decision_message = InputMessage(content=body, group_id=target, id=message_id)
        await retry_transient(functools.partial(self._sender.send, decision_message, message_id))
        if target == thread:
            self._awaited.setdefault(thread, set()).add(message_id)
        else:
            self._awaited_in.setdefault(thread, set()).add((target, message_id))
        return message_id

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
        if self._http is not None:
            return await self._http.answer_input(thread, tool_call_id, action, content, message_id)
        try:
            answer = InputMessage.elicitation(thread, tool_call_id, action, content, id=message_id)
        except ValidationError as error:
            reason = error.errors()[0]["msg"]
            raise ClientError(f"invalid answer for {tool_call_id}: {reason}") from None
        if thread not in self._cursors:
            self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        message_id = message_id or str(uuid.uuid4())
        answer = answer.model_copy(update={"id": message_id})
        await retry_transient(functools.partial(self._sender.send, answer, message_id))
        self._awaited.setdefault(thread, set()).add(message_id)
        return message_id

    async def pending_approvals(self, thread: str) -> list[Item]:
        """The tool calls of the thread tree that wait for a person's decision: ``thread_id``,
        ``tool_call_id``, ``name``, ``args`` (``approval`` is ``pending``)."""
        self._require_open()
        found: list[Item] = []
        async for thread_id, call in self._waiting_calls(thread):
            found.append(
                {
                    "thread_id": thread_id,
                    "kind": "tool_call",
                    "tool_call_id": call.call.id,
                    "name": call.call.name,
                    "args": call.call.arguments,
                    "approval": "pending",
                }
            )
        return found

    async def _waiting_thread(self, thread: str, tool_call_id: str) -> str | None:
        async for thread_id, call in self._waiting_calls(thread):
            if call.call.id == tool_call_id:
                return thread_id
        return None

    async def _waiting_calls(self, thread: str) -> AsyncIterator[tuple[str, ToolCallItem]]:
        """Each thread of the tree whose last row is a call waiting for approval (one row read each)."""
        async for current in tree_threads(self.conversation, thread):
            info = await self.conversation.get_thread(current)
            if info is None and current == thread:
                return  # no such thread (yet): it has no children to read either
            if info is not None and info.tail > 0 and not info.closed:
                rows = [row.item async for row in self.conversation.load_rows(current, after=info.tail - 1)]
                waiting = waiting_for_approval(rows)
                if waiting is not None:
                    yield current, waiting

    # ---- choices ----------------------------------------------------------------------------------------

    async def pending_choices(self, thread: str) -> list[Item]:
        """Questions a tool of ``thread`` is waiting for the user to answer (``choice`` items)."""
        self._require_open()
        return [choice_item(thread, c) for c in await self.state.pending_choices(thread)]

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
        return await retry_transient(functools.partial(self._read_snapshot, thread))

    async def _read_snapshot(self, thread: str) -> tuple[Cursor, dict[str, int]]:
        cursor: Cursor = {}
        async for current in tree_threads(self.conversation, thread):
            info = await self.conversation.get_thread(current)
            if info is None and current == thread:
                break  # no such thread (yet): it has no children to read either
            if info is not None:
                cursor[current] = info.tail
        heads = await self._reader.heads_and_live([thread, *cursor])
        seqs = {t: decode_live(live).notice_seq for t, (_, live) in heads.items()}
        return cursor, seqs

    @property
    def stores(self) -> tuple[DynamoConversationStore, DynamoStateStore]:
        self._require_open()
        return self.conversation, self.state

    @property
    def sender(self) -> SqsSender:
        """The input queue's sender (the HTTP API sends through it)."""
        self._require_open()
        return self._sender

    @property
    def reader(self) -> StoreReader:
        """The reads a watch makes: :meth:`StoreReader.heads_and_live` reads the heads and ``LIVE`` items
        of many threads in one request (the web console's poll)."""
        self._require_open()
        return self._reader


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
