"""A tool's question to the user during a call (an MCP elicitation), and the person's answer: checked, kept
durably, and turned into the call's continuation.

The tool runner sends the question as an :class:`~stepagent.messages.InputRequired` input; the person's
answer is an :class:`~stepagent.messages.ElicitationAnswer` input. What this module guarantees:

- **A question is asked only for the call that waits.** A question for a call that is not this thread's
  pending call (answered, interrupted, unknown) is recorded processed and ignored. Otherwise it is kept
  in the state store (a :class:`~stepagent.core.effects.PutPendingQuestion` written before the commit
  records the notice processed, so a re-run writes it again) and reported as ``input_required``. The
  thread keeps its open call: no ``turn_complete``, nothing running.
- **Only a waiting question is answered, once.** An answer for a call with no open question, a call that
  is no longer pending, or a question another answer already took is refused with an
  :class:`~stepagent.events.InputRejected` (an ``error`` output event, ``retrying: false``) and changes
  nothing. The question records which input answered it *before* the step's commit; a redelivery or a
  re-run of that same input finds its own mark and proceeds, any other input is refused.
- **The continuation is durable before it runs.** For a 2026-07-28 server (``stateless``), the answer
  adds the call's dispatch intent — carrying the answer and the server's request state — to the step's
  commit together with the answer's processed id; the outbox (``core/effects.py``) sends it after the
  commit, at most once per idempotency key (the tool call id), and a crash anywhere re-drives the intent
  rather than losing or repeating it. For an older server (``session``), the tool runner holds the call
  open and reads the answer stored here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepagent.core.effects import PutPendingQuestion, StepEffects
from stepagent.core.history import HistoryManager
from stepagent.events import AgentEvent, InputRejected, InputRequiredEvent
from stepagent.messages import ElicitationAnswer, InputRequired
from stepagent.stores.base import DispatchIntent, StateStore
from stepagent.tools.mcp_input import question_key

#: How long an unanswered question stays answerable (a durable wait, like an approval's, bounded so the
#: state item is eventually collected).
QUESTION_TTL_S = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class PendingQuestion:
    """A question as kept: the notice's fields, and — once answered — who answered and how."""

    notice: dict[str, Any]
    answered_by: str | None = None
    answer: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"notice": self.notice, "answered_by": self.answered_by, "answer": self.answer},
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str) -> PendingQuestion:
        value = json.loads(raw)
        return cls(notice=value["notice"], answered_by=value.get("answered_by"), answer=value.get("answer"))


def _expiry() -> float:
    # Wall-clock time, as the store compares it (a step's own clock may be a test's fixed one).
    return time.time() + QUESTION_TTL_S


async def read_question(state: StateStore, thread_id: str, tool_call_id: str) -> PendingQuestion | None:
    """The kept question of a call (``None``: none, or expired)."""
    raw = await state.cache_get(question_key(thread_id, tool_call_id))
    return None if raw is None else PendingQuestion.from_json(raw)


async def fold_question(
    history: HistoryManager,
    effects: StepEffects,
    notice: InputRequired,
    message_id: str,
    emit: Callable[[AgentEvent], None],
) -> None:
    """Keep and report a tool's question (see the module docstring)."""
    pending = history.pending_tool_call()
    if pending is not None and pending.call.id == notice.id:
        kept = PendingQuestion(notice=notice.model_dump(mode="json"))
        key = question_key(history.thread_id, notice.id)
        await effects.change(PutPendingQuestion(key, kept.to_json(), _expiry()))
        emit(
            InputRequiredEvent(
                tool_call_id=notice.id,
                message=notice.message,
                message_id=message_id,
                requested_schema=notice.requested_schema,
                url=notice.url,
            )
        )
    history.record_processed(message_id)


async def fold_answer(
    history: HistoryManager,
    state: StateStore,
    effects: StepEffects,
    answer: ElicitationAnswer,
    message_id: str,
    emit: Callable[[AgentEvent], None],
) -> DispatchIntent | None:
    """Fold a person's answer; the intent to run now for a stateless server (``None`` otherwise)."""
    call_id = answer.tool_call_id
    kept = await read_question(state, history.thread_id, call_id)
    pending = history.pending_tool_call()
    reason = None
    if kept is None or pending is None or pending.call.id != call_id:
        reason = f"there is no tool call {call_id} waiting for an answer in this thread"
    elif kept.answered_by not in (None, message_id):
        reason = f"tool call {call_id} was already answered"
    if reason is not None or kept is None or pending is None:
        history.record_processed(message_id)
        emit(InputRejected(message_id, f"answer refused: {reason}"))
        return None
    given: dict[str, Any] = {"action": answer.action}
    if answer.action == "accept":
        given["content"] = answer.content or {}
    answered = PendingQuestion(notice=kept.notice, answered_by=message_id, answer=given)
    key = question_key(history.thread_id, call_id)
    await effects.change(PutPendingQuestion(key, answered.to_json(), _expiry()))
    history.record_processed(message_id)
    notice = InputRequired.model_validate(kept.notice)
    if notice.era != "stateless":
        return None  # the tool runner holds the call open and reads the answer
    call = pending.call
    resume = {
        "key": notice.key,
        "request_state": notice.request_state,
        "answer": given,
        "round": notice.round,
    }
    intent = DispatchIntent(call.id, call.name, call.arguments, call.call_id, resume=resume)
    history.pending.add_intent(intent)
    return intent
