"""Run a whole conversation in one call and get a transcript to assert on.

``run_conversation(["weather in Paris?"], model=..., tools=[get_weather])`` drives step mode in this
process exactly as the queue would (every input a step; tool calls dispatched and their results fed back;
child threads spawned, reporting and closing) on in-memory stores, until nothing is left to do, then returns
a :class:`Transcript`: the stored items of the thread tree in the shape of ``stepagent history --json``
(limit stops apart, in ``Transcript.limits``).

The model is the scripted model (a script file path, ``scripted:<path>``, or the script as a dict), any
:class:`~stepagent.providers.base.ModelProvider`, or a plain Python function of a :class:`ModelTurn`
returning text, a :class:`Call`, or a list of both (like pydantic-ai's FunctionModel). Deterministic: no
network, no clock, no randomness; the same inputs give the same transcript. A step that fails raises
:class:`ConversationFailed` naming the thread and the error (pass ``raise_on_error=False`` to inspect
``Transcript.errors`` instead). Synchronous :func:`run_conversation` for any test runner; :func:`arun_conversation`
inside an event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from stepagent.agent_config import AgentConfig
from stepagent.core.step import StepConfig
from stepagent.errors import StepagentError
from stepagent.events import EventCollector, LimitReached, StepFailed, TurnComplete
from stepagent.history_items import EventItem, HistoryItem, ToolResultItem, UserItem
from stepagent.ids import derived_id
from stepagent.messages import InputMessage, TextContent, ToolCall
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import (
    Final,
    ModelInfo,
    ModelProvider,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
)
from stepagent.providers.scripted import ScriptedProvider
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.memory import memory_stores
from stepagent.testing.inprocess import InProcessQueueDriver
from stepagent.tools.base import Tool, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import InProcessFunctionRunner, Invocable
from stepagent.transcript import Item, item_line, tree_items


class ConversationFailed(StepagentError):
    """A step of the conversation failed (the model raised, a store failed, an invariant broke)."""


@dataclass(frozen=True, slots=True)
class Call:
    """What a function model returns to call a tool."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """What a function model sees for one completion."""

    #: The text of the last user, tool-result or event item ("" if none) and which of those it was.
    last_input: str
    last_kind: str
    thread_id: str
    #: The requesting thread's stack, root first.
    thread_stack: list[str]
    #: The names of the tools offered.
    tools: list[str]
    #: The full request, for anything the fields above do not show.
    request: ModelRequest


Reply = str | Call | Sequence[str | Call]
ModelFunction = Callable[[ModelTurn], Reply | Awaitable[Reply]]


def _last_input(history: Sequence[HistoryItem]) -> tuple[str, str]:
    for item in reversed(history):
        if isinstance(item, UserItem) and isinstance(item.content, TextContent):
            return item.content.text, "user"
        if isinstance(item, ToolResultItem):
            return item.result.joined_text(), "tool_result"
        if isinstance(item, EventItem):
            return item.result.joined_text(), "event"
    return "", ""


class FunctionModelProvider:
    """A :class:`ModelProvider` that answers each request with ``function(turn)``. Tool-call ids are
    derived from the thread and the request, so a re-run is identical."""

    def __init__(self, function: ModelFunction, *, context_window: int = 200_000) -> None:
        self._function = function
        self._info = ModelInfo(
            f"function:{getattr(function, '__name__', 'model')}", context_window=context_window
        )

    @property
    def info(self) -> ModelInfo:
        return self._info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        text, kind = _last_input(request.history)
        thread = request.thread_stack[-1] if request.thread_stack else ""
        turn = ModelTurn(
            text, kind, thread, list(request.thread_stack), [t.name for t in request.tools], request
        )
        reply = self._function(turn)
        if inspect.isawaitable(reply):
            reply = await reply
        parts: Sequence[str | Call] = [reply] if isinstance(reply, str | Call) else reply
        for index, part in enumerate(parts):
            if isinstance(part, str):
                yield TextDelta(part)
            else:
                call_id = "call_" + derived_id(thread, str(len(request.history)), str(index))[:12]
                yield ToolCallComplete(ToolCall(id=call_id, name=part.name, arguments=dict(part.arguments)))
        yield Final()


class LimitHit(TypedDict):
    """A limit that stopped a thread (its limit output event)."""

    thread_id: str
    limit: str
    value: float
    used: float


@dataclass(slots=True)
class Transcript:
    """The stored items of the conversation's thread tree (``stepagent history --json`` shape)."""

    root_id: str
    items: list[Item]
    errors: list[str] = field(default_factory=list)
    #: The root thread's structured output of the last turn (``turn_complete.output``; ``None`` without
    #: an output schema, or when the last answer did not match it).
    output: Any = None
    #: Every limit that stopped a thread: ``{"thread_id", "limit", "value", "used"}`` (its output event).
    limits: list[LimitHit] = field(default_factory=list)
    #: ``error`` events the agent emitted without failing a step (e.g. an answer that never matched the
    #: output schema), as their messages.
    error_events: list[str] = field(default_factory=list)

    def of(self, thread_id: str | None = None) -> list[Item]:
        """The items of one thread (default: the root)."""
        wanted = self.root_id if thread_id is None else thread_id
        return [i for i in self.items if i["thread_id"] == wanted]

    def texts(self, thread_id: str | None = None) -> list[str]:
        """The assistant texts of one thread (default: the root), in order."""
        return [i["text"] for i in self.of(thread_id) if i["kind"] == "assistant"]

    @property
    def reply(self) -> str:
        """The root thread's last assistant text ("" if it never answered)."""
        texts = self.texts()
        return texts[-1] if texts else ""

    def tool_calls(self, name: str | None = None) -> list[dict[str, Any]]:
        """The arguments of every tool call in the tree (of ``name`` only, if given), in order."""
        return [i["args"] for i in self.items if i["kind"] == "tool_call" and name in (None, i["name"])]

    def tool_results(self, name: str | None = None) -> list[str]:
        """The result texts of the tree's tool calls (of ``name`` only, if given)."""
        names = {i["tool_call_id"]: i["name"] for i in self.items if i["kind"] == "tool_call"}
        return [
            i["text"]
            for i in self.items
            if i["kind"] == "tool_result" and name in (None, names.get(i["tool_call_id"]))
        ]

    @property
    def threads(self) -> list[str]:
        """Every thread of the tree, root first."""
        return list(dict.fromkeys(i["thread_id"] for i in self.items))

    def lines(self) -> list[str]:
        """A readable rendering (for assertion messages and debugging), as the chat shows the items; kinds
        the chat does not show (reasoning, summaries) as ``kind: text``."""
        out = []
        for item in self.items:
            line = item_line(item, self.root_id)
            if line is None:
                who = "agent" if item["thread_id"] == self.root_id else f"[child {item['thread_id'][:8]}]"
                line = f"{who} {item['kind']}: {item.get('text', '')}"
            out.append(line)
        return out


