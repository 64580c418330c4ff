"""The output queue's events as TypedDicts: what :mod:`stepagent.aws.outputs` builds and what a consumer
of the output queue receives, checked by the type checker where they are made.

Guarantees: each event kind has its own type with a ``Literal`` ``type``; :data:`OutputEvent` is their
union. The thread context (``thread_id``, ``root_thread_id``, ``metadata``) is added when an event is
published, so these types leave it out. ``args``, ``output`` and the tool-facing values stay open JSON
(``Any``): they are whatever the model or a tool produced.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


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


class ErrorEvent(TypedDict):
    """A failure the thread is told about; ``retrying`` says whether its input will be tried again."""

    type: Literal["error"]
    event_id: str
    message: str
    retrying: bool
    attempts: NotRequired[int]


class OAuthRequiredOutput(TypedDict):
    """A tool needs the user to open a link first."""

    type: Literal["oauth_required"]
    event_id: str
    auth_url: str
    tool_call_id: str


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


class LimitReachedOutput(TypedDict):
    """A spending limit stopped the thread before a model call."""

    type: Literal["limit_reached"]
    event_id: str
    limit: str
    value: float
    used: float


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
    | ErrorEvent
    | OAuthRequiredOutput
    | UserChoiceRequiredOutput
    | UserChoiceCompleteOutput
    | LimitReachedOutput
    | TurnCompleteOutput
    | ViewUpdateEvent
)
