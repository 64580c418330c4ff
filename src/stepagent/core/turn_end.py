"""How a step that ran (or refused to run) the model ends: its usage record, its events, its notices.

What it guarantees (:func:`end_of_turn`, a pure function of the completion's outcome):

- **One usage record.** A step that runs the model keeps one :class:`~stepagent.stores.base.UsageRecord`
  (tokens summed over its model calls, the model's name, the cost, whether the turn is complete, the
  root's validated structured answer) with its rows; the commit adds its tokens and cost to the
  conversation's spend. A limit that stopped the step before any model call is kept in a record of no
  usage, once: a redelivery that stops again (:func:`stop_kept`) keeps nothing new and re-reports the
  same events.
- **Events in order.** After the commit: ``CompletionFinished``, then what ended the turn — a
  ``StepFailed`` (not retrying) for a refusal, a model failure or answers that stayed invalid against the
  output schema (naming the errors), then ``LimitReached`` — then ``ApprovalRequested`` for a call that
  waits for a person. What ended the turn is also kept with the thread (``UsageRecord.notices``).
- **Turn complete last.** When the step leaves the thread with nothing pending — no open tool call, no
  held input, not interrupted, no compaction awaited — :meth:`TurnEnd.turn_complete` is the
  :class:`~stepagent.events.TurnComplete` to emit after everything else, carrying the record's usage and
  the structured answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from stepagent.core.completion import CompletionOutcome
from stepagent.core.history import HistoryManager
from stepagent.events import (
    AgentEvent,
    ApprovalRequested,
    CompletionFinished,
    LimitReached,
    StepFailed,
    TurnComplete,
    kept_notice,
)
from stepagent.history_items import ToolCallItem
from stepagent.providers.base import Usage
from stepagent.stores.base import ConversationStore, UsageRecord


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """What a step commits and reports at its end (see the module docstring)."""

    #: The step's usage record (``None``: a redelivery whose stop is already kept).
    usage: UsageRecord | None
    #: Notices to keep with the thread (what ended the turn).
    notices: list[dict[str, Any]]
    #: Events to emit after the commit, in order.
    observe: list[AgentEvent]
    #: Why the turn ended in an error (``None``: it did not).
    error: str | None
    _done: TurnComplete | None

    def turn_complete(self, version: int) -> TurnComplete | None:
        """The event that says the turn is complete, at the head ``version`` the commit left."""
        return None if self._done is None else replace(self._done, version=version)


def end_of_turn(
    outcome: CompletionOutcome,
    *,
    step_id: str,
    model: str,
    context_window: int,
    output_retries: int,
    complete: bool,
    cost: float | None,
    stop_kept: bool,
    waiting: ToolCallItem | None,
) -> TurnEnd:
    """The end of a step whose completion ended with ``outcome``. ``complete``: the step leaves the thread
    with nothing pending; ``cost``: what the step's usage cost; ``stop_kept``: an earlier run of this step
    already kept its limit stop; ``waiting``: the call that waits for a person's decision, if any."""
    step_usage = outcome.step_usage or Usage()
    error = _error(outcome, output_retries)
    stopped: list[StepFailed | LimitReached] = []
    if error is not None:
        stopped.append(StepFailed(message=error, retrying=False, source_id=step_id))
    if outcome.limit is not None:
        stopped.append(replace(outcome.limit, source_id=step_id))
    finished = CompletionFinished(
        usage=outcome.usage, context_window=context_window, step_usage=outcome.step_usage, model=model
    )
    asked = (
        []
        if waiting is None
        else [ApprovalRequested(waiting.call.name, waiting.call.arguments, waiting.call.id)]
    )
    done = None
    if complete:
        done = TurnComplete(
            usage=step_usage,
            model=model,
            step_id=step_id,
            version=0,
            cost_usd=cost,
            output=outcome.output,
            has_output=outcome.has_output,
        )
    return TurnEnd(
        usage=None if stop_kept else _usage_record(outcome, step_id, model, complete, cost),
        notices=[] if stop_kept else [kept_notice(event, step_id) for event in stopped],
        observe=[finished, *stopped, *asked],
        error=error,
        _done=done,
    )


def _usage_record(
    outcome: CompletionOutcome, step_id: str, model: str, complete: bool, cost: float | None
) -> UsageRecord:
    if outcome.limit is not None and not outcome.completions:
        # A limit that stopped the step before any model call: its stop is kept in a record of no usage.
        return UsageRecord(step_id=step_id, model=model, turn_complete=complete, cost_usd=cost)
    usage = outcome.step_usage or Usage()
    return UsageRecord(
        step_id=step_id,
        model=model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        completions=outcome.completions,
        turn_complete=complete,
        cost_usd=cost,
        output=json.dumps(outcome.output) if outcome.has_output else None,
    )


def _error(outcome: CompletionOutcome, output_retries: int) -> str | None:
    """The error that ended the turn: the refusal, the model's failure or the answers' schema errors."""
    if outcome.refusal is not None:
        return outcome.refusal
    if outcome.error is not None:
        return f"The model failed: {outcome.error}"
    if outcome.output_errors:
        attempts = output_retries + 1
        return (
            f"The answer did not match the output schema after {attempts} attempt"
            f"{'s' if attempts != 1 else ''}: " + "; ".join(outcome.output_errors)
        )
    return None


async def stop_kept(
    conversation: ConversationStore, history: HistoryManager, step_id: str, outcome: CompletionOutcome
) -> bool:
    """Whether the thread's last commit already kept this step's limit stop (a redelivery of it); only a
    limit that stopped the step before any model call is kept that way."""
    limit = outcome.limit
    if limit is None or outcome.completions or history.version == 0:
        return False
    kept = kept_notice(replace(limit, source_id=step_id), step_id)
    async for record in conversation.usage_records(history.thread_id, after_version=history.version - 1):
        if record.step_id == step_id and record.notices is not None and kept in json.loads(record.notices):
            return True
    return False
