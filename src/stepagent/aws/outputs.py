"""Publishing output events on the output FIFO queue, and re-reporting what a redelivered step committed.

The events themselves — their kinds, fields and stable ids — are built in :mod:`stepagent.outputs.build`
(the one home of the output contract, shared with the HTTP API's stream and the clients). Guarantees here
(the output queue's wire format, which consumers rely on):

- One queue message per event, ``MessageGroupId`` = the root thread id (a conversation's events stay in
  order), ``MessageDeduplicationId`` = the event's ``event_id``; a step's events are sent together
  (``SendMessageBatch``, :meth:`~stepagent.senders.sqs.SqsQueues.send_batch`). Every event has ``type``,
  ``event_id``, ``thread_id``, ``root_thread_id`` and ``metadata`` (the root's stored metadata, ``{}`` when
  none), added by :func:`stepagent.outputs.events.in_thread`.
- :func:`replay_rows` and :func:`replay_turn_complete` re-report what a previous attempt committed but may
  not have published, identically (same ids, same values).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stepagent.errors import NewerFormatError
from stepagent.outputs.build import record_events
from stepagent.outputs.events import OutputEvent, ThreadContext, in_thread
from stepagent.senders.sqs import Outgoing, SqsQueues
from stepagent.stores.base import ConversationStore, StateStore, StoredRow

#: How far back from the tail :func:`replay_rows` looks for a redelivered step's rows.
REPLAY_WINDOW = 200


async def replay_turn_complete(
    conversation: ConversationStore,
    thread_id: str,
    message_ids: Sequence[str],
    published: Sequence[OutputEvent] = (),
) -> list[OutputEvent]:
    """The events the usage records of recent steps that answered ``message_ids`` stand for — the notices
    they kept (a refusal, an answer given up on, a limit stop) and their ``turn_complete`` — minus those
    already in ``published`` (one bounded read of the records near the head; used only on redelivery)."""
    info = await conversation.get_thread(thread_id)
    if info is None:
        return []
    wanted, seen = set(message_ids), {event["event_id"] for event in published}
    out: list[OutputEvent] = []
    async for record in conversation.usage_records(
        thread_id, after_version=max(0, info.version - REPLAY_WINDOW)
    ):
        if record.step_id in wanted:
            out.extend(e for e in record_events(thread_id, record) if e["event_id"] not in seen)
    return out


async def replay_rows(
    conversation: ConversationStore, thread_id: str, message_ids: Sequence[str]
) -> list[StoredRow]:
    """Rows near the tail that a step for ``message_ids`` produced (its completion rows carry
    ``<thread>-<last input id>-completion-<n>`` ids). One bounded read; used only on redelivery."""
    info = await conversation.get_thread(thread_id)
    if info is None or info.tail == 0:
        return []
    prefixes = tuple(f"{thread_id}-{message_id}-completion-" for message_id in message_ids)
    rows: list[StoredRow] = []
    async for row in conversation.load_rows(thread_id, after=max(0, info.tail - REPLAY_WINDOW)):
        if row.message_id.startswith(prefixes):
            rows.append(row)
    return rows


class OutputPublisher:
    """Adds the thread context to events and sends them to the output queue."""

    def __init__(
        self, queues: SqsQueues, output_queue_url: str, conversation: ConversationStore, state: StateStore
    ) -> None:
        self.queues = queues
        self.output_queue_url = output_queue_url
        self.conversation = conversation
        self.state = state

    async def thread_context(self, thread_id: str) -> tuple[str, Any]:
        """(root thread id, root metadata or ``{}``). A thread with no record is its own root; so is one whose
        records a newer release wrote (a rollback): the ``error`` event saying so must still reach it."""
        try:
            info = await self.conversation.get_thread(thread_id)
            root = info.root_id if info is not None else thread_id
            metadata = await self.state.get_metadata(root)
        except NewerFormatError:
            return thread_id, {}
        return root, metadata if metadata is not None else {}

    async def publish(
        self,
        thread_id: str,
        events: Sequence[OutputEvent],
        *,
        context: tuple[str, Any] | None = None,
    ) -> None:
        """Send ``events`` of ``thread_id`` in order. Raises ``QueueError`` (the caller fails the record).
        ``context``: (root thread id, root metadata) as the step that made the events loaded and committed
        them — then nothing is read; otherwise :meth:`thread_context` reads them."""
        if not events:
            return
        if context is not None:
            root, metadata = context[0], context[1] if context[1] is not None else {}
        else:
            root, metadata = await self.thread_context(thread_id)
        thread: ThreadContext = {"thread_id": thread_id, "root_thread_id": root, "metadata": metadata}
        outgoing = [
            Outgoing(
                json.dumps(
                    in_thread(event, thread),
                    ensure_ascii=False,
                    separators=(",", ":"),
                ),
                group_id=root,
                dedup_id=str(event["event_id"]),
            )
            for event in events
        ]
        # One SendMessageBatch for a step's events (usually two to four) instead of a request each.
        await self.queues.send_batch(self.output_queue_url, outgoing)
