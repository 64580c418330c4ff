"""Output events: what a step tells the user, as JSON on the output FIFO queue.

Guarantees (the output queue's wire format, which consumers rely on):

- One queue message per event, ``MessageGroupId`` = the root thread id (a conversation's events stay in
  order), ``MessageDeduplicationId`` = the event's ``event_id``; a step's events are sent together
  (``SendMessageBatch``, :meth:`~stepagent.senders.sqs.SqsQueues.send_batch`). Every event has ``type``, ``event_id``,
  ``thread_id``, ``root_thread_id`` and ``metadata`` (the root's stored metadata, ``{}`` when none).
- Only *committed* content is reported: ``text`` (one per assistant text row), ``tool_call`` (one per
  tool-call row, followed by ``approval_required`` — ``tool_call_id``, ``name``, ``args`` — when the call
  waits for a person's decision), ``tool_result`` and ``event`` (results and folded-in reports/events, with ``text``)
  come from :class:`~stepagent.events.TurnCommitted`, never from stream chunks, so a step
  that fails after streaming shows nothing it did not keep.
- ``limit_reached`` (``limit``, ``value``, ``used``: a spending limit stopped the thread before a model
  call) comes just before its step's ``turn_complete``; its id derives from the step's input.
- ``turn_complete`` (the step ran the model and left the thread with nothing pending: no open call, no
  held input) comes last in its step's events and carries ``usage`` (``input_tokens``, ``output_tokens``,
  ``cache_read_tokens``, ``cache_write_tokens`` of the step's model calls — prompt-cache tokens are not in
  ``input_tokens`` — and ``cost_usd`` when the model's prices are known), ``output`` (the validated
  structured output, when an output schema is configured and the answer matched it) and ``model``
  (``<provider>:<model id>``), exactly as the step's committed :class:`~stepagent.stores.base.UsageRecord`
  holds them.
- ``event_id`` is stable and unique per content for the life of a thread: row events derive it from
  (thread, order, kind) and, after a rewind or a history replacement, the row's epoch; ``turn_complete``
  from (thread, the head version of the commit that stored its usage); the others from the input's logical
  message id (``error``, ``oauth_required``, ``user_choice_required``) or the choice id
  (``user_choice_complete``). A redelivered or re-run step re-emits the same ids, so consumers (and the
  queue's own dedup) see each event once. :func:`replay_rows` and :func:`replay_turn_complete` re-report
  what a previous attempt committed but may not have published, identically.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stepagent.aws.output_events import (
    ErrorEvent,
    InputRequiredOutput,
    OutputEvent,
    ThreadContext,
    TurnCompleteOutput,
    UsageCounts,
    in_thread,
)
from stepagent.core.step import StepInput
from stepagent.events import (
    AgentEvent,
    CompletionFinished,
    InputRejected,
    InputRequiredEvent,
    LimitReached,
    OAuthRequiredEvent,
    StepFailed,
    TurnCommitted,
    TurnComplete,
    UserChoiceDismissed,
    UserChoiceRequiredEvent,
)
from stepagent.history_items import AssistantText, EventItem, ToolCallItem, ToolResultItem
from stepagent.ids import derived_id
from stepagent.messages import OAuthRequired, UserChoiceRequired
from stepagent.providers.base import Usage
from stepagent.senders.sqs import Outgoing, SqsQueues
from stepagent.stores.base import ConversationStore, StateStore, StoredRow, UsageRecord

#: How far back from the tail :func:`replay_rows` looks for a redelivered step's rows.
REPLAY_WINDOW = 200


def event_id(thread_id: str, *parts: str) -> str:
    """The stable ``event_id`` of an output event of ``thread_id`` identified by ``parts``."""
    return derived_id("output", thread_id, *parts)


@dataclass(slots=True)
class StepEvents:
    """An observer for one thread's step: keeps what the output queue reports."""

    events: list[AgentEvent] = field(default_factory=list)

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        if isinstance(
            event,
            TurnCommitted
            | StepFailed
            | InputRejected
            | OAuthRequiredEvent
            | InputRequiredEvent
            | UserChoiceRequiredEvent
            | UserChoiceDismissed
            | CompletionFinished
            | LimitReached
            | TurnComplete,
        ):
            self.events.append(event)

    @property
    def committed_rows(self) -> list[StoredRow]:
        return [row for event in self.events if isinstance(event, TurnCommitted) for row in event.rows]


