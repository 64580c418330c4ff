"""The output events as TypedDicts: what :mod:`stepagent.outputs.build` makes and what a consumer of the
output queue or of the HTTP API's stream receives, checked by the type checker where they are made.

Guarantees: each event kind has its own type with a ``Literal`` ``type``; :data:`OutputEvent` is their
union. ``args``, ``output`` and the tool-facing values stay open JSON (``Any``): they are whatever the model
or a tool produced. The kinds a thread's ``LIVE`` item also keeps as notices (``error``,
``oauth_required`` and the limit stop) are defined in :mod:`stepagent.notices`, below the stores that
decode them, and re-exported here.

**The thread context.** An event is made without it; :func:`in_thread` adds ``thread_id``,
``root_thread_id`` and ``metadata`` (the root's stored metadata) after the event's own keys when it is
published (the output queue) or streamed (the HTTP API), the same function for both. Each kind has its ``...InThread`` form, and
:data:`OutputEventInThread` is their union: what a consumer receives.

The TypedDicts come from ``typing_extensions`` (as those of :mod:`stepagent.notices`): a thread-context
form inherits from both an event kind and :class:`ThreadContext`, which must share their base.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, cast

from typing_extensions import TypedDict

from stepagent.notices import ErrorEvent as ErrorEvent
from stepagent.notices import InputRequiredOutput as InputRequiredOutput
from stepagent.notices import LimitReachedOutput as LimitReachedOutput
from stepagent.notices import OAuthRequiredOutput as OAuthRequiredOutput
from stepagent.notices import OtherNotice


class TextEvent(TypedDict):
    """A committed assistant text."""

    type: Literal["text"]
    event_id: str
    text: str


class ToolCallEvent(TypedDict):
    """A committed tool call; ``approval_required`` follows one that waits for a person's decision."""

    type: Literal["tool_call", "approval_required"]
    event_id: str
    name: str
    args: dict[str, Any]
    tool_call_id: str


class ToolResultEvent(TypedDict):
    """A committed tool result, or a report or subscription event folded into the thread (``event``)."""

    type: Literal["tool_result", "event"]
    event_id: str
    tool_call_id: str
    text: str


class ApprovalEvent(TypedDict):
    """A person's decision on a call that waited for approval, as committed: ``decision``, where it left
    the call (``approval``: ``approved``, ``edited``, ``rejected``, ``responded``), the edited ``args`` of
    an ``edit`` (what the tool runs with and the model sees from then on), and the ``message``."""

    type: Literal["approval"]
    event_id: str
    tool_call_id: str
    decision: Literal["approve", "edit", "reject", "respond"]
    approval: Literal["approved", "edited", "rejected", "responded"]
    args: NotRequired[dict[str, Any]]
    message: NotRequired[str]


class UserChoiceRequiredOutput(TypedDict):
    """A tool asks the user to pick one of ``choices``."""

    type: Literal["user_choice_required"]
    event_id: str
    id: str
    prompt: str
    choices: list[str]
    default: int
    response_url: str


class UserChoiceCompleteOutput(TypedDict):
    """A pending choice was answered or dismissed."""

    type: Literal["user_choice_complete"]
    event_id: str
    choice_id: str


class UsageCounts(TypedDict):
    """The tokens (and dollars, when the model's prices are known) of a step's model calls."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: NotRequired[float]


class TurnCompleteOutput(TypedDict):
    """The step ran the model and left the thread with nothing pending."""

    type: Literal["turn_complete"]
    event_id: str
    usage: UsageCounts
    model: str
    output: NotRequired[Any]


class ViewUpdateEvent(TypedDict):
    """A RAP tool's live view of its work (``content`` is the tool's JSON). The RAP receiver builds it as
    :class:`~stepagent.rap.receiver.ViewUpdateOutput`, the same shape (TypedDicts match by shape), which is
    not imported here so that a worker's cold start does not load the RAP modules."""

    type: Literal["view_update"]
    event_id: str
    view_type: str
    content: Any


OutputEvent = (
    TextEvent
    | ToolCallEvent
    | ToolResultEvent
    | ApprovalEvent
    | ErrorEvent
    | OAuthRequiredOutput
    | InputRequiredOutput
    | UserChoiceRequiredOutput
    | UserChoiceCompleteOutput
    | LimitReachedOutput
    | TurnCompleteOutput
    | ViewUpdateEvent
)


class ThreadContext(TypedDict):
    """What publishing adds to an event: its thread, the thread tree's root and the root's metadata (the
    stored value, ``{}`` when none)."""

    thread_id: str
    root_thread_id: str
    metadata: Any


class TextEventInThread(TextEvent, ThreadContext):
    """A ``text`` event as published."""


class ToolCallEventInThread(ToolCallEvent, ThreadContext):
    """A ``tool_call`` or ``approval_required`` event as published."""


class ToolResultEventInThread(ToolResultEvent, ThreadContext):
    """A ``tool_result`` or ``event`` event as published."""


class ApprovalEventInThread(ApprovalEvent, ThreadContext):
    """An ``approval`` event as published."""


class ErrorEventInThread(ErrorEvent, ThreadContext):
    """An ``error`` event as published."""


class OAuthRequiredInThread(OAuthRequiredOutput, ThreadContext):
    """An ``oauth_required`` event as published."""


class InputRequiredInThread(InputRequiredOutput, ThreadContext):
    """An ``input_required`` event as published."""


class UserChoiceRequiredInThread(UserChoiceRequiredOutput, ThreadContext):
    """A ``user_choice_required`` event as published."""


class UserChoiceCompleteInThread(UserChoiceCompleteOutput, ThreadContext):
    """A ``user_choice_complete`` event as published."""


class LimitReachedInThread(LimitReachedOutput, ThreadContext):
    """A limit event as published."""


class TurnCompleteInThread(TurnCompleteOutput, ThreadContext):
    """A ``turn_complete`` event as published."""


class ViewUpdateEventInThread(ViewUpdateEvent, ThreadContext):
    """A ``view_update`` event as published."""


OutputEventInThread = (
    TextEventInThread
    | ToolCallEventInThread
    | ToolResultEventInThread
    | ApprovalEventInThread
    | ErrorEventInThread
    | OAuthRequiredInThread
    | InputRequiredInThread
    | UserChoiceRequiredInThread
    | UserChoiceCompleteInThread
    | LimitReachedInThread
    | TurnCompleteInThread
    | ViewUpdateEventInThread
)
"""An output event with its thread context: one message body of the output queue, one event of the HTTP
API's stream."""


def in_thread(event: OutputEvent, context: ThreadContext) -> OutputEventInThread:
    """``event`` with ``context`` after its own keys (a key of both takes the context's value in place)."""
    # Each kind's ...InThread form is exactly that kind plus ThreadContext, which this merge builds; the
    # type checker follows a ``**`` of a TypedDict only for a single kind, not over the union, hence the cast.
    return cast(OutputEventInThread, {**event, **context})


class TextDeltaEvent(TypedDict):
    """The HTTP API stream's live partial text of a thread (not an output-queue event): the part of the
    reply being written that the stream has not sent yet."""

    type: Literal["text_delta"]
    thread_id: str
    root_thread_id: str
    text: str


class OtherNoticeInThread(OtherNotice, ThreadContext):
    """A notice of a kind this version does not read, as stored, with the thread context."""
