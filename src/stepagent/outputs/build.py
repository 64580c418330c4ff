"""The output events of a thread, built once for every surface: the output queue's publisher, the HTTP
API's stream, the history and the clients all take them from here.

Guarantees (the output queue's wire format, which consumers rely on):

- Every event has ``type`` and ``event_id``; publishing or streaming adds ``thread_id``,
  ``root_thread_id`` and ``metadata`` (:func:`stepagent.outputs.events.in_thread`).
- Only *committed* content is reported: ``text`` (one per assistant text row), ``tool_call`` (one per
  tool-call row, followed by ``approval_required`` — ``tool_call_id``, ``name``, ``args`` — when the call
  waits for a person's decision), ``tool_result`` and ``event`` (results and folded-in reports/events, with ``text``)
  and ``approval`` (a person's decision row: ``tool_call_id``, ``decision``, ``approval``, the edited
  ``args``, ``message``) come from :class:`~stepagent.events.TurnCommitted`, never from stream chunks, so a
  step that fails after streaming shows nothing it did not keep.
- The notices a step keeps with the thread (:func:`stepagent.events.kept_notice`, stored in its usage
  record): ``error`` for a refused input (with the ``tool_call_id`` a refused decision named) or an
  answer given up on, and the limit stop (``limit``, ``value``, ``used``: a spending limit stopped the
  thread before a model call), which comes just before its step's ``turn_complete``. :func:`notice_event`
  builds each the same way from the step's event and from the stored record; ids derive from the input.
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
  queue's own dedup) see each event once. :func:`record_events` builds a usage
  record's notices and ``turn_complete`` identically to the step that committed it, so a replay
  (:mod:`stepagent.aws.outputs`) or a stream (:mod:`stepagent.api.events`) carries the same keys and values.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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
    kept_notice,
)
from stepagent.history_items import (
    APPROVAL_STATES,
    ApprovalItem,
    AssistantText,
    EventItem,
    ToolCallItem,
    ToolResultItem,
)
from stepagent.ids import derived_id
from stepagent.messages import OAuthRequired, UserChoiceRequired
from stepagent.notices import LIMIT_REACHED
from stepagent.outputs.events import (
    ApprovalEvent,
    ErrorEvent,
    InputRequiredOutput,
    LimitReachedOutput,
    OutputEvent,
    TurnCompleteOutput,
    UsageCounts,
)
from stepagent.providers.base import Usage
from stepagent.stores.base import StoredRow, UsageRecord


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
    """The events of committed rows, without the thread context: ``text``, ``tool_call`` (and
    ``approval_required``), ``tool_result``, ``event`` (a report or subscription event folded into the
    thread) and ``approval`` (a person's decision on a waiting call, with the edited ``args``: what the
    call runs with and the model sees from then on)."""
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
        elif isinstance(item, ApprovalItem):
            out.append(_decision_event(thread_id, row, item))
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


def _decision_event(thread_id: str, row: StoredRow, item: ApprovalItem) -> ApprovalEvent:
    decided: ApprovalEvent = {
        "type": "approval",
        "event_id": row_event_id(thread_id, row, "approval"),
        "tool_call_id": item.tool_call_id,
        "decision": item.decision,
        "approval": APPROVAL_STATES[item.decision],
    }
    if item.args is not None:
        decided["args"] = item.args
    if item.message is not None:
        decided["message"] = item.message
    return decided


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
    """The output events of one successful step, in the order they happened — except the notices the step
    keeps in its usage record (a refusal, an answer given up on, a limit stop), which come after the rows it
    committed and before its ``turn_complete``: where the API stream and the history, reading the record
    back, place them (the record knows the tail it left, not where each notice fell among the rows)."""
    last_id = inputs[-1].message_id if inputs else "redrive"
    out: list[OutputEvent] = []
    kept: list[OutputEvent] = []
    for event in events:
        if isinstance(event, TurnCommitted):
            out.extend(row_events(thread_id, event.rows))
        elif isinstance(event, StepFailed | InputRejected):
            source = event.message_id if isinstance(event, InputRejected) else event.source_id or last_id
            kept.append(notice_event(thread_id, kept_notice(event, source)))
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
            kept.append(notice_event(thread_id, kept_notice(event, event.source_id or last_id)))
        elif isinstance(event, TurnComplete):
            out.extend(kept)
            kept.clear()
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
    out.extend(kept)
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


def notice_event(thread_id: str, kept: dict[str, Any]) -> ErrorEvent | LimitReachedOutput:
    """The output event of a notice a step kept (:func:`stepagent.events.kept_notice`): the same event
    whether it is built as the step publishes it or read back from the step's usage record."""
    source = str(kept["source_id"])
    if kept["type"] == LIMIT_REACHED:
        return {
            "type": LIMIT_REACHED,
            "event_id": event_id(thread_id, source, LIMIT_REACHED),
            "limit": str(kept["limit"]),
            "value": kept["value"],
            "used": kept["used"],
        }
    error = error_event(thread_id, str(kept["message"]), kept["retrying"] is True, source)
    if isinstance(kept.get("tool_call_id"), str):
        error["tool_call_id"] = kept["tool_call_id"]
    return error


def record_notices(thread_id: str, record: UsageRecord) -> list[ErrorEvent | LimitReachedOutput]:
    """The notices a committed usage record keeps, as their output events (in the order they happened).
    A record whose notices this version cannot read (a newer writer's) keeps none for it."""
    if record.notices is None:
        return []
    try:
        kept = json.loads(record.notices)
        return [notice_event(thread_id, notice) for notice in kept]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def record_events(thread_id: str, record: UsageRecord) -> list[OutputEvent]:
    """Everything a committed usage record stands for, in the order the step published it: its notices,
    then its ``turn_complete`` when the turn was complete."""
    out: list[OutputEvent] = list(record_notices(thread_id, record))
    if record.turn_complete:
        out.append(turn_complete_from_record(thread_id, record))
    return out


def turn_complete_from_record(thread_id: str, record: UsageRecord) -> TurnCompleteOutput:
    """The ``turn_complete`` event a committed usage record stands for: the same keys and values the step
    that committed it published (usage with cache tokens and cost, the structured output, the model)."""
    output = _OutputValue(json.loads(record.output)) if record.output is not None else None
    return turn_complete_event(
        thread_id, record.version, _usage(record), record.model, cost_usd=record.cost_usd, output=output
    )


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
