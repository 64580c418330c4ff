"""An in-process stack for RAP end-to-end tests: the engine harness, the demo RAP tool server and the
receiver app, both really listening on loopback, and a model written as a Python function."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from stepagent.aws.settings import Settings
from stepagent.devstack.rap_demo_server import build_server
from stepagent.history_items import EventItem, HistoryItem, ToolCallItem, ToolResultItem, UserItem
from stepagent.messages import TextContent, ToolCall
from stepagent.providers.base import Final, ModelInfo, ModelRequest, StreamEvent, TextDelta, ToolCallComplete
from stepagent.rap.receiver import ViewUpdate
from stepagent.rap.receiver_app import answered_in, receiver_app
from stepagent.rap.server import RapToolServer, serve_in_background
from stepagent.tools.base import Tool
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.remote import load_remote_tools
from tests.engine.harness import Harness
from tests.polling import eventually

SECRET = "e2e-secret"


def say(text: str) -> list[StreamEvent]:
    return [TextDelta(text), Final()]


def call(name: str, tool_call_id: str, /, **arguments: Any) -> list[StreamEvent]:
    return [ToolCallComplete(ToolCall(id=tool_call_id, name=name, arguments=arguments)), Final()]


def last_input(history: Sequence[HistoryItem]) -> str:
    """The text of the last user, tool-result or event item ("" if none)."""
    for item in reversed(history):
        if isinstance(item, UserItem) and isinstance(item.content, TextContent):
            return item.content.text
        if isinstance(item, ToolResultItem | EventItem):
            return item.result.joined_text()
    return ""


@dataclass
class FunctionModel:
    """A model that answers each request with ``reply(request)``."""

    reply: Callable[[ModelRequest], list[StreamEvent]]
    requests: list[ModelRequest] = field(default_factory=list)

    @property
    def info(self) -> ModelInfo:
        return ModelInfo("function", context_window=100_000)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        for event in self.reply(request):
            yield event


@dataclass
class RapStack:
    h: Harness
    model: FunctionModel
    tools_server: RapToolServer
    tools_url: str
    receiver_url: str
    http: httpx.AsyncClient
    views: list[ViewUpdate]

    async def wait_for(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        await eventually(predicate, "the tool server's callbacks", within=within)

    async def wait_queued(self, count: int = 1, within: float = 5.0) -> None:
        """Wait until at least ``count`` messages are on the harness queue."""
        await self.wait_for(lambda: len(self.h.sender.queue) >= count, within)


def find_call(history: Sequence[HistoryItem], name: str) -> ToolCall:
    for item in history:
        if isinstance(item, ToolCallItem) and item.call.name == name:
            return item.call
    raise AssertionError(f"no call of {name} in history")


@asynccontextmanager
async def rap_stack(
    reply: Callable[[ModelRequest], list[StreamEvent]],
    *,
    tools: Sequence[Tool] = (),
    server: RapToolServer | None = None,
) -> AsyncIterator[RapStack]:
    """The stack, with ``server`` as its RAP tool server (the demo one by default)."""
    model = FunctionModel(reply)
    h = Harness(model, tools)
    views: list[ViewUpdate] = []

    async def on_view(view: ViewUpdate) -> None:
        views.append(view)

    async with AsyncExitStack() as stack:
        server = build_server() if server is None else server
        tools_url = await stack.enter_async_context(serve_in_background(server.app))
        receiver_url = await stack.enter_async_context(
            serve_in_background(
                receiver_app(SECRET, h.sender, on_view, answered=answered_in(h.state), path="/rap/callback")
            )
        )
        http = await stack.enter_async_context(httpx.AsyncClient())
        settings = Settings(
            rap_servers=(tools_url,), callback_url=f"{receiver_url}/rap/callback", callback_secret=SECRET
        )
        remote, notifier = await load_remote_tools(
            settings, h.state, http, existing=[*tools, *builtin_tools()]
        )
        h.config.toolset.extend(remote)
        h.config.notifier = notifier
        h.config.callback_url = settings.callback_url
        yield RapStack(h, model, server, tools_url, receiver_url, http, views)
