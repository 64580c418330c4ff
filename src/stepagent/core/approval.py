"""A person's decision on a tool call that waits for approval: checked, then folded into the thread.

A call whose tool needs approval (``ThreadAgent.needs_approval``) is committed like any call, marked
``needs_approval``, with no dispatch intent: nothing runs and the thread waits. The answer is an
:class:`~stepagent.messages.ApprovalDecision` input. What this module guarantees:

- **Only a waiting call is decided.** A decision for a call that is not this thread's trailing, waiting
  call — unknown, already decided, answered, interrupted — or an ``edit`` whose arguments fail the tool's
  JSON Schema is refused with an :class:`~stepagent.events.InputRejected` (an ``error`` output event,
  ``retrying: false``, with the decision's ``tool_call_id``, kept with the thread so history and replays
  show it) and changes nothing else but recording the input as processed: the call keeps waiting.
- **The decision is durable before the call runs.** A decision becomes an
  :class:`~stepagent.history_items.ApprovalItem` row (the input's logical id is its row id) in the step's
  commit; ``approve`` and ``edit`` add the call's dispatch intent — with the edited arguments — to the same
  commit, so the outbox (``core/effects.py``) dispatches it after the commit, at most once per idempotency
  key (the tool call id), and a crash anywhere re-drives the intent rather than losing or repeating the
  decision. ``reject`` and ``respond`` add the call's result instead (the tool never runs) and the model
  continues in the same step.
- **Redelivery is harmless.** The decision input's id is recorded processed in the same commit; a
  redelivered decision is ignored before it reaches here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from stepagent import texts
from stepagent.core.history import HistoryManager
from stepagent.errors import ToolError
from stepagent.events import AgentEvent, InputRejected
from stepagent.history_items import ApprovalItem, ToolResultItem
from stepagent.messages import ApprovalDecision, ToolResult
from stepagent.stores.base import DispatchIntent
from stepagent.tools.base import Tool, Toolset
from stepagent.tools.functions import FunctionTool


@dataclass(frozen=True, slots=True)
class Folded:
    """What a decision did: ``intent`` — the call to run now (``approve``, ``edit``); ``answered`` — the
    call got its result (``reject``, ``respond``) and the model should continue."""

    intent: DispatchIntent | None = None
    answered: bool = False


def fold_decision(
    history: HistoryManager,
    decision: ApprovalDecision,
    message_id: str,
    toolset: Toolset,
    emit: Callable[[AgentEvent], None],
) -> Folded:
    """Fold one decision into ``history`` (pending changes, committed by the step); see the module docstring."""
    waiting = history.waiting_for_approval()
    if waiting is None or waiting.call.id != decision.tool_call_id:
        return _refuse(history, message_id, emit, _not_waiting(history, decision.tool_call_id), decision)
    call = waiting.call
    arguments = call.arguments
    if decision.decision == "edit":
        assert decision.args is not None  # ApprovalDecision requires it
        problem = edit_problem(toolset.get(call.name), decision.args)
        if problem is not None:
            reason = (
                f"the edited arguments for {call.name} ({call.id}) are invalid: {problem}; it keeps waiting"
            )
            return _refuse(history, message_id, emit, reason, decision)
        arguments = decision.args
    row = ApprovalItem(call.id, decision.decision, decision.args, decision.message)
    history.append_generated(row, message_id)
    history.record_processed(message_id)
    if decision.decision in ("approve", "edit"):
        intent = DispatchIntent(call.id, call.name, arguments, call.call_id)
        history.pending.add_intent(intent)
        return Folded(intent=intent)
    if decision.decision == "reject":
        note = (decision.message or "").strip()
        text = texts.APPROVAL_REJECTED_WITH_MESSAGE.format(message=note) if note else texts.APPROVAL_REJECTED
    else:
        text = decision.message or ""
    result = ToolResult.text(call.id, text, call_id=call.call_id)
    history.append_generated(ToolResultItem(result=result), f"{call.id}-{decision.decision}")
    return Folded(answered=True)


def edit_problem(tool: Tool | None, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit ``tool``'s JSON Schema (``None``: they do). A function tool checks them
    with the same pydantic validation its run uses."""
    if tool is None:
        return "the tool is no longer available"
    if isinstance(tool, FunctionTool):
        try:
            tool.validate(arguments)
        except ToolError as error:
            return str(error)
        return None
    validator_class = jsonschema.validators.validator_for(tool.parameters)
    errors = sorted(validator_class(tool.parameters).iter_errors(arguments), key=lambda e: list(e.path))
    if not errors:
        return None
    return "; ".join(f"{'/'.join(map(str, e.path)) or '(arguments)'}: {e.message}" for e in errors[:5])


def _not_waiting(history: HistoryManager, tool_call_id: str) -> str:
    found = history.find_tool_call(tool_call_id)
    if found is None:
        return f"there is no tool call {tool_call_id} waiting for approval in this thread"
    name = found.call.name
    if not found.needs_approval:
        return f"tool call {tool_call_id} ({name}) does not wait for approval"
    decided = any(isinstance(i, ApprovalItem) and i.tool_call_id == tool_call_id for i in history.history)
    if decided:
        return f"tool call {tool_call_id} ({name}) was already decided"
    return f"tool call {tool_call_id} ({name}) is no longer waiting for approval (it was interrupted)"


def _refuse(
    history: HistoryManager,
    message_id: str,
    emit: Callable[[AgentEvent], None],
    reason: str,
    decision: ApprovalDecision,
) -> Folded:
    refusal = InputRejected(message_id, f"approval refused: {reason}", tool_call_id=decision.tool_call_id)
    history.refuse(refusal)
    emit(refusal)
    return Folded()
