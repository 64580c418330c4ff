"""Provider-neutral translation of committed history into a well-formed conversation (pure functions).

Every provider first calls :func:`conversation`, then maps the neutral turns onto its wire format. The
rules here are what make any stored history acceptable to the strict chat APIs, and they are the same for
every provider, so a conversation renders alike everywhere:

- **Roles alternate.** Items become ``user``/``assistant`` turns; consecutive same-role turns are merged
  into one (the APIs demand alternation). A :class:`~stepagent.history_items.EventItem` expands to two
  turns: an assistant ``receive_event__injected`` tool call, then the user-side tool result.
- **Every tool call is answered, every result has its call.** A call still unanswered when the next
  non-result item (or the end of the history) arrives gets the placeholder result :data:`PENDING_RESULT`
  (the APIs reject a tool call that is not followed by its result). A result whose call is not the
  pending one (e.g. its call was compacted away) is rendered as user text, :data:`ORPHAN_RESULT_PREFIX`.
- **No empty content.** The APIs reject empty or whitespace-only text blocks: blank text blocks of a tool
  result are dropped and a result left empty becomes :data:`EMPTY_OUTPUT`; an empty user text becomes
  :data:`EMPTY_USER_TEXT`; empty assistant text is dropped. A conversation that would start with the assistant (e.g. after a compaction summary, which is
  rendered as assistant text) or be empty gets :data:`CONVERSATION_START` as its first user text.
- **Images** become :class:`ImagePart` (media type from the block, else sniffed from the data). When the
  model has no image input the engine's ``model_view`` already replaced tool-result images; user images
  and anything it left are replaced here by the same placeholder text, so the two never disagree. Audio,
  video and documents are replaced by a placeholder naming their kind.
- **Reasoning** is kept only when signed or redacted (the APIs reject anything else), and moved to the
  front of its assistant message (Anthropic and Bedrock require thinking before ``tool_use``). A provider
  that cannot take reasoning back (Chat Completions) leaves it out before merging, so a reasoning-only
  turn never separates two user turns.
- **Tool ids** are normalised to ``[A-Za-z0-9_-]{1,64}`` (:func:`wire_tool_id`), the strictest of the
  APIs; ids that already comply are kept unchanged, others map to a stable hash.

Bodies are serialised by :mod:`stepagent.providers.json_body` exactly as the vendors' SDKs do (compact
separators, raw UTF-8, no NaN), so a retry re-sends identical bytes and tests can compare with the SDKs
byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stepagent.history_items import (
    INJECTED_TOOL_NAME,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import ImageBlock, TextBlock, TextContent, ToolResult
from stepagent.texts import IMAGE_OMITTED

EMPTY_OUTPUT = "[the tool returned no output]"
EMPTY_USER_TEXT = "[empty message]"
PENDING_RESULT = "[no result yet: this tool call had not been answered when this request was made]"
ORPHAN_RESULT_PREFIX = "[result of an earlier tool call {id}]\n"
CONVERSATION_START = "[conversation continues]"
MEDIA_OMITTED = "[{kind} omitted: this provider does not accept {kind} inputs]"
UNSUPPORTED_IMAGE = "[image omitted: unsupported image type {media_type}]"

SUPPORTED_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_ID_OK = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAGIC = (
    ("iVBORw0KGgo", "image/png"),
    ("/9j/", "image/jpeg"),
    ("R0lGOD", "image/gif"),
    ("UklGR", "image/webp"),
)

Role = Literal["user", "assistant"]


@dataclass(frozen=True, slots=True)
class TextPart:
    """A text part of a turn or a tool result."""

    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image part: its media type and base64 data."""

    media_type: str  # one of SUPPORTED_IMAGE_TYPES
    data: str  # base64, as stored


@dataclass(frozen=True, slots=True)
class ThinkingPart:
    """A signed or redacted reasoning block, sent back to the model."""

    text: str
    signature: str | None = None
    redacted: str | None = None


@dataclass(frozen=True, slots=True)
class ToolUsePart:
    """A tool call of an assistant turn; ``id`` is already a :func:`wire_tool_id`."""

    id: str
    name: str
    arguments: dict[str, Any]


ResultContent = TextPart | ImagePart


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    """A tool result of a user turn, answering the call ``tool_use_id`` (a :func:`wire_tool_id`)."""

    tool_use_id: str
    content: tuple[ResultContent, ...]


Part = TextPart | ImagePart | ThinkingPart | ToolUsePart | ToolResultPart


@dataclass(slots=True)
class Turn:
    """One provider-neutral turn: a role and its parts in order."""

    role: Role
    parts: list[Part] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------------
# Small wire helpers (shared with the tests' independent oracles: they encode no translation rule)


def wire_tool_id(raw: str) -> str:
    """A tool-call id every API accepts; compliant ids are unchanged, others map to a stable hash."""
    if _ID_OK.fullmatch(raw):
        return raw
    return "toolu_" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def image_media_type(block: ImageBlock) -> str:
    """The block's media type (lower-cased, ``image/jpg`` → ``image/jpeg``), else sniffed from the data."""
    if block.media_type:
        media_type = block.media_type.strip().lower()
        return "image/jpeg" if media_type == "image/jpg" else media_type
    head = block.data.lstrip()[:16]
    for prefix, media_type in _MAGIC:
        if head.startswith(prefix):
            return media_type
    return "image/png"


