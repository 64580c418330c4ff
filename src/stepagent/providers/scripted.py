"""The scripted model: a deterministic, offline ``ModelProvider`` driven by a JSON script.

Users test their agents offline with it (``STEPAGENT_MODEL=scripted:<path to a JSON script>``). Guarantees:
the same request always yields the same events (no network, no clock, no randomness, no sleeping), and a bad
script fails at load with a :class:`~stepagent.errors.ConfigurationError` naming the file and the problem.

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
from typing import Any, Literal

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
_INPUT_KINDS: tuple[InputKind, ...] = ("user", "tool_result", "event")
_TOP_KEYS = frozenset({"rules", "default", "context_window", "description"})
_RULE_KEYS = frozenset({"when", "reply", "on", "description"})
_EVENT_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"text"}),
    "reasoning": frozenset({"reasoning", "signature"}),
    "tool_call": frozenset({"tool_call"}),
    "error": frozenset({"error", "retryable"}),
    "output": frozenset({"output"}),
}
_TOOL_CALL_KEYS = frozenset({"name", "arguments"})
_THREAD_ID = "{thread_id}"
_THREAD_STACK = "{thread_stack}"
_QUOTE_LIMIT = 200
_CHUNKS = 3


# ----------------------------------------------------------------------------------------------------------
# The parsed script


@dataclass(frozen=True, slots=True)
class TextEvent:
    """A script's ``{"text": s}`` event."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningEvent:
    """A script's ``{"reasoning": s, "signature": s}`` event."""

    text: str
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """A script's ``{"tool_call": {"name": s, "arguments": {...}}}`` event."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """A script's ``{"error": s, "retryable": bool}`` event."""

    message: str
    retryable: bool = False


ScriptEvent = TextEvent | ReasoningEvent | ToolCallEvent | ErrorEvent


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
# Validation


