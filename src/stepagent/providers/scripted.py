"""The scripted model: a deterministic, offline ``ModelProvider`` driven by a JSON script.

Users test their agents offline with it (``STEPAGENT_MODEL=scripted:<path to a JSON script>``). Guarantees:
the same request always yields the same events (no network, no clock, no randomness, no sleeping), and a bad
script fails at load with a :class:`~stepagent.errors.ConfigurationError` naming the file and every problem
(pydantic models, strict types, no unknown keys), one line each, each naming its place (``rules[1].when``).

Script format::

    {
      "description": "optional free text, ignored",
      "context_window": 200000,                      # optional, tokens; 0/absent = unknown
      "rules": [
        {"when": "(?i)weather", "reply": [<event>, ...]},
        {"when": "^Report sent", "on": ["tool_result"], "reply": [...]}
      ],
      "default": [<event>, ...]                      # optional
    }

Matching: the *input text* is the text of the last user, tool-result or event item of the request history
(a user item's text, a tool result's text blocks joined with newlines, a synthetic event pair's result
text; an image-only item has the empty text). Each rule's ``when`` regex is ``re.search``-ed in it; the
first matching rule's ``reply`` is streamed, else ``default``; with no default the stream fails with a
non-retryable ``ProviderError`` quoting the input text. Use inline flags for options (``(?i)``, ``(?s)``).
Extension: an optional ``"on"`` list (``"user"``, ``"tool_result"``, ``"event"``) restricts a rule to
inputs of those kinds, so a rule meant for a tool's result never fires on user text that happens to match.

Events (each an object with exactly one of these shapes):

- ``{"text": s}`` — assistant text, streamed as a few deterministic chunks split on word boundaries.
- ``{"reasoning": s, "signature": s}`` — reasoning chunks, then one complete block (``signature`` optional).
- ``{"tool_call": {"name": s, "arguments": {...}}}`` — a tool call. Any string value (at any depth) that is
  exactly ``"{thread_id}"`` or ``"{thread_stack}"`` becomes the current thread's id or its stack (a list,
  root first), so scripts can drive ``spawn_thread(child_of=...)`` and ``close_thread(thread_id=...)``.
  The call id is ``call_<12 hex>``, a hash of the thread id, the history (length and content) and the
  event's index in the reply: stable when the same request is re-run, distinct across turns.
- ``{"error": s, "retryable": bool}`` — raise ``ProviderError(s, retryable=...)`` at that point of the
  stream (``retryable`` defaults to false).
- ``{"output": <any JSON value>}`` — a structured answer: the value's JSON text, streamed like ``text``.

Structured output: the scripted model honours an output schema the way a vendor's constrained decoding
cannot be imitated offline — it never rewrites a reply. An ``output`` event answers with JSON; a ``text``
event answers exactly as written (so a script can answer badly on purpose). The runtime validates the answer
and, when it does not match, sends the errors back as a user item starting with ``Your answer does not
match the required output schema``, which a rule can match to answer again. The request's schema counts
toward the input characters.

Usage (reported in the final event, so compaction can be exercised offline): one token per 4 characters,
rounded up. Input characters = the system prompt + every history item's text (tool calls: name and JSON
arguments; image blocks: their base64 data; other user content: its JSON) + the tool specs' JSON. Output
characters = the reply's text, reasoning and tool calls (name and JSON arguments, after substitution).

Window: like the real providers, a request over a known ``context_window`` has its oldest tool outputs
truncated (:func:`~stepagent.providers.window.fit_request`; usage counts the truncated request), and one
that cannot fit even so fails with a non-retryable error — so a script exercises what a real model
would do with a long conversation. Replies are chosen from the untruncated history.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from stepagent.config_errors import error_lines
from stepagent.errors import ConfigurationError, ProviderError
from stepagent.history_items import (
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import ImageBlock, TextBlock, TextContent, ToolCall, ToolResult
from stepagent.providers.base import (
    Final,
    ModelInfo,
    ModelRequest,
    ReasoningComplete,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    ToolCallDelta,
    Usage,
)
from stepagent.providers.window import fit_request

InputKind = Literal["user", "tool_result", "event"]
_EVENT_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"text"}),
    "reasoning": frozenset({"reasoning", "signature"}),
    "tool_call": frozenset({"tool_call"}),
    "error": frozenset({"error", "retryable"}),
    "output": frozenset({"output"}),
}
_ALL_EVENT_KEYS = frozenset().union(*_EVENT_KEYS.values())
_THREAD_ID = "{thread_id}"
_THREAD_STACK = "{thread_stack}"
_QUOTE_LIMIT = 200
_CHUNKS = 3


# ----------------------------------------------------------------------------------------------------------
# The parsed script


@dataclass(frozen=True, slots=True)
class ScriptedText:
    """A script's ``{"text": s}`` event."""

    text: str


