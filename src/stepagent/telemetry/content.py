"""A model call's content in the OpenTelemetry GenAI conventions' JSON shapes, for ``chat`` spans that record
content (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``).

Guarantees:

- :func:`system_instructions` is ``gen_ai.system_instructions``: ``[{"type": "text", "content": ...}]``.
- :func:`input_messages` is ``gen_ai.input.messages``: the history exactly as the model was shown it (the
  caller passes the request's view: decisions applied), one message per run of items of the same role —
  ``user`` (text; an image as a ``blob`` part with its base64 data; other media as a text placeholder),
  ``assistant`` (``text``, ``reasoning``, ``tool_call`` parts with ``id``, ``name``, ``arguments``) and
  ``tool`` (``tool_call_response`` parts with ``id`` and ``response``). An event delivered for a call is
  shown as the models see it: the call and its response. A summary is an assistant text.
- :func:`output_messages` is ``gen_ai.output.messages``: one assistant message with the answer's text and
  tool calls, and its ``finish_reason``.

Everything is serialised with :func:`json.dumps` (non-ASCII kept as is); nothing here imports
OpenTelemetry, so the engine may build these whether or not a tracer records them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

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
from stepagent.messages import ImageBlock, TextContent, ToolCall, ToolResult

Part = dict[str, Any]
Message = dict[str, Any]


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def system_instructions(system: str) -> str:
    """``gen_ai.system_instructions`` of a request whose system prompt is ``system``."""
    return _dumps([{"type": "text", "content": system}] if system else [])


def tool_call_part(call: ToolCall) -> Part:
    """A ``tool_call`` part."""
    return {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}


def _response_part(result: ToolResult) -> Part:
    return {"type": "tool_call_response", "id": result.id, "response": result.joined_text()}


def _user_parts(item: UserItem) -> list[Part]:
    content = item.content
    if isinstance(content, TextContent):
        return [{"type": "text", "content": content.text}]
    if isinstance(content, ImageBlock):
        return [
            {
                "type": "blob",
                "modality": "image",
                "mime_type": content.media_type,
                "content": content.data,
            }
        ]
    return [{"type": "text", "content": f"[{content.type} omitted]"}]


def _parts(item: HistoryItem) -> list[tuple[str, Part]]:
    """The (role, part) pairs an item contributes, in order."""
    match item:
        case UserItem():
            return [("user", part) for part in _user_parts(item)]
        case AssistantText(text=text):
            return [("assistant", {"type": "text", "content": text})] if text else []
        case Reasoning(text=text):
            return [("assistant", {"type": "reasoning", "content": text})] if text else []
        case ToolCallItem(call=call):
            return [("assistant", tool_call_part(call))]
        case ToolResultItem(result=result):
            return [("tool", _response_part(result))]
        case EventItem(result=result, invocation=invocation, tool_call_id=original):
            name = invocation.name if invocation is not None else "event"
            arguments = (
                invocation.arguments if invocation is not None else {"original_tool_call_id": original}
            )
            shown: Part = {"type": "tool_call", "id": result.id, "name": name, "arguments": arguments}
            return [("assistant", shown), ("tool", _response_part(result))]
        case Summary():
            return [("assistant", {"type": "text", "content": item.rendered})]
    return []


def messages(history: Sequence[HistoryItem]) -> list[Message]:
    """The history as GenAI messages (see the module docstring)."""
    out: list[Message] = []
    for item in history:
        for role, part in _parts(item):
            if out and out[-1]["role"] == role:
                out[-1]["parts"].append(part)
            else:
                out.append({"role": role, "parts": [part]})
    return out


def input_messages(history: Sequence[HistoryItem]) -> str:
    """``gen_ai.input.messages`` of a request showing the model ``history``."""
    return _dumps(messages(history))


def output_messages(text: str, calls: Sequence[ToolCall], finish_reason: str | None) -> str:
    """``gen_ai.output.messages`` of an answer with ``text`` and tool ``calls``."""
    parts: list[Part] = [{"type": "text", "content": text}] if text else []
    parts.extend(tool_call_part(call) for call in calls)
    reason = finish_reason or ("tool_call" if calls else "stop")
    return _dumps([{"role": "assistant", "parts": parts, "finish_reason": reason}])
