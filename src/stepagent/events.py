"""Observer events: what a step tells the outside world while and after it runs.

Ordering contract (per step): input echoes and choice/OAuth/compaction events in input order →
``UserChoiceDismissed`` for interrupted calls → ``CompletionStarted`` → stream events → ``TurnCommitted``
(the rows this step made durable, with their orders) → ``CompletionFinished`` → ``ApprovalRequested`` (a
call left waiting for a person) → dispatch errors as ``Info`` → ``TurnComplete`` (last, only when the step
left the thread with nothing pending).
``TurnCommitted``, ``CompletionFinished`` and ``TurnComplete`` are emitted only after the commit
succeeded; ``TurnComplete`` carries exactly the usage record that commit stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from stepagent.messages import UserChoiceRequired
from stepagent.notices import LIMIT_REACHED
from stepagent.providers.base import Usage
from stepagent.stores.base import StoredRow


@dataclass(frozen=True, slots=True)
class UserInput:
    """A user's text input, echoed (without the interrupt marker)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolResultReceived:
    """A tool result arrived as input: its display segments, then its text."""

    segments: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class SubscriptionEventReceived:
    """An event of a subscription, or a child's report, arrived inline; ``name`` says where it came from."""

    name: str
    text: str


@dataclass(frozen=True, slots=True)
class OAuthRequiredEvent:
    """A tool needs the user to authorise it at ``auth_url`` (the ``oauth_required`` output event)."""

    auth_url: str
    tool_call_id: str


@dataclass(frozen=True, slots=True)
class InputRequiredEvent:
    """A tool asks the user a question during call ``tool_call_id`` (the ``input_required`` output event):
    ``message`` and a form's ``requested_schema`` or a page's ``url``; ``message_id`` is the notice's
    logical id (the event's stable id derives from it)."""

    tool_call_id: str
    message: str
    message_id: str
    requested_schema: dict[str, Any] | None = None
    url: str | None = None


@dataclass(frozen=True, slots=True)
class CompactionApplied:
    """A compaction summary was applied to the thread."""

    pass


@dataclass(frozen=True, slots=True)
class CompletionStarted:
    """The step is about to run the model."""

    pass


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A piece of the model's streamed text."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingStarted:
    """The model started streaming reasoning."""

    pass


@dataclass(frozen=True, slots=True)
class ThinkingChunk:
    """A piece of the model's streamed reasoning (or of a tool call being streamed)."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingEnded:
    """The model's streamed reasoning ended."""

    pass


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """The model called a known tool; it is about to be run or dispatched."""

    name: str
    arguments: dict[str, Any]
    tool_call_id: str
    display_as: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """The step committed a call that waits for a person's decision and dispatched nothing (the
    ``approval_required`` output event comes from the committed call row itself)."""

    name: str
    arguments: dict[str, Any]
    tool_call_id: str


@dataclass(frozen=True, slots=True)
class TurnCommitted:
    """Rows made durable by this step's commit(s), in order."""

    rows: list[StoredRow]


@dataclass(frozen=True, slots=True)
class CompletionFinished:
    """The step's completion is committed. ``usage`` is the last model call's (what compaction measures);
    ``step_usage`` the sum over every model call of the step (what is billed and stored), by ``model``."""

    usage: Usage | None = None
    context_window: int = 0
    step_usage: Usage | None = None
    model: str = ""


@dataclass(frozen=True, slots=True)
class TurnComplete:
    """The step ran the model and left the thread with nothing pending (no open tool call, no held
    input): the agent has finished its turn. ``usage`` sums the step's model calls; ``step_id`` is the
    logical id of the input it answered (stable across redeliveries)."""

    usage: Usage
    model: str
    step_id: str
    #: The head version of the commit that stored the step's usage record (the event's stable identity).
    version: int = 0
    #: What ``usage`` cost in dollars (``None``: the model's prices are unknown).
    cost_usd: float | None = None
    #: The turn's validated structured output (only when an output schema is configured and the answer
    #: matched it: ``has_output``; the value itself may be JSON ``null``).
    output: Any = None
    has_output: bool = False