@dataclass(frozen=True, slots=True)
class ScriptedReasoning:
    """A script's ``{"reasoning": s, "signature": s}`` event."""

    text: str
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    """A script's ``{"tool_call": {"name": s, "arguments": {...}}}`` event."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ScriptedError:
    """A script's ``{"error": s, "retryable": bool}`` event."""

    message: str
    retryable: bool = False


ScriptEvent = ScriptedText | ScriptedReasoning | ScriptedToolCall | ScriptedError


@dataclass(frozen=True, slots=True)
class Rule:
    """A script rule: ``reply`` when ``when`` is found in the input text and the input is of a kind in ``on``
    (``None``: any)."""

    when: re.Pattern[str]
    reply: tuple[ScriptEvent, ...]
    on: frozenset[InputKind] | None = None  # None = any input kind

    def matches(self, kind: InputKind | None, text: str) -> bool:
        if self.on is not None and kind not in self.on:
            return False
        return self.when.search(text) is not None


@dataclass(frozen=True, slots=True)
class Script:
    """A validated script. ``source`` is the file path, or ``"inline"`` for a script given as a dict."""

    rules: tuple[Rule, ...]
    default: tuple[ScriptEvent, ...] | None
    context_window: int
    source: str

    @classmethod
    def from_dict(cls, data: object, source: str = "inline") -> Script:
        return _parse_script(data, source)


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and validate a script file; ``ConfigurationError`` names the file and what is wrong."""
    source = os.fspath(path)
    try:
        raw = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"scripted model: cannot read script {source!r}: {exc}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"scripted model: script {source!r} is not valid JSON: "
            f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    return _parse_script(data, source)


# ----------------------------------------------------------------------------------------------------------
# Validation: the script's JSON shape as pydantic models (strict types, no unknown keys), every problem
# reported at once, one line each.

_STRICT = ConfigDict(extra="forbid", strict=True, defer_build=True)


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("config", message)


class _ToolCallSpec(BaseModel):
    model_config = _STRICT
    name: Annotated[str, Field(min_length=1)]
    arguments: dict[str, Any] = {}


class _EventSpec(BaseModel):
    """Every key an event may have; exactly one kind must be present and only that kind's keys."""

    model_config = _STRICT
    text: str | None = None
    reasoning: str | None = None
    signature: str | None = None
    tool_call: _ToolCallSpec | None = None
    error: str | None = None
    retryable: bool = False
    output: Any = None

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, data: object) -> object:
        if isinstance(data, dict):
            kinds = [kind for kind in _EVENT_KEYS if kind in data]
            if len(kinds) != 1:
                found = "none" if not kinds else " and ".join(repr(k) for k in kinds)
                raise _invalid(
                    "an event needs exactly one of 'text', 'reasoning', 'tool_call', 'error', 'output' "
                    f"(found {found})"
                )
            stray = sorted(set(data) & _ALL_EVENT_KEYS - _EVENT_KEYS[kinds[0]])
            if stray:
                raise _invalid(
                    f"keys {stray} do not belong in a {kinds[0]!r} event; "
                    f"allowed: {sorted(_EVENT_KEYS[kinds[0]])}"
                )
        return data

    @field_validator("text", "reasoning", "tool_call", "error", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise _invalid("must not be null")
        return value

    def event(self) -> ScriptEvent:
        given = self.model_fields_set
        if "output" in given:
            # A structured answer: the value's JSON text, streamed like any text.
            return ScriptedText(json.dumps(self.output, ensure_ascii=False))
        if self.text is not None:
            return ScriptedText(self.text)
        if self.reasoning is not None:
            return ScriptedReasoning(self.reasoning, self.signature)
        if self.error is not None:
            return ScriptedError(self.error, self.retryable)
        assert self.tool_call is not None  # _one_kind admits nothing else
        return ScriptedToolCall(self.tool_call.name, self.tool_call.arguments)


class _RuleSpec(BaseModel):
    model_config = _STRICT
    when: str
    reply: list[_EventSpec]
    on: Annotated[list[InputKind], Field(min_length=1)] | None = None
    description: str | None = None

    @field_validator("on", mode="before")
    @classmethod
    def _one_kind_alone(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("when")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise _invalid(f"bad regular expression {value!r}: {exc}") from None
        return value


class _ScriptSpec(BaseModel):
    model_config = _STRICT
    rules: list[_RuleSpec] = []
    default: list[_EventSpec] | None = None
    context_window: Annotated[int, Field(ge=0)] = 0
    description: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _something_to_say(cls, data: object) -> object:
        if isinstance(data, dict) and "rules" not in data and "default" not in data:
            raise _invalid("the script needs 'rules', 'default' or both")
        return data


def _parse_script(data: object, source: str) -> Script:
    try:
        spec = _ScriptSpec.model_validate(data)
    except ValidationError as error:
        lines = error_lines(error, _ScriptSpec)
        raise ConfigurationError(
            "\n".join(f"scripted model: invalid script {source!r}: {line}" for line in lines)
        ) from None
    rules = tuple(
        Rule(
            when=re.compile(rule.when),
            reply=tuple(event.event() for event in rule.reply),
            on=frozenset(rule.on) if rule.on is not None else None,
        )
        for rule in spec.rules
    )
    default = tuple(event.event() for event in spec.default) if spec.default is not None else None
    return Script(rules=rules, default=default, context_window=spec.context_window, source=source)


# ----------------------------------------------------------------------------------------------------------
# The provider


class ScriptedProvider:
    """A ``ModelProvider`` that replays a script. Accepts a ``Script``, a script dict, or a file path
    (optionally prefixed ``scripted:``)."""

    def __init__(self, script: Script | Mapping[str, Any] | str | os.PathLike[str]) -> None:
        if isinstance(script, Script):
            self._script = script
        elif isinstance(script, Mapping):
            self._script = Script.from_dict(dict(script))
        else:
            path = os.fspath(script)
            self._script = load_script(path.removeprefix("scripted:"))
        self._info = ModelInfo(
            model_id=f"scripted:{self._script.source}",
            context_window=self._script.context_window,
            supports_image_input=True,
        )

    @property
    def script(self) -> Script:
        return self._script

    @property
    def info(self) -> ModelInfo:
        return self._info

    def select_reply(self, request: ModelRequest) -> tuple[ScriptEvent, ...]:
        """The reply the script gives to ``request``; raises ``ProviderError`` when nothing matches."""
        kind, text = input_text(request.history)
        for rule in self._script.rules:
            if rule.matches(kind, text):
                return rule.reply
        if self._script.default is not None:
            return self._script.default
        quoted = text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "…"
        raise ProviderError(
            f"scripted model {self._script.source}: no rule matched and the script has no default; "
            f"input text was {quoted!r}",
            retryable=False,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        fitted, truncation = fit_request(request)  # raises ContextOverflow when it cannot fit
        reply = self.select_reply(request)
        stack = list(getattr(request, "thread_stack", None) or [])
        thread_id = stack[-1] if stack else ""
        request_digest = _history_digest(thread_id, request.history)
        output_chars = 0
        for index, event in enumerate(reply):
            match event:
                case ScriptedText(text=text):
                    output_chars += len(text)
                    for chunk in split_chunks(text):
                        yield TextDelta(chunk)
                case ScriptedReasoning(text=text, signature=signature):
                    output_chars += len(text)
                    for chunk in split_chunks(text):
                        yield ReasoningDelta(chunk)
                    yield ReasoningComplete(text=text, signature=signature)
                case ScriptedToolCall(name=name, arguments=arguments):
                    substituted = substitute_placeholders(arguments, stack, self._script.source)
                    output_chars += len(name) + len(_dumps(substituted))
                    yield ToolCallDelta(name=name)
                    call_id = _call_id(request_digest, index)
                    yield ToolCallComplete(ToolCall(id=call_id, name=name, arguments=substituted))
                case ScriptedError(message=message, retryable=retryable):
                    raise ProviderError(message, retryable=retryable)
        sent = dataclasses.replace(request, history=fitted) if truncation is not None else request
        usage = Usage(input_tokens=_tokens(request_chars(sent)), output_tokens=_tokens(output_chars))
        yield Final(usage=usage, stop_reason="end_turn")


# ----------------------------------------------------------------------------------------------------------
# Pure helpers (public for tests and for tools that want to reason about scripts)


def input_text(history: Sequence[HistoryItem]) -> tuple[InputKind | None, str]:
    """The kind and text of the last user, tool-result or event item; ``(None, "")`` when there is none."""
    for item in reversed(history):
        if isinstance(item, UserItem):
            return "user", item.text or ""
        if isinstance(item, ToolResultItem):
            return "tool_result", item.result.joined_text()
        if isinstance(item, EventItem):
            return "event", item.result.joined_text()
    return None, ""


def split_chunks(text: str, pieces: int = _CHUNKS) -> list[str]:
    """Split ``text`` on word boundaries into at most ``pieces`` non-empty chunks that join back exactly."""
    words = re.findall(r"\s*\S+\s*|\s+", text)
    if not words:
        return []
    size = math.ceil(len(words) / pieces)
    return ["".join(words[start : start + size]) for start in range(0, len(words), size)]


def substitute_placeholders(value: Any, stack: Sequence[str], source: str = "inline") -> Any:
    """Replace every string exactly ``"{thread_id}"``/``"{thread_stack}"`` (at any depth) by the thread's
    id/stack. Dict keys are left alone. Fails loudly if the request carries no thread stack."""
    if isinstance(value, str):
        if value in (_THREAD_ID, _THREAD_STACK):
            if not stack:
                raise ProviderError(
                    f"scripted model {source}: the script uses {value} "
                    "but the request carries no thread stack",
                    retryable=False,
                )
            return stack[-1] if value == _THREAD_ID else list(stack)
        return value
    if isinstance(value, dict):
        return {key: substitute_placeholders(item, stack, source) for key, item in value.items()}
    if isinstance(value, list):
        return [substitute_placeholders(item, stack, source) for item in value]
    return value


def request_chars(request: ModelRequest) -> int:
    """The request's size in characters, as the usage estimate counts it (see the module docstring)."""
    total = len(request.system)
    total += sum(len(item_text(item)) for item in request.history)
    specs = [
        {"name": s.name, "description": s.description, "parameters": s.parameters} for s in request.tools
    ]
    schema = getattr(request, "output_schema", None)
    return total + len(_dumps(specs)) + (len(_dumps(schema)) if schema is not None else 0)


def item_text(item: HistoryItem) -> str:
    """What one history item contributes to the request's character count."""
    match item:
        case UserItem(content=content):
            return content.text if isinstance(content, TextContent) else _dumps(content.model_dump())
        case AssistantText(text=text):
            return text
        case Reasoning(text=text, redacted=redacted):
            return text + (redacted or "")
        case ToolCallItem(call=call):
            return call.name + _dumps(call.arguments)
        case ToolResultItem(result=result):
            return _result_text(result)
        case EventItem(result=result, invocation=invocation):
            injected = invocation.name + _dumps(invocation.arguments) if invocation is not None else ""
            return injected + _result_text(result)
        case Summary():
            return item.rendered
    raise TypeError(f"unknown history item {item!r}")  # pragma: no cover - the union is exhaustive


def _result_text(result: ToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ImageBlock):
            parts.append(block.data)
    return "".join(parts)


def _history_digest(thread_id: str, history: Sequence[HistoryItem]) -> str:
    # The whole history goes into the call id, not just its length: after a compaction the length can
    # repeat, and a repeated id would collide in the durable index of spawn/subscription calls.
    digest = hashlib.sha256()
    digest.update(f"{thread_id}\0{len(history)}\0".encode())
    for item in history:
        digest.update(type(item).__name__.encode())
        digest.update(b"\0")
        digest.update(item_text(item).encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def _call_id(request_digest: str, index: int) -> str:
    return "call_" + hashlib.sha256(f"{request_digest}\0{index}".encode()).hexdigest()[:12]


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
