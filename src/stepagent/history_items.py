"""Stored history items — one content block each — and their versioned codec.

A model turn "text + tool call" is two items. Kinds (the reference's ``kind`` tag):

- ``user``               one user content block (text, image, media); never a tool result
- ``assistant``          one assistant block: text (:class:`AssistantText`) or signed reasoning (:class:`Reasoning`)
- ``tool_call``          one tool call, with an optional display string
- ``tool_result``        one tool result, with optional display segments
- ``subscription_event`` an inline synthetic event: the ``receive_event__injected`` call and its result,
                         attributed to the original call ``tool_call_id``
- ``approval``           a person's decision on a tool call that waited for approval (:class:`ApprovalItem`);
                         never shown to the model: it settles the call (``edit`` replaces its arguments in
                         every later view) and is what makes the decision durable

:class:`Summary` is never stored as a row: the loader materialises a compaction summary as the first item.
It carries a :class:`~stepagent.call_id_filter.CallIdFilter` of the call ids it hides
(:func:`hidden_call_ids`), or ``None`` when they are unknown (a summary from before the filter, or imported).

Codec: :func:`encode_item` writes ``{"v": 1, "kind": ..., ...}`` in the reference's JSON shapes;
:func:`decode_item` reads version 1 and unversioned reference rows, and rejects anything else loudly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from stepagent.call_id_filter import CallIdFilter
from stepagent.errors import CorruptRowError, InvariantViolation
from stepagent.messages import (
    ApprovalDecisionKind,
    ImageContent,
    MediaContent,
    TextContent,
    ToolCall,
    ToolResult,
    UserContent,
)

CODEC_VERSION = 1
SUMMARY_PREFIX = "[Compacted conversation summary]\n"
INJECTED_TOOL_NAME = "receive_event__injected"
APPROVAL_DECISIONS = ("approve", "edit", "reject", "respond")


@dataclass(frozen=True, slots=True)
class UserItem:
    """One user content block: text, an image or other media."""

    content: TextContent | ImageContent | MediaContent

    @property
    def text(self) -> str | None:
        return self.content.text if isinstance(self.content, TextContent) else None


@dataclass(frozen=True, slots=True)
class AssistantText:
    """One assistant text block."""

    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A complete reasoning block. ``signature`` is what providers require to accept it back;
    ``redacted`` holds an encrypted block's opaque data (then ``text`` is empty)."""

    text: str
    signature: str | None = None
    redacted: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallItem:
    """One tool call of the model, with how to display it. ``needs_approval``: the call was committed to
    wait for a person's decision (an :class:`ApprovalItem`) instead of being dispatched."""

    call: ToolCall
    display_as: str | None = None
    needs_approval: bool = False


@dataclass(frozen=True, slots=True)
class ApprovalItem:
    """A person's decision on the waiting call ``tool_call_id``: ``approve``, ``edit`` (with ``args``),
    ``reject`` or ``respond`` (with ``message``)."""

    tool_call_id: str
    decision: ApprovalDecisionKind
    args: dict[str, Any] | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResultItem:
    """One tool result, with its display segments."""

    result: ToolResult
    display_segments: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class EventItem:
    """An inline synthetic event: ``invocation`` (a ``receive_event__injected`` call) answered by ``result``.

    ``tool_call_id`` is the original subscribe/spawn call the event belongs to."""

    result: ToolResult
    tool_call_id: str
    child_thread_id: str | None = None
    invocation: ToolCall | None = None


@dataclass(frozen=True, slots=True)
class Summary:
    """A compaction summary covering the owning thread's orders ``1..up_to_order`` (and what it inherited).

    ``call_ids``: a filter of every tool call id the summary hides (:func:`hidden_call_ids`), so a step can
    tell a new call id is unused without a store read; ``None`` when unknown (ask the store). Derived data,
    not content: equality and ``repr`` ignore it."""

    text: str
    up_to_order: int
    call_ids: CallIdFilter | None = field(default=None, compare=False, repr=False)

    @property
    def rendered(self) -> str:
        return SUMMARY_PREFIX + self.text


HistoryItem = (
    UserItem | AssistantText | Reasoning | ToolCallItem | ToolResultItem | EventItem | ApprovalItem | Summary
)


def answered_call_id(item: HistoryItem) -> str | None:
    """The tool call id an item answers (results and self-contained events), else ``None``."""
    if isinstance(item, ToolResultItem | EventItem):
        return item.result.id
    return None