@dataclass(frozen=True, slots=True)
class LimitReached:
    """A spending limit stopped the thread before a model call (its output event):
    ``limit`` is ``model_calls_per_turn``, ``conversation_tokens`` or ``conversation_cost_usd``, ``value``
    the configured limit and ``used`` what had been used. The turn ends there (``TurnComplete`` follows)."""

    limit: str
    value: float
    used: float
    #: The logical id of the input the step answered (its event's id derives from it).
    source_id: str | None = None


@dataclass(frozen=True, slots=True)
class UserChoiceRequiredEvent:
    """A tool asks the user to choose (the ``user_choice_required`` output event); the choice is stored as
    pending."""

    choice: UserChoiceRequired


@dataclass(frozen=True, slots=True)
class UserChoiceDismissed:
    """A pending choice is no longer open: answered, or its call interrupted (``user_choice_complete``)."""

    choice_id: str


@dataclass(frozen=True, slots=True)
class Info:
    """A line of information for the user (e.g. a compaction triggered, a re-dispatch, a dispatch error)."""

    text: str


@dataclass(frozen=True, slots=True)
class InputRejected:
    """An input was refused and had no effect (a report from a thread that is not a child, an event for a
    subscription the thread does not have, a ``compaction_complete`` with nothing to apply, ...). It is
    recorded as processed; the outside world is told why (an ``error`` output event), never only a log."""

    message_id: str
    reason: str
    #: The tool call the refused input named (a decision on a call that is not waiting), if any.
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        """The refusal in words, as its ``error`` event carries it."""
        return f"Ignored input message {self.message_id}: {self.reason}"


@dataclass(frozen=True, slots=True)
class StepFailed:
    """The step failed with a (transient) error; the input will be retried."""

    message: str
    retrying: bool
    #: The logical id of the input the step answered (its ``error`` event's id derives from it).
    source_id: str | None = None


def kept_notice(event: InputRejected | StepFailed | LimitReached, source_id: str) -> dict[str, Any]:
    """The JSON a step keeps with the thread for a refusal, an answer given up on or a limit stop (the
    output notice's own fields and ``source_id``; see ``UsageRecord.notices``)."""
    if isinstance(event, LimitReached):
        return {
            "type": LIMIT_REACHED,
            "source_id": source_id,
            "limit": event.limit,
            "value": event.value,
            "used": event.used,
        }
    if isinstance(event, InputRejected):
        notice: dict[str, Any] = {
            "type": "error",
            "source_id": event.message_id,
            "message": event.text,
            "retrying": False,
        }
        if event.tool_call_id is not None:
            notice["tool_call_id"] = event.tool_call_id
        return notice
    return {"type": "error", "source_id": source_id, "message": event.message, "retrying": event.retrying}


AgentEvent = (
    UserInput
    | ToolResultReceived
    | SubscriptionEventReceived
    | OAuthRequiredEvent
    | InputRequiredEvent
    | CompactionApplied
    | CompletionStarted
    | TextChunk
    | ThinkingStarted
    | ThinkingChunk
    | ThinkingEnded
    | ToolCallStarted
    | ApprovalRequested
    | TurnCommitted
    | CompletionFinished
    | UserChoiceRequiredEvent
    | UserChoiceDismissed
    | Info
    | InputRejected
    | StepFailed
    | LimitReached
    | TurnComplete
)


class Observer(Protocol):
    """Receives a step's events, in the order the module docstring gives."""

    def on_event(self, thread_id: str, event: AgentEvent) -> None: ...


@dataclass(slots=True)
class EventCollector:
    """An observer that records ``(thread_id, event)`` pairs."""

    events: list[tuple[str, AgentEvent]] = field(default_factory=list)

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        self.events.append((thread_id, event))

    def take(self) -> list[tuple[str, AgentEvent]]:
        events, self.events = self.events, []
        return events

    def of(self, thread_id: str) -> list[AgentEvent]:
        return [event for tid, event in self.events if tid == thread_id]