def row_event_id(thread_id: str, row: StoredRow, kind: str) -> str:
    """The id of the ``kind`` event of ``row``: from (thread, order, kind), plus the row's epoch once the
    thread was rewound or replaced — orders are reused then, and the new content must not share an id with
    what was dropped (consumers, and the FIFO queue's own dedup, would discard it)."""
    if row.epoch == 0:
        return event_id(thread_id, str(row.order), kind)
    return event_id(thread_id, str(row.order), kind, f"epoch-{row.epoch}")


def row_events(thread_id: str, rows: Iterable[StoredRow]) -> list[OutputEvent]:
    """``text``, ``tool_call``, ``tool_result`` and ``event`` (a report or subscription event folded into
    the thread) events, without the thread context, for committed rows."""
    out: list[OutputEvent] = []
    for row in rows:
        item = row.item
        if isinstance(item, AssistantText) and item.text:
            out.append({"type": "text", "event_id": row_event_id(thread_id, row, "text"), "text": item.text})
        elif isinstance(item, ToolCallItem):
            out.append(
                {
                    "type": "tool_call",
                    "event_id": row_event_id(thread_id, row, "tool_call"),
                    "name": item.call.name,
                    "args": item.call.arguments,
                    "tool_call_id": item.call.id,
                }
            )
            if item.needs_approval:
                # Committed to wait for a person: the event comes from the row, so a redelivered step
                # re-publishes it with the same id, like the call's own event.
                out.append(
                    {
                        "type": "approval_required",
                        "event_id": row_event_id(thread_id, row, "approval_required"),
                        "name": item.call.name,
                        "args": item.call.arguments,
                        "tool_call_id": item.call.id,
                    }
                )
        elif isinstance(item, ToolResultItem | EventItem):
            kind: Literal["tool_result", "event"] = (
                "tool_result" if isinstance(item, ToolResultItem) else "event"
            )
            original = item.result.id if isinstance(item, ToolResultItem) else item.tool_call_id
            out.append(
                {
                    "type": kind,
                    "event_id": row_event_id(thread_id, row, kind),
                    "tool_call_id": original,
                    "text": item.result.joined_text(),
                }
            )
    return out


def _source_id(inputs: Sequence[StepInput], kind: type[Any], content_id: str) -> str:
    """The logical id of the input whose content is a ``kind`` notice for ``content_id``."""
    for item in inputs:
        content = item.message.content
        if isinstance(content, kind) and getattr(content, "id", None) == content_id:
            return item.message_id
    return content_id


