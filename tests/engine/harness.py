"""Test harness for step-mode engine tests: in-memory stores, an in-process queue, a scripted model that
replays one stream per request, and small recording tools."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepagent.core.completion import RetryPolicy
from stepagent.core.effects import StoreToolAccess
from stepagent.core.history import HistoryManager
from stepagent.core.step import StepConfig, StepInput
from stepagent.errors import ProviderError
from stepagent.events import EventCollector
from stepagent.history_items import HistoryItem
from stepagent.messages import InputMessage, ToolCall, ToolResult
from stepagent.modes.step_mode import AgentSystem, ThreadResult
from stepagent.providers.base import (
    Final,
    ModelInfo,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    Usage,
)
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.memory import memory_stores
from stepagent.testing import InProcessQueueDriver
from stepagent.tools.base import Tool, ToolContext, Toolset
from stepagent.tools.builtins import builtin_tools


async def no_sleep(_: float) -> None:
    return None


def text(*chunks: str, usage: Usage | None = None) -> list[StreamEvent | Exception]:
    return [*(TextDelta(c) for c in chunks), Final(usage=usage)]


def call(name: str, tool_call_id: str, **arguments: Any) -> ToolCallComplete:
    return ToolCallComplete(ToolCall(id=tool_call_id, name=name, arguments=arguments))


@dataclass
class ReplayProvider:
    """Answers request *n* with ``streams[n]``. An ``Exception`` item is raised at that point of the
    stream; a stream without ``Final`` simply ends (a cut connection)."""

    streams: list[list[StreamEvent | Exception]] = field(default_factory=list)
    requests: list[ModelRequest] = field(default_factory=list)
    model: ModelInfo = field(default_factory=lambda: ModelInfo("replay", context_window=100_000))

    @property
    def info(self) -> ModelInfo:
        return self.model

    def then(self, *events: StreamEvent | Exception) -> ReplayProvider:
        self.streams.append(list(events))
        return self

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        if not self.streams:
            raise AssertionError(f"unexpected model request #{len(self.requests)}")
        for event in self.streams.pop(0):
            if isinstance(event, Exception):
                raise event
            yield event


def retryable(message: str = "overloaded") -> ProviderError:
    return ProviderError(message, retryable=True, status=529)


@dataclass
class RecordingTool(Tool):
    """An asynchronous tool that records its dispatches (the result is delivered by the test)."""

    tool_name: str = "lookup"
    dispatches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    fail_with: Exception | None = None

    def __post_init__(self) -> None:
        self.name = self.tool_name  # type: ignore[misc]
        self.description = "Look something up."  # type: ignore[misc]

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        self.dispatches.append((context.tool_call_id, arguments))
        if self.fail_with is not None:
            raise self.fail_with


@dataclass
class EchoSyncTool(Tool):
    def __post_init__(self) -> None:
        self.name = "echo_sync"  # type: ignore[misc]
        self.description = "Echo."  # type: ignore[misc]
        self.inline = True  # type: ignore[misc]

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult.text(context.tool_call_id, f"echo: {arguments.get('text')}")


class Harness:
    def __init__(self, provider: Any, tools: Sequence[Tool] = (), *, builtins: bool = True) -> None:
        self.conversation, self.state = memory_stores()
        self.sender = InProcessSender()
        self.observer = EventCollector()
        self.provider = provider
        toolset = Toolset.of([*tools, *(builtin_tools() if builtins else [])])
        self.config = StepConfig(
            provider=provider, toolset=toolset, sender=self.sender, retry=RetryPolicy(sleep=no_sleep)
        )
        self.system = AgentSystem(self.conversation, self.state, self.config)
        self.driver = InProcessQueueDriver(self.system, self.sender)

    async def send(self, message: InputMessage, message_id: str) -> None:
        await self.sender.send(message, message_id)

    async def say(self, thread: str, text: str, message_id: str) -> list[ThreadResult]:
        await self.sender.send(InputMessage.user_text(thread, text), message_id)
        return await self.run()

    async def run(self) -> list[ThreadResult]:
        results = await self.driver.run_until_idle(self.observer)
        for result in results:
            if result.error is not None:
                raise result.error
        return results

    async def step(self, *items: tuple[InputMessage, str]) -> list[ThreadResult]:
        return await self.system.step([StepInput(m, i) for m, i in items], self.observer)

    async def history(self, thread: str) -> list[HistoryItem]:
        return (await HistoryManager.load(self.conversation, self.state, thread)).history

    async def stored(self, thread: str) -> list[tuple[int, str, str]]:
        """The thread's own committed rows as (order, message id, encoded item)."""
        from stepagent.history_items import encode_item

        return [
            (r.order, r.message_id, encode_item(r.item)) async for r in self.conversation.load_rows(thread)
        ]