#: A decided call's ``approval`` state.
DecidedState = Literal["approved", "edited", "rejected", "responded"]
#: A call's ``approval`` state as readers show it (``history --json``, the console, the HTTP API):
#: waiting for a person, or the decision that settled it.
ApprovalState = Literal["pending", "approved", "edited", "rejected", "responded"]

#: The ``approval`` state each decision leaves its call in.
APPROVAL_STATES: dict[ApprovalDecisionKind, DecidedState] = {
    "approve": "approved",
    "edit": "edited",
    "reject": "rejected",
    "respond": "responded",
}


def approval_states(items: Iterable[HistoryItem]) -> dict[str, ApprovalState]:
    """The approval state of every call in ``items`` that waited for a person: ``pending`` while it
    waits, else ``approved``, ``edited``, ``rejected`` or ``responded``. A waiting call answered without a
    decision (user text interrupted it) has no state: no person decided it."""
    states: dict[str, ApprovalState] = {}
    undecided: set[str] = set()
    for item in items:
        if isinstance(item, ToolCallItem) and item.needs_approval:
            states[item.call.id] = "pending"
            undecided.add(item.call.id)
        elif isinstance(item, ApprovalItem) and item.tool_call_id in undecided:
            states[item.tool_call_id] = APPROVAL_STATES[item.decision]
            undecided.discard(item.tool_call_id)
        elif (answered := answered_call_id(item)) is not None and answered in undecided:
            del states[answered]
            undecided.discard(answered)
    return states


def waiting_for_approval(items: Sequence[HistoryItem]) -> ToolCallItem | None:
    """The call a thread whose history is ``items`` waits on a person for, if any: its trailing call was
    committed to wait for approval and no decision or result followed it. (A step that leaves a thread
    so ends waiting on something slow.)"""
    last = items[-1] if items else None
    if isinstance(last, ToolCallItem) and last.needs_approval:
        return last
    return None


def with_decisions_applied(items: Sequence[HistoryItem]) -> list[HistoryItem]:
    """``items`` as the model (and any reader of the conversation) sees them: decision rows removed, and a
    call a person edited shown with the edited arguments."""
    if not any(isinstance(item, ApprovalItem) for item in items):
        return list(items)
    edits = {
        item.tool_call_id: item.args
        for item in items
        if isinstance(item, ApprovalItem) and item.decision == "edit" and item.args is not None
    }
    view: list[HistoryItem] = []
    for item in items:
        if isinstance(item, ApprovalItem):
            continue
        if isinstance(item, ToolCallItem) and item.call.id in edits:
            call = item.call.model_copy(update={"arguments": edits[item.call.id]})
            item = ToolCallItem(call=call, display_as=item.display_as, needs_approval=item.needs_approval)
        view.append(item)
    return view


def item_call_ids(item: HistoryItem) -> tuple[str, ...]:
    """The tool call ids an item uses: a call's id, the id a result or event answers, an event's
    injected invocation id (what :meth:`~stepagent.core.history.HistoryManager.tool_call_id_taken` finds
    in visible history). A summary's hidden ids are in its filter, not here."""
    match item:
        case ToolCallItem(call=call):
            return (call.id,)
        case ToolResultItem(result=result):
            return (result.id,)
        case EventItem(result=result, invocation=invocation):
            return (result.id, invocation.id) if invocation is not None else (result.id,)
    return ()


def hidden_call_ids(items: Iterable[HistoryItem]) -> CallIdFilter | None:
    """The call-id filter of a summary that replaces ``items`` — a model-facing history, which may start
    with the summary it extends (the thread's own earlier one, or an ancestor's): the filters of the
    summaries in it united with the ids of every other item. ``None`` (unknown) when a summary in it has
    no filter: its hidden ids cannot be listed, so the new summary must not claim to know them."""
    found = CallIdFilter()
    for item in items:
        if isinstance(item, Summary):
            if item.call_ids is None:
                return None
            found = found.union(item.call_ids)
        else:
            found = found.with_ids(item_call_ids(item))
    return found


# ----------------------------------------------------------------------------------------------------------
# Codec

_USER_CONTENT: TypeAdapter[TextContent | ImageContent | MediaContent] = TypeAdapter(UserContent)
_TOOL_CALL: TypeAdapter[ToolCall] = TypeAdapter(ToolCall)
_TOOL_RESULT: TypeAdapter[ToolResult] = TypeAdapter(ToolResult)


