"""The tool port: what a tool is, what it sees when it runs, and the toolset registry.

Two kinds of tools:

- **synchronous** (``inline = True``): run inside the step after the history is synced; their result is
  appended at once and the model gets another round (``spawn_thread``, ``cancel_subscription``,
  ``@tool(inline=True)`` functions).
- **asynchronous**: ``execute`` only *dispatches* (an HTTP POST, a queue message, a timer); the result
  arrives later as an input message for the thread. Dispatch happens after the commit, from the durable
  outbox, with the tool call id as the idempotency key.

A tool reaches the stores only through :class:`ToolAccess` (thread records, spawning and closing threads,
subscriptions, a key/value cache): a thread's history, processed ids, intents and choices are written by the
step's commit alone.

A tool signals a problem the model should see by raising :class:`~stepagent.errors.ToolError` (sync) or
by sending an ``Error: ...`` result itself (async; see :func:`send_tool_error`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from stepagent.errors import ConfigurationError
from stepagent.messages import InputMessage, ToolResult
from stepagent.providers.base import ToolSpec

if TYPE_CHECKING:
    from stepagent.history_items import Summary
    from stepagent.senders.base import InputSender
    from stepagent.stores.base import ThreadInfo, ThreadKind


class TimerBackend(Protocol):
    """Delivers ``message`` to its thread after ``delay_seconds`` (durably, where the backend can)."""

    async def schedule(self, message: InputMessage, dedup_id: str, delay_seconds: float) -> None: ...


class FunctionRunner(Protocol):
    """Runs an asynchronous Python function tool off the step and sends its result back."""

    async def submit(self, tool_name: str, arguments: dict[str, Any], context: ToolContext) -> None: ...


class LifecycleNotifier(Protocol):
    """Tells remote tool servers about cancelled calls and closed threads (best effort)."""

    async def cancel_tool_call(self, thread_id: str, tool_call_id: str) -> None: ...

    async def thread_closed(self, thread_id: str) -> None: ...


class ToolAccess(Protocol):
    """The store operations a tool may use: thread records, spawning and closing threads, handing a
    summary over, subscriptions and the key/value cache. Deliberately not a thread's history commit, its
    processed ids, dispatch intents or pending choices: those are written only by the step's commit
    (``core/effects.py``), so a tool cannot change a thread behind the step's back."""

    async def get_thread(self, thread_id: str) -> ThreadInfo | None: ...

    async def spawn_thread(
        self, parent_id: str, *, child_id: str, spawn_tool_call_id: str, kind: ThreadKind
    ) -> ThreadInfo: ...

    async def close_thread(self, thread_id: str) -> None: ...

    async def save_summary(self, thread_id: str, summary: Summary) -> None: ...

    async def active_subscriptions(self, thread_id: str) -> set[str]: ...

    async def remove_subscription(self, thread_id: str, tool_call_id: str) -> None: ...

    async def cache_put(self, key: str, value: str, expires_at: float) -> None: ...

    async def cache_get(self, key: str) -> str | None: ...


@dataclass(slots=True)
class ToolEffects:
    """Thread state a synchronous tool changes. The step commits it together with the tool's result, so a
    re-run after a crash in between finds the state as the first run did (and answers the same)."""

    subscriptions_removed: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ToolContext:
    """What a running tool can see and use."""

    thread_id: str
    tool_call_id: str
    call_id: str | None
    thread_stack: list[str]
    sender: InputSender
    #: The stores as far as a tool may use them (``core/effects.py`` builds it over the real stores).
    access: ToolAccess
    user_id: str | None = None
    callback_url: str | None = None
    timers: TimerBackend | None = None
    runner: FunctionRunner | None = None
    notifier: LifecycleNotifier | None = None
    #: Where a synchronous tool records its state changes for the step's commit (``None``: apply them now).
    effects: ToolEffects | None = None
    #: A call resumed with the user's answer to the tool's question (an MCP elicitation): what the
    #: resumed request carries (``stepagent.tools.mcp_input.Resume`` as JSON); ``None`` for a first call.
    resume: dict[str, Any] | None = None

    @property
    def root_thread_id(self) -> str:
        return self.thread_stack[0]

    async def send_result(self, text: str) -> None:
        """Send this call's (asynchronous) result to its own thread, dedup id = the tool call id."""
        result = ToolResult.text(self.tool_call_id, text, call_id=self.call_id)
        await self.sender.send(InputMessage.tool_result(self.thread_id, result), self.tool_call_id)


async def send_tool_error(context: ToolContext, message: str) -> None:
    """Answer the current call with ``Error: {message}``."""
    await context.send_result(f"Error: {message}")


class Tool:
    """Base class for tools. Subclasses set the class attributes and override ``execute``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    inline: ClassVar[bool] = False
    passive: ClassVar[bool] = False
    #: Later inputs (reports, parent messages) refer to this tool's calls by id, so the runtime indexes
    #: them durably: they stay resolvable after compaction hides them.
    referenced_later: ClassVar[bool] = False
    #: One of stepagent's built-in tools (offered as ``STEPAGENT_BUILTIN_TOOLS`` selects); a user tool
    #: that happens to share a built-in's name is not one.
    builtin: ClassVar[bool] = False
    #: Whether a call of this tool is ever answered by a result. ``False`` for a call that only waits for
    #: the next input (``sleep_until_event_or_input``): nothing runs for it, so it keeps nothing resident.
    answered: ClassVar[bool] = True
    #: Every call of this tool waits for a person's decision before it runs (``@tool(approval=True)``);
    #: ``STEPAGENT_APPROVAL`` and a profile's ``approval`` select more tools by name.
    approval: ClassVar[bool] = False
    #: What a thread waiting on this tool's call waits on (``stepagent.core.cache_ttl``): ``"tool"`` (a
    #: dispatched function, usually seconds), ``"rap"`` (a remote server that may take minutes or hours),
    #: ``"sleep"`` (a timer), ``"child"`` (a spawned thread's report).
    wait: ClassVar[str] = "tool"

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def display(self, arguments: dict[str, Any]) -> str | None:
        """An optional one-line rendering of a call for UIs."""
        return None

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | None:
        """Synchronous tools return the result; asynchronous tools dispatch and return ``None``."""
        raise NotImplementedError


@dataclass(slots=True)
class Toolset:
    """An ordered set of tools with unique names. Duplicates are an error at load, never a silent shadow."""

    tools: dict[str, Tool] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Iterable[Tool]) -> Toolset:
        toolset = cls()
        toolset.extend(tools)
        return toolset

    def add(self, tool: Tool) -> None:
        if not tool.name:
            raise ConfigurationError(f"tool {tool!r} has no name")
        if tool.name == "receive_event__injected":
            raise ConfigurationError(
                "the tool name 'receive_event__injected' is reserved for injected events"
            )
        if tool.name in self.tools:
            raise ConfigurationError(f"two tools are named {tool.name!r}; tool names must be unique")
        self.tools[tool.name] = tool

    def extend(self, tools: Iterable[Tool]) -> None:
        for tool in tools:
            self.add(tool)

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def specs(self) -> list[ToolSpec]:
        return [tool.spec() for tool in self.tools.values()]

    def names(self) -> Sequence[str]:
        return list(self.tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools.values())

    def __len__(self) -> int:
        return len(self.tools)

    def __contains__(self, name: object) -> bool:
        return name in self.tools
