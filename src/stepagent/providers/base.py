"""The model-provider port: a request built from committed history, answered by a stream of events.

Providers translate (pure functions, tested without a network) and stream (thin I/O). They raise
:class:`~stepagent.errors.ProviderError` with ``retryable`` set: throttling, overload, 5xx and cut streams
are retryable; bad requests and authentication failures are not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepagent.history_items import HistoryItem
from stepagent.messages import ToolCall


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about one tool."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model_id: str
    context_window: int = 0  # tokens; 0 = unknown (disables automatic compaction)
    max_output_tokens: int = 4096
    supports_image_input: bool = False


@dataclass(frozen=True, slots=True)
class ModelRequest:
    system: str
    history: list[HistoryItem]
    tools: list[ToolSpec]
    model: ModelInfo
    # The requesting thread's stack, root first (the current thread last); empty when unknown.
    thread_stack: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Streaming thinking text, shown to observers only; never stored."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningComplete:
    """A complete reasoning block. Stored only when signed (or redacted), as providers require."""

    text: str
    signature: str | None = None
    redacted: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """Streaming tool-call progress (display only)."""

    name: str | None = None
    arguments_delta: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallComplete:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class Final:
    """The model finished its message. Every well-formed stream ends with exactly one."""

    usage: Usage | None = None
    stop_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


StreamEvent = TextDelta | ReasoningDelta | ReasoningComplete | ToolCallDelta | ToolCallComplete | Final


class ModelProvider(Protocol):
    @property
    def info(self) -> ModelInfo: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Stream one completion. May raise ``ProviderError`` before or during the stream."""
        ...
