"""The order a step folds its inputs in, while a tool call may be pending: a pure function, no reads.

What it guarantees (:func:`fold_order`):

- **Deferral.** While a non-passive tool call is pending, events that must wait for its result — reports,
  events and parent messages (:func:`~stepagent.messages.is_deferrable_synthetic`), and a subscription's
  event that overtook its own subscription's start result — are held (stored durably by the step) and
  folded in after the call's result. User text still interrupts the call, and so releases them.
- **Result first.** When the batch holds the call's answer (its result, or a person's reject/respond
  decision on a call that waits for them), the events that reached the batch before the answer follow
  it, in arrival order; nothing else moves.
- **Released in arrival order.** Inputs held by earlier steps are released once the call is answered or
  interrupted (or no call is pending): they go right after the answer (or at the batch's end when the
  batch has none), ahead of anything that arrived after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from stepagent.messages import (
    ApprovalDecision,
    InputMessage,
    SubscriptionEvent,
    ToolResult,
    is_deferrable_synthetic,
)


class Arrival(Protocol):
    """One input of a batch: the message and its logical (dedup) id."""

    @property
    def message(self) -> InputMessage: ...

    @property
    def message_id(self) -> str: ...


A = TypeVar("A", bound=Arrival)


@dataclass(frozen=True, slots=True)
class PendingCall:
    """The thread's pending, non-passive tool call: its id, and whether it waits for a person's decision."""

    id: str
    waits_for_person: bool = False


@dataclass(frozen=True, slots=True)
class FoldPlan(Generic[A]):
    """The batch in fold-in order, and what to do about held inputs.

    ``release_at is None``: the call is still outstanding, nothing is released, and each input whose index
    is in ``hold`` is held unless already processed (a processed one is folded in where it stands, a
    no-op). Otherwise ``hold`` is empty and inputs held earlier are released at index ``release_at`` of
    ``inputs``."""

    inputs: list[A]
    hold: frozenset[int]
    release_at: int | None


def fold_order(batch: Sequence[A], pending: PendingCall | None) -> FoldPlan[A]:
    """Plan the fold-in order of ``batch`` given the thread's pending non-passive call (see the module
    docstring)."""
    inputs = list(batch)
    if pending is None:
        return FoldPlan(inputs, frozenset(), len(inputs))
    answer = next((n for n, i in enumerate(inputs) if _answers(i, pending)), None)
    if answer is not None:
        # Events that reached this batch before the call's result still wait for it.
        early = inputs[:answer]
        waiting = [i for i in early if _waits(i, pending)]
        rest = [i for i in early if not _waits(i, pending)]
        ordered = [*rest, inputs[answer], *waiting, *inputs[answer + 1 :]]
        return FoldPlan(ordered, frozenset(), len(rest) + 1)
    if any(i.message.is_user_text for i in inputs):
        return FoldPlan(inputs, frozenset(), len(inputs))
    return FoldPlan(inputs, frozenset(n for n, i in enumerate(inputs) if _waits(i, pending)), None)


def _waits(item: Arrival, pending: PendingCall) -> bool:
    """Inline events wait for the call's result; so does any event of the pending call itself — a
    subscription's event that overtook its start result cannot be handled before it."""
    synthetic = item.message.synthetic
    return is_deferrable_synthetic(synthetic) or (
        isinstance(synthetic, SubscriptionEvent) and synthetic.tool_call_id == pending.id
    )


def _answers(item: Arrival, pending: PendingCall) -> bool:
    content = item.message.content
    if item.message.synthetic is not None:
        return False
    if isinstance(content, ToolResult):
        return content.id == pending.id
    # A person's reject/respond answers a call that waits for them (approve/edit run it).
    return (
        pending.waits_for_person
        and isinstance(content, ApprovalDecision)
        and content.tool_call_id == pending.id
        and content.decision in ("reject", "respond")
    )