# ---- conformance-suite helpers (appended) -------------------------------------------------------------


@dataclass
class HookedReplayProvider(ReplayProvider):
    """A ``ReplayProvider`` whose streams may also contain zero-argument callables, run at that point of
    the stream (e.g. to set a cancel event between two chunks)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        if not self.streams:
            raise AssertionError(f"unexpected model request #{len(self.requests)}")
        for event in self.streams.pop(0):
            if isinstance(event, Exception):
                raise event
            if callable(event):
                event()
                continue
            yield event


@dataclass
class ThreadRoutedProvider:
    """Answers each thread from its own queue of streams (keyed by the last entry of the request's thread
    stack), so multi-thread scenarios do not depend on the order in which threads happen to run."""

    streams: dict[str, list[list[StreamEvent | Exception]]] = field(default_factory=dict)
    requests: list[ModelRequest] = field(default_factory=list)
    model: ModelInfo = field(default_factory=lambda: ModelInfo("routed", context_window=100_000))

    @property
    def info(self) -> ModelInfo:
        return self.model

    def then(self, thread: str, *events: StreamEvent | Exception) -> ThreadRoutedProvider:
        self.streams.setdefault(thread, []).append(list(events))
        return self

    def requests_of(self, thread: str) -> list[ModelRequest]:
        return [r for r in self.requests if r.thread_stack and r.thread_stack[-1] == thread]

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        thread = request.thread_stack[-1] if request.thread_stack else ""
        queue = self.streams.get(thread)
        if not queue:
            raise AssertionError(f"unexpected model request for thread {thread!r}")
        for event in queue.pop(0):
            if isinstance(event, Exception):
                raise event
            yield event


@dataclass
class RecordingNotifier:
    """A ``LifecycleNotifier`` that records what it was told."""

    cancelled: list[tuple[str, str]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    async def cancel_tool_call(self, thread_id: str, tool_call_id: str) -> None:
        self.cancelled.append((thread_id, tool_call_id))

    async def thread_closed(self, thread_id: str) -> None:
        self.closed.append(thread_id)


@dataclass
class ContextRecordingTool(Tool):
    """An asynchronous tool that records the whole ``ToolContext`` of each dispatch."""

    tool_name: str = "inspect"
    contexts: list[ToolContext] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.tool_name  # type: ignore[misc]
        self.description = "Records its context."  # type: ignore[misc]

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        self.contexts.append(context)


def tool_context(
    h: Harness,
    thread_id: str,
    tool_call_id: str,
    *,
    call_id: str | None = None,
    stack: list[str] | None = None,
) -> ToolContext:
    """A ``ToolContext`` over the harness's stores and queue, for calling a tool's ``execute`` directly."""
    return ToolContext(
        thread_id=thread_id,
        tool_call_id=tool_call_id,
        call_id=call_id,
        thread_stack=stack if stack is not None else [thread_id],
        sender=h.sender,
        access=StoreToolAccess(h.conversation, h.state),
        notifier=h.config.notifier,
    )


def sent_to(h: Harness, group_id: str) -> list[tuple[str, InputMessage]]:
    """Everything ever sent to ``group_id`` through the harness queue, as (dedup/message id, message)."""
    return [(q.message_id, q.message) for q in h.sender.sent if q.message.group_id == group_id]


async def step_queued(h: Harness) -> list[ThreadResult]:
    """Step everything currently queued as one batch (one step per thread); raise a thread's failure."""
    queued = h.sender.drain()
    results = await h.system.step([StepInput(q.message, q.message_id) for q in queued], h.observer)
    for result in results:
        if result.error is not None:
            raise result.error
    return results