def _provider(
    model: str | os.PathLike[str] | Mapping[str, Any] | ModelProvider | ModelFunction,
) -> ModelProvider:
    if isinstance(model, str | os.PathLike | Mapping):
        return ScriptedProvider(model)
    if callable(model) and not hasattr(model, "stream"):
        return FunctionModelProvider(model)
    return model  # type: ignore[return-value]


async def arun_conversation(
    messages: str | Sequence[str],
    *,
    model: str | os.PathLike[str] | Mapping[str, Any] | ModelProvider | ModelFunction,
    tools: Sequence[Tool] = (),
    thread_id: str = "conversation",
    system_prompt: str | None = None,
    raise_on_error: bool = True,
    max_batches: int = 1000,
    agent: AgentConfig | None = None,
    output_schema: Any = None,
) -> Transcript:
    """Send each of ``messages`` (as user text) to ``thread_id`` in turn, letting the agent finish after
    each, and return the transcript. ``tools`` are your tools; the built-in threading tools are added.
    ``agent`` configures the agent (limits, profiles, ...; ``system_prompt`` and ``output_schema``, a
    JSON Schema dict or a pydantic model class, replace its fields when given)."""
    conversation, state = memory_stores()
    sender = InProcessSender()
    user_tools = list(tools)
    config_agent = agent if agent is not None else AgentConfig()
    if system_prompt is not None:
        config_agent = AgentConfig(**{**dict(config_agent), "system_prompt": system_prompt})
    if output_schema is not None:
        config_agent = AgentConfig(**{**dict(config_agent), "output_schema": output_schema})
    config = StepConfig(
        provider=_provider(model),
        toolset=Toolset.of([*user_tools, *builtin_tools()]),
        sender=sender,
        runner=InProcessFunctionRunner([t for t in user_tools if isinstance(t, Invocable)]),
        agent=config_agent,
    )
    driver = InProcessQueueDriver(AgentSystem(conversation, state, config), sender)
    errors: list[str] = []
    events = EventCollector()
    for index, text in enumerate([messages] if isinstance(messages, str) else messages):
        message_id = f"{thread_id}-message-{index + 1}"
        await driver.send(InputMessage.user_text(thread_id, text, id=message_id), message_id)
        for result in await driver.run_until_idle(events, max_batches=max_batches):
            if result.error is not None:
                errors.append(f"thread {result.thread_id}: {type(result.error).__name__}: {result.error}")
    # A limit stop is asserted on through ``Transcript.limits``; the items are the conversation's own
    # (a refused input, kept with the thread, stays an ``error`` item as ``history --json`` lists it).
    items = [item async for item in tree_items(conversation, thread_id) if item["kind"] != "limit"]
    transcript = Transcript(thread_id, items, errors)
    for source, event in events.events:
        if isinstance(event, TurnComplete) and source == thread_id:
            transcript.output = event.output if event.has_output else None
        elif isinstance(event, LimitReached):
            transcript.limits.append(
                {"thread_id": source, "limit": event.limit, "value": event.value, "used": event.used}
            )
        elif isinstance(event, StepFailed) and not event.retrying:
            transcript.error_events.append(event.message)
    if errors and raise_on_error:
        raise ConversationFailed("; ".join(errors) + "\ntranscript:\n" + "\n".join(transcript.lines()))
    return transcript


def run_conversation(
    messages: str | Sequence[str],
    *,
    model: str | os.PathLike[str] | Mapping[str, Any] | ModelProvider | ModelFunction,
    tools: Sequence[Tool] = (),
    thread_id: str = "conversation",
    system_prompt: str | None = None,
    raise_on_error: bool = True,
    max_batches: int = 1000,
    agent: AgentConfig | None = None,
    output_schema: Any = None,
) -> Transcript:
    """:func:`arun_conversation` for synchronous code (any test runner; no asyncio plugin needed)."""
    return asyncio.run(
        arun_conversation(
            messages,
            model=model,
            tools=tools,
            thread_id=thread_id,
            system_prompt=system_prompt,
            raise_on_error=raise_on_error,
            max_batches=max_batches,
            agent=agent,
            output_schema=output_schema,
        )
    )
