"""A deployment-shaped stack on moto for client tests: fresh tables, queues and bucket (the production
definitions), the real worker, tool runner and timer relay fed by Lambda-like SQS event sources
(:func:`stepagent.devstack.services.local_services`), the RAP receiver and the demo RAP tool server on
loopback. Tests talk to it only through :mod:`stepagent.client` (or the CLI, which uses it).

The model is a Python function of the request that may pause mid-stream on a :class:`Gate`, so a test can
look at the live partial text while the completion is still running, then let it finish.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from stepagent.aws.settings import Settings
from stepagent.devstack.services import LocalServices, local_services
from stepagent.history_items import EventItem, HistoryItem, ToolResultItem, UserItem
from stepagent.messages import TextContent, ToolCall
from stepagent.providers.base import Final, ModelInfo, ModelRequest, StreamEvent, TextDelta, ToolCallComplete
from stepagent.providers.prices import PriceTable, parse_prices
from stepagent.tools.base import Tool
from tests.conftest import aws_client, unique_name
from tests.integration.aws_helpers import create_resources, delete_resources


class Gate:
    """A pause point in a stream: the model waits at it until the test opens it."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self._open = asyncio.Event()

    def open(self) -> None:
        self._open.set()

    async def wait(self) -> None:
        self.reached.set()
        await self._open.wait()


Step = StreamEvent | Gate | Exception


def last_input(history: Sequence[HistoryItem]) -> str:
    for item in reversed(history):
        if isinstance(item, UserItem) and isinstance(item.content, TextContent):
            return item.content.text
        if isinstance(item, ToolResultItem | EventItem):
            return item.result.joined_text()
    return ""


def say(*chunks: str | Gate) -> list[Step]:
    return [TextDelta(c) if isinstance(c, str) else c for c in chunks] + [Final()]


def call(name: str, call_id: str, /, *before: str | Gate, **arguments: Any) -> list[Step]:
    steps: list[Step] = [TextDelta(c) if isinstance(c, str) else c for c in before]
    return [*steps, ToolCallComplete(ToolCall(id=call_id, name=name, arguments=arguments)), Final()]


@dataclass
class FunctionModel:
    """Answers each request with ``reply(last input text, request)``."""

    reply: Callable[[str, ModelRequest], list[Step]]
    requests: list[ModelRequest] = field(default_factory=list)

    @property
    def info(self) -> ModelInfo:
        return ModelInfo("function", context_window=1_000_000)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        for step in self.reply(last_input(request.history), request):
            if isinstance(step, Gate):
                await step.wait()
            elif isinstance(step, Exception):
                raise step
            else:
                yield step


@dataclass
class Deployment:
    settings: Settings
    services: LocalServices

    @property
    def live_metrics(self) -> Any:
        return self.services.runtime.live.metrics

    def env(self) -> dict[str, str]:
        """The settings as environment variables (for the CLI in a subprocess)."""
        s = self.settings
        return {
            "STEPAGENT_CONVERSATION_TABLE": str(s.conversation_table),
            "STEPAGENT_STATE_TABLE": str(s.state_table),
            "STEPAGENT_INPUT_QUEUE_URL": str(s.input_queue_url),
            "STEPAGENT_OUTPUT_QUEUE_URL": str(s.output_queue_url),
            "STEPAGENT_BLOB_BUCKET": str(s.blob_bucket),
            "AWS_ENDPOINT_URL": str(s.endpoint_url),
            "AWS_REGION": str(s.region),
        }


@asynccontextmanager
async def deployment(
    model: Any,
    *,
    live_text: bool = True,
    agent_settings: dict[str, str] | None = None,
    tools: Sequence[Tool] | None = None,
    prices: PriceTable | str | None = None,
    mcp_servers: tuple[Any, ...] = (),
    settings_overrides: dict[str, Any] | None = None,
) -> AsyncIterator[Deployment]:
    """The stack, running until the context exits (``model``: a provider, e.g. :class:`FunctionModel`;
    ``agent_settings``: ``STEPAGENT_*`` agent settings, e.g. ``STEPAGENT_APPROVAL``; ``tools``: the
    agent's Python tools; ``prices``: the model prices, as ``STEPAGENT_PRICES`` would give them;
    ``settings_overrides``: other :class:`Settings` fields, e.g. ``state_dir``)."""
    if isinstance(prices, str):  # as STEPAGENT_PRICES says it
        prices = parse_prices(prices)
    async with AsyncExitStack() as stack:
        sqs = await stack.enter_async_context(aws_client("sqs"))
        s3 = await stack.enter_async_context(aws_client("s3"))
        dynamodb = await stack.enter_async_context(aws_client("dynamodb"))
        resources, settings = await create_resources(sqs, s3, dynamodb, unique_name("cl"))
        stack.push_async_callback(delete_resources, sqs, dynamodb, resources, settings)
        settings = dataclasses.replace(
            settings,
            callback_secret=secrets.token_hex(16),
            live_text=live_text,
            agent_settings={**settings.agent_settings, **(agent_settings or {})},
            prices=prices if prices is not None else settings.prices,
            mcp_servers=mcp_servers or settings.mcp_servers,
            **(settings_overrides or {}),
        )
        services = await stack.enter_async_context(
            local_services(settings, demo=True, provider=model, tools=tools)
        )
        yield Deployment(services.settings, services)
