"""The model-provider port: a request built from committed history, answered by a stream of events.

Providers translate (pure functions, tested without a network) and stream (thin I/O). They raise
:class:`~stepagent.errors.ProviderError` with ``retryable`` set: throttling, overload, 5xx and cut streams
are retryable; bad requests and authentication failures are not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

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
    """What the runtime knows about a model: id, window and output limit (tokens), image input, provider."""

    model_id: str
    context_window: int = 0  # tokens; 0 = none (no automatic compaction, no truncation)
    max_output_tokens: int = 4096
    supports_image_input: bool = False
    #: The provider prefix of ``STEPAGENT_MODEL`` (``anthropic``, ``openai``, ``bedrock``); empty when the
    #: model id already names it (``scripted:...``) or the provider was built by hand.
    provider: str = ""

    @property
    def name(self) -> str:
        """The model as usage reports and ``turn_complete`` events name it: ``<provider>:<model id>``
        (the ``STEPAGENT_MODEL`` spelling), or the bare model id when no provider is known."""
        return f"{self.provider}:{self.model_id}" if self.provider else self.model_id


#: How long a provider's prompt cache keeps the entries a request writes (for providers whose caches take a
#: TTL): five minutes, or one hour when the thread is about to wait on something slow.
CacheTtl = Literal["5m", "1h"]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One completion request: the system prompt, committed history, the tools and the model to ask."""

    system: str
    history: list[HistoryItem]
    tools: list[ToolSpec]
    model: ModelInfo
    # The requesting thread's stack, root first (the current thread last); empty when unknown.
    thread_stack: list[str] = field(default_factory=list)
    #: Output limit (``STEPAGENT_MAX_TOKENS``); ``None``: the model's maximum (``model.max_output_tokens``),
    #: which providers that require a limit send, and the others leave to the server.
    max_tokens: int | None = None
    #: Sampling temperature (``STEPAGENT_TEMPERATURE``); ``None``: not sent (the provider's default).
    temperature: float | None = None
    #: The JSON Schema the answer must match (structured output), sent through the provider's native
    #: mechanism where it has one; ``None``: free text.
    output_schema: dict[str, Any] | None = None
    #: The pydantic model class ``output_schema`` was generated from (its ``__name__``), or ``None`` for a
    #: schema the user wrote: providers send a class's schema in the strict form their vendor's SDK sends
    #: for the class, and a written schema exactly as given.
    output_schema_class: str | None = None
    #: The lifetime of the prompt-cache entries this request writes (providers without a TTL ignore it).
    cache_ttl: CacheTtl = "5m"
    #: The provider's tokens per estimated token, as measured on this thread's last request (``1.0``: not
    #: measured): the window accounting scales its estimate by it (``providers/window.py``).
    estimate_scale: float = 1.0
    #: Whether the provider already counted every item of this history (a compaction thread reads what
    #: its parent sent): the scale then covers tool outputs too.
    estimate_scale_covers_outputs: bool = False

    @property
    def output_limit(self) -> int:
        """The output tokens the answer may use: ``max_tokens``, else the model's maximum."""
        return self.max_tokens if self.max_tokens is not None else self.model.max_output_tokens


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one or more model calls (they add up with ``+``); cache reads and writes are not
    included in ``input_tokens``."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of assistant text, streamed."""

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
    """A complete tool call of the model."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class Final:
    """The model finished its message. Every well-formed stream ends with exactly one."""

    usage: Usage | None = None
    stop_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The id the provider gave this response (Anthropic's message id, OpenAI's completion id), if any.
    response_id: str | None = None
    #: The model that answered, as the provider names it (may be more specific than the one asked for).
    response_model: str | None = None


StreamEvent = TextDelta | ReasoningDelta | ReasoningComplete | ToolCallDelta | ToolCallComplete | Final


class ModelProvider(Protocol):
    """A model: what it is (:attr:`info`) and how to stream one completion from it."""

    @property
    def info(self) -> ModelInfo: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Stream one completion. May raise ``ProviderError`` before or during the stream."""
        ...