def item_to_dict(item: HistoryItem) -> dict[str, Any]:
    """The item as a JSON-ready dict in the reference's shape plus ``"v"``."""
    out: dict[str, Any] = {"v": CODEC_VERSION}
    match item:
        case UserItem(content=content):
            out.update(kind="user", content=content.model_dump())
        case AssistantText(text=text):
            out.update(kind="assistant", content={"text": text})
        case Reasoning(text=text, signature=signature, redacted=redacted):
            block: dict[str, Any] = {"reasoning": [text] if text else [], "signature": signature}
            if redacted is not None:
                block["redacted"] = redacted
            out.update(kind="assistant", content=block)
        case ToolCallItem(call=call, display_as=display_as, needs_approval=needs_approval):
            out.update(kind="tool_call", call=call.model_dump())
            if display_as is not None:
                out["display_as"] = display_as
            if needs_approval:
                out["needs_approval"] = True
        case ApprovalItem():
            out.update(_approval_to_dict(item))
        case ToolResultItem(result=result, display_segments=segments):
            out.update(kind="tool_result", result=result.model_dump())
            if segments is not None:
                out["display_segments"] = segments
        case EventItem(result=result, tool_call_id=original, child_thread_id=child, invocation=invocation):
            out.update(kind="subscription_event", result=result.model_dump(), tool_call_id=original)
            if child is not None:
                out["child_thread_id"] = child
            if invocation is not None:
                out["invocation"] = invocation.model_dump()
        case Summary():
            raise InvariantViolation("a compaction summary is stored as a summary, never as a history row")
    return out


def _approval_to_dict(item: ApprovalItem) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "approval", "tool_call_id": item.tool_call_id, "decision": item.decision}
    if item.args is not None:
        out["args"] = item.args
    if item.message is not None:
        out["message"] = item.message
    return out


def encode_item(item: HistoryItem) -> str:
    """Deterministic compact JSON for storage (same item → same bytes)."""
    return json.dumps(item_to_dict(item), ensure_ascii=False, separators=(",", ":"), sort_keys=False)


def item_from_dict(raw: dict[str, Any]) -> HistoryItem:
    """The item of a row already parsed from JSON.

    Raises :class:`~stepagent.errors.CorruptRowError` for an unknown codec version or kind, or a malformed
    row."""
    version = raw.get("v", 0)
    if version not in (0, CODEC_VERSION):
        raise CorruptRowError(
            f"history row has codec version {version!r}; this build reads up to {CODEC_VERSION}"
        )
    kind = raw.get("kind")
    try:
        if kind == "user":
            return UserItem(content=_USER_CONTENT.validate_python(raw["content"]))
        if kind == "assistant":
            content = raw["content"]
            if "text" in content:
                return AssistantText(text=str(content["text"]))
            if "reasoning" in content or "redacted" in content:
                parts = content.get("reasoning") or []
                return Reasoning(
                    text="".join(str(p) for p in parts),
                    signature=content.get("signature"),
                    redacted=content.get("redacted"),
                )
            raise CorruptRowError(f"assistant row with unknown content keys {sorted(content)}")
        if kind == "tool_call":
            return ToolCallItem(
                call=_TOOL_CALL.validate_python(raw["call"]),
                display_as=raw.get("display_as"),
                needs_approval=raw.get("needs_approval") is True,
            )
        if kind == "approval":
            args = raw.get("args")
            message = raw.get("message")
            if raw["decision"] not in APPROVAL_DECISIONS or not (args is None or isinstance(args, dict)):
                raise TypeError(f"decision {raw['decision']!r} with args {args!r}")
            return ApprovalItem(
                tool_call_id=str(raw["tool_call_id"]),
                decision=raw["decision"],  # one of APPROVAL_DECISIONS: checked above
                args=args,
                message=None if message is None else str(message),
            )
        if kind == "tool_result":
            return ToolResultItem(
                result=_TOOL_RESULT.validate_python(raw["result"]),
                display_segments=raw.get("display_segments"),
            )
        if kind == "subscription_event":
            invocation = raw.get("invocation")
            return EventItem(
                result=_TOOL_RESULT.validate_python(raw["result"]),
                tool_call_id=str(raw["tool_call_id"]),
                child_thread_id=raw.get("child_thread_id"),
                invocation=_TOOL_CALL.validate_python(invocation) if invocation is not None else None,
            )
    except (KeyError, TypeError, ValidationError) as exc:
        raise CorruptRowError(f"unreadable {kind} history row: {exc}") from None
    raise CorruptRowError(f"history row has unknown kind {kind!r}")


def decode_item(data: str | bytes) -> HistoryItem:
    """The item a stored row holds (its JSON text or bytes).

    Raises :class:`~stepagent.errors.CorruptRowError` when the row is not a JSON object or not a valid
    item."""
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as exc:
        raise CorruptRowError(f"history row is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CorruptRowError("history row is not a JSON object")
    return item_from_dict(raw)
