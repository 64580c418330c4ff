"""The notices of a thread: the output events a thread's ``LIVE`` item also keeps, so that a client that
does not read the output queue still sees them — and how a stored one is read back.

Guarantees:

- **One definition.** :class:`ErrorEvent`, :class:`OAuthRequiredOutput` and :class:`LimitReachedOutput`
  are the output queue's ``error``, ``oauth_required`` and ``limit_reached`` events
  (:mod:`stepagent.outputs.events` re-exports them); they live here, below the stores, so that the
  ``LIVE`` item's reader can decode them. A notice is stored as the event's compact JSON, without the
  thread context.
- **Read as stored.** :func:`read_notice` returns the stored JSON object itself, never a normalised copy:
  its keys' order, any key this version does not know and numbers as written (``50``, not ``50.0``) are
  kept, so what the HTTP API forwards is byte for byte what was recorded.
- **A clear rule for the rest.** An object whose ``type`` is one of the kinds above and whose fields have
  that kind's types (checked strictly by pydantic: no ``"3"`` for a number, no ``1`` for a boolean) is
  that kind. Any other JSON object with a string ``type`` (a newer writer's kind, or a known kind whose
  fields do not fit) is an :class:`UnknownNotice`, kept as stored: the HTTP API forwards it as it always
  has, the other readers pass over it or show it as a plain error. Anything else — not JSON, not an
  object, no string ``type`` — is skipped (logged at debug: a poller reads the item every second).

The TypedDicts come from ``typing_extensions``: pydantic validates only those on Python 3.11, and the
thread-context forms that extend them (:mod:`stepagent.outputs.events`) must share their base.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any, Final, Literal, NotRequired, cast

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

log = logging.getLogger(__name__)


#: The kind of the event that says a limit stopped a thread: the one place its name is spelled.
LIMIT_REACHED: Final = "limit_reached"
#: The notice kinds a step also keeps with the thread (its usage record): refusals, answers given up on,
#: limit stops.
KEPT_NOTICE_KINDS: Final = ("error", LIMIT_REACHED)
#: The notice kinds a call waits on the person for (a sign-in link, a question): a client that starts
#: reading while the call still waits is shown them again.
WAITING_NOTICE_KINDS: Final = ("oauth_required", "input_required")


class ErrorEvent(TypedDict):
    """A failure the thread is told about; ``retrying`` says whether its input will be tried again."""

    type: Literal["error"]
    event_id: str
    message: str
    retrying: bool
    attempts: NotRequired[int]
    #: The tool call a refused input named (a decision on a call that is not waiting).
    tool_call_id: NotRequired[str]


class OAuthRequiredOutput(TypedDict):
    """A tool needs the user to open a link first."""

    type: Literal["oauth_required"]
    event_id: str
    auth_url: str
    tool_call_id: str


class InputRequiredOutput(TypedDict):
    """A tool asks the user a question during a call: a form (``requested_schema``) or a page (``url``)."""

    type: Literal["input_required"]
    event_id: str
    tool_call_id: str
    message: str
    requested_schema: NotRequired[dict[str, Any]]
    url: NotRequired[str]


class LimitReachedOutput(TypedDict):
    """A spending limit stopped the thread before a model call."""

    type: Literal["limit_reached"]
    event_id: str
    limit: str
    value: float
    used: float


Notice = ErrorEvent | OAuthRequiredOutput | InputRequiredOutput | LimitReachedOutput
"""A notice of a kind this version reads."""


class OtherNotice(TypedDict):
    """A stored notice of any other kind: only ``type`` is declared; its other keys are as stored."""

    type: str


@dataclass(frozen=True, slots=True)
class UnknownNotice:
    """A stored notice that is not a :data:`Notice` (see the module docstring), kept as stored."""

    fields: OtherNotice

    @property
    def type(self) -> str:
        return self.fields["type"]


LiveNotice = Notice | UnknownNotice
"""A notice as a ``LIVE`` item's reader gets it."""


@functools.cache
def _kinds() -> dict[str, TypeAdapter[Any]]:
    # Built on the first read, not at import: the worker only writes notices, and its cold start would
    # pay some 10 ms for these validators.
    return {
        "error": TypeAdapter(ErrorEvent),
        "oauth_required": TypeAdapter(OAuthRequiredOutput),
        "input_required": TypeAdapter(InputRequiredOutput),
        LIMIT_REACHED: TypeAdapter(LimitReachedOutput),
    }


def read_notice(stored: str) -> LiveNotice | None:
    """The notice a ``LIVE`` item holds as ``stored`` JSON (``None``: unreadable, skipped)."""
    try:
        value = json.loads(stored)
    except ValueError:
        log.debug("skipped a stored notice that is not JSON: %.200s", stored)
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        log.debug("skipped a stored notice that is not an object with a type: %.200s", stored)
        return None
    kind = _kinds().get(value["type"])
    if kind is None:
        return UnknownNotice(cast(OtherNotice, value))
    try:
        kind.validate_python(value, strict=True)
    except ValidationError as error:
        log.debug(
            "a stored %s notice does not fit its kind (%s): kept as an unknown one", value["type"], error
        )
        return UnknownNotice(cast(OtherNotice, value))
    # Validated just above; the stored object itself is returned (see the module docstring).
    return cast(Notice, value)


#: Per limit: what it is called, its unit, the setting and profile key that raise it.
_LIMITS: dict[str, tuple[str, str, str]] = {
    "model_calls_per_turn": (
        "model-call limit for one turn",
        "model calls",
        "STEPAGENT_MAX_MODEL_CALLS_PER_TURN (or the profile's max_model_calls_per_turn)",
    ),
    "conversation_tokens": (
        "conversation token limit",
        "tokens",
        "STEPAGENT_MAX_CONVERSATION_TOKENS (or the profile's max_conversation_tokens)",
    ),
    "conversation_cost_usd": (
        "conversation cost limit",
        "$",
        "STEPAGENT_MAX_CONVERSATION_COST_USD (or the profile's max_conversation_cost_usd)",
    ),
}


def limit_text(notice: LimitReachedOutput) -> str:
    """A ``limit_reached`` notice in words, for a person: what was reached, with its unit, and what to do
    next (a per-turn limit ends with the turn; a conversation limit holds until it is raised)."""
    limit, value, used = notice["limit"], notice["value"], notice["used"]
    known = _LIMITS.get(limit)
    if known is None:
        return f"{limit} limit reached ({used} of {value}): the agent stopped before calling the model"
    name, unit, setting = known
    amount = f"${used:,.4f} of ${value:,.4g}" if unit == "$" else f"{used:,.0f} of {value:,.0f} {unit}"
    if limit == "model_calls_per_turn":
        return (
            f"{name} reached: {amount} — the agent stopped before calling the model again; your next "
            f"message starts a new turn (and a new count), or raise {setting}"
        )
    return (
        f"{name} reached: {amount} — raise {setting} to continue; this conversation stays stopped until then"
    )
