"""The client's default backend: :class:`StoreBackend` reads a deployment's tables and writes its input
queue directly (AWS credentials needed), as the worker does.

Replies are committed rows read with strongly consistent reads after the last order seen, per thread of
the tree (:class:`~stepagent.client.watch.TreeWatch` and its idle rule); sends, approvals and answers go on
the input queue with a message id kept across tries, so a repeat is absorbed; a send, an approval, a
history read or a snapshot that fails transiently is tried again
(:func:`~stepagent.aws.transient.retry_transient`). Only what the settings configure is opened: a method
that needs the rest then fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from pydantic import ValidationError

from stepagent.aws.clients import aws_session, client
from stepagent.aws.settings import Settings
from stepagent.aws.transient import retry_transient
from stepagent.client.backend import ClientError
from stepagent.client.watch import Cursor, StoreReader, TreeWatch
from stepagent.errors import ChoiceAnswerError
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


class StoreBackend:
    """The tables and the input queue of one deployment: from ``settings``, else a stack's outputs
    (``stack``, read at :meth:`open`), else the ``STEPAGENT_*`` settings of ``environ``. ``require`` names
    the settings :meth:`open` insists on; I/O is counted in ``metrics``. The tables (``conversation``,
    ``state``, ``reader``) and the queue (``sender``) exist once :meth:`open` has opened them."""

    settings: Settings
    conversation: DynamoConversationStore
    state: DynamoStateStore
    #: The reads a watch makes (the heads and ``LIVE`` items of many threads in one request).
    reader: StoreReader
    #: The input queue's sender.
    sender: SqsSender

    def __init__(
        self,
        settings: Settings | None,
        *,
        stack: str | None,
        environ: Mapping[str, str],
        poll_interval: float,
        require: tuple[str, ...],
        metrics: StoreMetrics,
    ) -> None:
        self._given = settings
        self._stack_name = stack
        self._environ = dict(environ)
        self._required = require
        self._reads = False
        self.poll_interval = poll_interval
        self.metrics = metrics
        self._exit: contextlib.AsyncExitStack | None = None
        self._cursors: dict[str, Cursor] = {}
        self._notice_seqs: dict[str, dict[str, int]] = {}
        self._awaited: dict[str, set[str]] = {}
        self._awaited_in: dict[str, set[tuple[str, str]]] = {}
        self._announced: dict[str, set[tuple[str, str]]] = {}

    # ---- lifecycle ------------------------------------------------------------------------------------

    async def open(self) -> None:
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
            self.reader = StoreReader(
                self.conversation, self.state, DynamoIo(dynamodb, None, None, self.metrics)
            )
        self._reads = dynamodb is not None
        if sqs is not None:
            self.sender = SqsSender(
                sqs, str(settings.input_queue_url), s3_client=s3, bucket=settings.blob_bucket
            )

    async def close(self) -> None:
        if self._exit is not None:
            exit_stack, self._exit = self._exit, None
            await exit_stack.aclose()

    @property
    def stores(self) -> tuple[DynamoConversationStore, DynamoStateStore]:
        return self.conversation, self.state

    # ---- talking --------------------------------------------------------------------------------------

    async def send(self, thread: str, text: str, metadata: Any) -> str:
        # Where the tree was before this message, so replies() shows its answer (a send-only client
        # follows nothing).
        if self._reads and thread not in self._cursors:
            self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        message_id = str(uuid.uuid4())
        message = InputMessage.user_text(thread, text, id=message_id, metadata=metadata)
        # The same message id on every try: the runtime absorbs a copy an earlier, failed-looking try sent.
        await retry_transient(functools.partial(self.sender.send, message, message_id))
        self._awaited.setdefault(thread, set()).add(message_id)
        return message_id

    async def cursor(self, thread: str) -> Cursor:
        self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        return dict(self._cursors[thread])

    async def replies(
        self,
        thread: str,
        after: Mapping[str, int] | None,
        *,
        partial: bool,
        follow: bool,
        timeout: float | None,  # noqa: ASYNC109 - the public replies() signature
    ) -> AsyncGenerator[Item, None]:
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
            self.reader,
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

    async def wait(self, thread: str, message_id: str, timeout: float) -> Any:  # noqa: ASYNC109
        cursor, seqs = await self._snapshot(thread)
        watch = TreeWatch(self.reader, thread, cursor, awaited={message_id}, notice_seq=seqs)
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
        cursor, seqs = await self._snapshot(thread)
        watch = TreeWatch(self.reader, thread, cursor, notice_seq=seqs)
        await watch.poll()
        if not watch.looks_idle:
            return False
        await asyncio.sleep(self.poll_interval)
        _, idle = await watch.poll()
        return idle

    async def usage(self, thread: str) -> UsageReport | None:
        return await thread_usage(self.conversation, thread, self.settings.prices)

    async def history(self, thread: str) -> list[Item]:
        async def read() -> list[Item]:
            return [item async for item in tree_items(self.conversation, thread)]

        return await retry_transient(read)

    # ---- approvals and answers ------------------------------------------------------------------------

    async def approve(
        self,
        thread: str,
        tool_call_id: str,
        decision: str,
        args: dict[str, Any] | None,
        message: str | None,
        message_id: str | None,
    ) -> str:
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
        await retry_transient(functools.partial(self.sender.send, decision_message, message_id))
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
        content: dict[str, Any] | None,
        message_id: str | None,
    ) -> str:
        try:
            answer = InputMessage.elicitation(thread, tool_call_id, action, content, id=message_id)
        except ValidationError as error:
            reason = error.errors()[0]["msg"]
            raise ClientError(f"invalid answer for {tool_call_id}: {reason}") from None
        if thread not in self._cursors:
            self._cursors[thread], self._notice_seqs[thread] = await self._snapshot(thread)
        message_id = message_id or str(uuid.uuid4())
        answer = answer.model_copy(update={"id": message_id})
        await retry_transient(functools.partial(self.sender.send, answer, message_id))
        self._awaited.setdefault(thread, set()).add(message_id)
        return message_id

    async def pending_approvals(self, thread: str) -> list[Item]:
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
        return [choice_item(thread, c) for c in await self.state.pending_choices(thread)]

    async def answer_choice(self, thread: str, choice_id: str | None, selected: int | str | None) -> int:
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
        heads = await self.reader.heads_and_live([thread, *cursor])
        seqs = {t: decode_live(live).notice_seq for t, (_, live) in heads.items()}
        return cursor, seqs


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