def step_events(
    thread_id: str, events: Sequence[AgentEvent], inputs: Sequence[StepInput]
) -> list[OutputEvent]:
    """The output events of one successful step, in the order they happened."""
    last_id = inputs[-1].message_id if inputs else "redrive"
    out: list[OutputEvent] = []
    for event in events:
        if isinstance(event, TurnCommitted):
            out.extend(row_events(thread_id, event.rows))
        elif isinstance(event, StepFailed):
            out.append(error_event(thread_id, event.message, event.retrying, last_id))
        elif isinstance(event, InputRejected):
            text = f"Ignored input message {event.message_id}: {event.reason}"
            out.append(error_event(thread_id, text, False, event.message_id))
        elif isinstance(event, OAuthRequiredEvent):
            source = _source_id(inputs, OAuthRequired, event.tool_call_id)
            out.append(
                {
                    "type": "oauth_required",
                    "event_id": event_id(thread_id, source, "oauth_required"),
                    "auth_url": event.auth_url,
                    "tool_call_id": event.tool_call_id,
                }
            )
        elif isinstance(event, InputRequiredEvent):
            asked: InputRequiredOutput = {
                "type": "input_required",
                "event_id": event_id(thread_id, event.message_id, "input_required"),
                "tool_call_id": event.tool_call_id,
                "message": event.message,
            }
            if event.url is not None:
                asked["url"] = event.url
            else:
                asked["requested_schema"] = event.requested_schema or {"type": "object", "properties": {}}
            out.append(asked)
        elif isinstance(event, UserChoiceRequiredEvent):
            choice = event.choice
            source = _source_id(inputs, UserChoiceRequired, choice.id)
            out.append(
                {
                    "type": "user_choice_required",
                    "event_id": event_id(thread_id, source, "user_choice_required"),
                    "id": choice.id,
                    "prompt": choice.prompt,
                    "choices": list(choice.choices),
                    "default": choice.default,
                    "response_url": choice.response_url,
                }
            )
        elif isinstance(event, UserChoiceDismissed):
            out.append(
                {
                    "type": "user_choice_complete",
                    "event_id": event_id(thread_id, event.choice_id, "user_choice_complete"),
                    "choice_id": event.choice_id,
                }
            )
        elif isinstance(event, LimitReached):
            out.append(
                {
                    "type": "limit_reached",
                    "event_id": event_id(thread_id, last_id, "limit_reached"),
                    "limit": event.limit,
                    "value": event.value,
                    "used": event.used,
                }
            )
        elif isinstance(event, TurnComplete):
            out.append(
                turn_complete_event(
                    thread_id,
                    event.version,
                    event.usage,
                    event.model,
                    cost_usd=event.cost_usd,
                    output=_OutputValue(event.output) if event.has_output else None,
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class _OutputValue:
    """A structured output (wrapped: the value itself may be ``None``, JSON ``null``)."""

    value: Any


def turn_complete_event(
    thread_id: str,
    version: int,
    usage: Usage,
    model: str,
    *,
    cost_usd: float | None = None,
    output: _OutputValue | None = None,
) -> TurnCompleteOutput:
    """The ``turn_complete`` event of the step whose commit produced head ``version``."""
    counts: UsageCounts = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
    }
    if cost_usd is not None:
        counts["cost_usd"] = cost_usd
    event: TurnCompleteOutput = {
        "type": "turn_complete",
        "event_id": event_id(thread_id, f"v{version}", "turn_complete"),
        "usage": counts,
        "model": model,
    }
    if output is not None:
        event["output"] = output.value
    return event


async def replay_turn_complete(
    conversation: ConversationStore,
    thread_id: str,
    message_ids: Sequence[str],
    published: Sequence[OutputEvent] = (),
) -> list[OutputEvent]:
    """``turn_complete`` events of recent steps that answered ``message_ids`` (one bounded read of the
    usage records near the head; used only on redelivery), minus those already in ``published``."""
    info = await conversation.get_thread(thread_id)
    if info is None:
        return []
    wanted, seen = set(message_ids), {event["event_id"] for event in published}
    out: list[OutputEvent] = []
    async for record in conversation.usage_records(
        thread_id, after_version=max(0, info.version - REPLAY_WINDOW)
    ):
        if record.turn_complete and record.step_id in wanted:
            output = _OutputValue(json.loads(record.output)) if record.output is not None else None
            event = turn_complete_event(
                thread_id,
                record.version,
                _usage(record),
                record.model,
                cost_usd=record.cost_usd,
                output=output,
            )
            if event["event_id"] not in seen:
                out.append(event)
    return out


def _usage(record: UsageRecord) -> Usage:
    return Usage(
        input_tokens=record.input_tokens,
        output_tokens=record.output_tokens,
        cache_read_tokens=record.cache_read_tokens,
        cache_write_tokens=record.cache_write_tokens,
    )


def error_event(
    thread_id: str,
    message: str,
    retrying: bool,
    source_id: str,
    *,
    attempt: int | None = None,
    attempts: int | None = None,
) -> ErrorEvent:
    """An ``error`` event caused by the input ``source_id``: ``attempt`` is the failed attempt of a
    retried input (each attempt's event has its own id), ``attempts`` how many were made before giving up."""
    kind = "error-retrying" if retrying else "error"
    parts = (source_id, kind) if attempt is None or attempt <= 1 else (source_id, kind, str(attempt))
    event: ErrorEvent = {
        "type": "error",
        "event_id": event_id(thread_id, *parts),
        "message": message,
        "retrying": retrying,
    }
    if attempts is not None:
        event["attempts"] = attempts
    return event


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
        """(root thread id, root metadata or ``{}``). A thread with no record is its own root."""
        info = await self.conversation.get_thread(thread_id)
        root = info.root_id if info is not None else thread_id
        metadata = await self.state.get_metadata(root)
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