def image_bytes(data: str) -> bytes:
    """Decode stored base64 (tolerating a ``data:`` URI prefix, whitespace and missing padding)."""
    if data.startswith("data:") and "," in data:
        data = data.split(",", 1)[1]
    compact = "".join(data.split())
    try:
        return base64.b64decode(compact + "=" * (-len(compact) % 4))
    except (binascii.Error, ValueError):
        return b""


def arguments_json(arguments: dict[str, Any]) -> str:
    """Tool-call arguments as a compact JSON string (OpenAI sends arguments as a string)."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def nonblank(text: str, placeholder: str) -> str:
    """``text``, or ``placeholder`` when it is empty or whitespace only."""
    return text if text.strip() else placeholder


# ----------------------------------------------------------------------------------------------------------
# History → neutral turns


def conversation(history: Sequence[HistoryItem], *, images: bool, reasoning: bool = True) -> list[Turn]:
    """The history as alternating, well-formed turns (see the module docstring for every rule).
    ``reasoning=False`` leaves reasoning out entirely (before merging, so it never splits a turn)."""
    builder = _Builder(images, reasoning)
    for item in history:
        builder.add(item)
    builder.flush_pending()
    turns = builder.turns
    if not turns or turns[0].role != "user":
        turns.insert(0, Turn("user", [TextPart(CONVERSATION_START)]))
    for turn in turns:
        if turn.role == "assistant":
            # Thinking first (stable): required before tool_use, harmless elsewhere.
            turn.parts.sort(key=lambda part: 0 if isinstance(part, ThinkingPart) else 1)
    return turns


class _Builder:
    def __init__(self, images: bool, reasoning: bool) -> None:
        self.images = images
        self.reasoning = reasoning
        self.turns: list[Turn] = []
        self.pending: list[str] = []  # wire ids of the last assistant message's unanswered calls

    def append(self, role: Role, part: Part) -> None:
        if self.turns and self.turns[-1].role == role:
            self.turns[-1].parts.append(part)
        else:
            self.turns.append(Turn(role, [part]))

    def flush_pending(self) -> None:
        for call_id in self.pending:
            self.append("user", ToolResultPart(call_id, (TextPart(PENDING_RESULT),)))
        self.pending = []

    def add(self, item: HistoryItem) -> None:
        if isinstance(item, ToolResultItem):
            self._result(item.result)
            return
        self.flush_pending()
        match item:
            case UserItem(content=content):
                if isinstance(content, TextContent):
                    self.append("user", TextPart(nonblank(content.text, EMPTY_USER_TEXT)))
                elif isinstance(content, ImageBlock):
                    self.append("user", self._image(content))
                else:
                    self.append("user", TextPart(MEDIA_OMITTED.format(kind=content.type)))
            case AssistantText(text=text):
                if text.strip():
                    self.append("assistant", TextPart(text))
            case Reasoning(text=text, signature=signature, redacted=redacted):
                if self.reasoning and (redacted is not None or signature is not None):
                    self.append("assistant", ThinkingPart(text, signature, redacted))
            case ToolCallItem(call=call):
                self._call(call.id, call.name, call.arguments)
            case EventItem(result=result, tool_call_id=original, invocation=invocation):
                # The pair is keyed by the result's id; rows written before invocations were stored get a
                # minimal injected call.
                name = invocation.name if invocation is not None else INJECTED_TOOL_NAME
                arguments = (
                    invocation.arguments if invocation is not None else {"original_tool_call_id": original}
                )
                self._call(result.id, name, arguments)
                self._result(result)
            case Summary():
                self.append("assistant", TextPart(item.rendered))

    def _call(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        wire_id = wire_tool_id(call_id)
        self.append("assistant", ToolUsePart(wire_id, name, dict(arguments)))
        self.pending.append(wire_id)

    def _result(self, result: ToolResult) -> None:
        wire_id = wire_tool_id(result.id)
        content = tuple(self._result_content(result))
        if wire_id in self.pending:
            self.pending.remove(wire_id)
            self.append("user", ToolResultPart(wire_id, content))
            return
        self.flush_pending()
        self.append("user", TextPart(ORPHAN_RESULT_PREFIX.format(id=result.id)))
        for part in content:
            self.append("user", part)

    def _result_content(self, result: ToolResult) -> list[ResultContent]:
        # Blank text blocks are dropped (the APIs reject them); a result left with nothing says so.
        content: list[ResultContent] = []
        for block in result.content:
            if isinstance(block, TextBlock):
                if block.text.strip():
                    content.append(TextPart(block.text))
            else:
                content.append(self._image(block))
        return content or [TextPart(EMPTY_OUTPUT)]

    def _image(self, block: ImageBlock) -> TextPart | ImagePart:
        if not self.images:
            return TextPart(IMAGE_OMITTED)
        media_type = image_media_type(block)
        if media_type not in SUPPORTED_IMAGE_TYPES:
            return TextPart(UNSUPPORTED_IMAGE.format(media_type=media_type))
        return ImagePart(media_type, block.data)