class _Invalid(Exception):
    """A problem at a location inside the script; turned into one ConfigurationError by the caller."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)


def _parse_script(data: object, source: str) -> Script:
    try:
        return _parse_top(data, source)
    except _Invalid as exc:
        raise ConfigurationError(f"scripted model: invalid script {source!r}: {exc}") from None


def _parse_top(data: object, source: str) -> Script:
    if not isinstance(data, dict):
        raise _Invalid("", f"the script must be a JSON object, got {_json_type(data)}")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise _Invalid("", f"unknown top-level keys {unknown}; expected {sorted(_TOP_KEYS)}")
    if "rules" not in data and "default" not in data:
        raise _Invalid("", "the script needs 'rules', 'default' or both")
    rules_raw = data.get("rules", [])
    if not isinstance(rules_raw, list):
        raise _Invalid("rules", f"must be a list, got {_json_type(rules_raw)}")
    rules = tuple(_parse_rule(raw, f"rules[{index}]") for index, raw in enumerate(rules_raw))
    default = _parse_reply(data["default"], "default") if "default" in data else None
    window = data.get("context_window", 0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise _Invalid("context_window", f"must be a non-negative integer (tokens), got {window!r}")
    return Script(rules=rules, default=default, context_window=window, source=source)


def _parse_rule(raw: object, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise _Invalid(where, f"a rule must be an object, got {_json_type(raw)}")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise _Invalid(where, f"unknown keys {unknown}; a rule has 'when', 'reply' and optionally 'on'")
    if "when" not in raw:
        raise _Invalid(where, "missing 'when' (a regular expression)")
    if "reply" not in raw:
        raise _Invalid(where, "missing 'reply' (a list of events)")
    when = raw["when"]
    if not isinstance(when, str):
        raise _Invalid(f"{where}.when", f"must be a string (a regular expression), got {_json_type(when)}")
    try:
        pattern = re.compile(when)
    except re.error as exc:
        raise _Invalid(f"{where}.when", f"bad regular expression {when!r}: {exc}") from None
    return Rule(when=pattern, reply=_parse_reply(raw["reply"], f"{where}.reply"), on=_parse_on(raw, where))


def _parse_on(raw: dict[str, Any], where: str) -> frozenset[InputKind] | None:
    if "on" not in raw:
        return None
    on = raw["on"]
    if isinstance(on, str):
        on = [on]
    if not isinstance(on, list) or not on:
        raise _Invalid(f"{where}.on", f"must be a non-empty list of {list(_INPUT_KINDS)}")
    kinds: set[InputKind] = set()
    for value in on:
        if value not in _INPUT_KINDS:
            raise _Invalid(
                f"{where}.on", f"unknown input kind {value!r}; expected one of {list(_INPUT_KINDS)}"
            )
        kinds.add(value)
    return frozenset(kinds)


def _parse_reply(raw: object, where: str) -> tuple[ScriptEvent, ...]:
    if not isinstance(raw, list):
        raise _Invalid(where, f"must be a list of events, got {_json_type(raw)}")
    return tuple(_parse_event(event, f"{where}[{index}]") for index, event in enumerate(raw))


def _parse_event(raw: object, where: str) -> ScriptEvent:
    if not isinstance(raw, dict):
        raise _Invalid(where, f"an event must be an object, got {_json_type(raw)}")
    kinds = [kind for kind in _EVENT_KEYS if kind in raw]
    if len(kinds) != 1:
        found = "none" if not kinds else " and ".join(repr(k) for k in kinds)
        raise _Invalid(
            where,
            f"an event needs exactly one of 'text', 'reasoning', 'tool_call', 'error', 'output' (found {found})",
        )
    kind = kinds[0]
    unknown = sorted(set(raw) - _EVENT_KEYS[kind])
    if unknown:
        raise _Invalid(
            where, f"unknown keys {unknown} in a {kind!r} event; allowed: {sorted(_EVENT_KEYS[kind])}"
        )
    if kind == "text":
        return TextEvent(_string(raw["text"], f"{where}.text"))
    if kind == "output":
        # A structured answer: the value's JSON text, streamed like any text.
        return TextEvent(json.dumps(raw["output"], ensure_ascii=False))
    if kind == "reasoning":
        signature = raw.get("signature")
        if signature is not None:
            signature = _string(signature, f"{where}.signature")
        return ReasoningEvent(_string(raw["reasoning"], f"{where}.reasoning"), signature)
    if kind == "error":
        retryable = raw.get("retryable", False)
        if not isinstance(retryable, bool):
            raise _Invalid(f"{where}.retryable", f"must be true or false, got {retryable!r}")
        return ErrorEvent(_string(raw["error"], f"{where}.error"), retryable)
    return _parse_tool_call(raw["tool_call"], f"{where}.tool_call")


def _parse_tool_call(raw: object, where: str) -> ToolCallEvent:
    if not isinstance(raw, dict):
        raise _Invalid(where, f"must be an object with 'name' and 'arguments', got {_json_type(raw)}")
    unknown = sorted(set(raw) - _TOOL_CALL_KEYS)
    if unknown:
        raise _Invalid(where, f"unknown keys {unknown}; a tool call has 'name' and 'arguments'")
    if "name" not in raw:
        raise _Invalid(where, "missing 'name'")
    name = _string(raw["name"], f"{where}.name")
    if not name:
        raise _Invalid(f"{where}.name", "must not be empty")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _Invalid(f"{where}.arguments", f"must be an object, got {_json_type(arguments)}")
    return ToolCallEvent(name, arguments)


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(where, f"must be a string, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, float) else type(value).__name__)


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
                case TextEvent(text=text):
                    output_chars += len(text)
                    for chunk in split_chunks(text):
                        yield TextDelta(chunk)
                case ReasoningEvent(text=text, signature=signature):
                    output_chars += len(text)
                    for chunk in split_chunks(text):
                        yield ReasoningDelta(chunk)
                    yield ReasoningComplete(text=text, signature=signature)
                case ToolCallEvent(name=name, arguments=arguments):
                    substituted = substitute_placeholders(arguments, stack, self._script.source)
                    output_chars += len(name) + len(_dumps(substituted))
                    yield ToolCallDelta(name=name)
                    call_id = _call_id(request_digest, index)
                    yield ToolCallComplete(ToolCall(id=call_id, name=name, arguments=substituted))
                case ErrorEvent(message=message, retryable=retryable):
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
