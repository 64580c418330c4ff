"""The running half of the local stack: the Lambda stand-ins of ``stepagent run``.

:func:`local_services` serves the RAP receiver on loopback (unless ``STEPAGENT_CALLBACK_URL`` points
elsewhere) and, for the demo, the demo RAP tool server; opens the real :class:`~stepagent.aws.runtime.AwsRuntime`;
and feeds the worker, the tool runner and the timer relay from their queues with
:class:`~stepagent.devstack.poller.SqsEventSource` (Lambda's SQS event source), delivering due
EventBridge schedules itself (moto never fires them). Everything stops when the context exits. What talks
to the agent is :mod:`stepagent.client`, exactly as against a deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stepagent.aws.runtime import AwsRuntime
from stepagent.aws.settings import Settings
from stepagent.devstack.poller import SqsEventSource
from stepagent.providers.base import ModelProvider

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LocalServices:
    """The runtime and its event sources, while :func:`local_services` runs."""

    settings: Settings
    runtime: AwsRuntime
    sources: list[SqsEventSource] = field(default_factory=list)

    @property
    def batches(self) -> int:
        """Batches handed to the handlers so far (all queues)."""
        return sum(source.batches for source in self.sources)


async def _every(seconds: float, action: Callable[[], Awaitable[object]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await action()
        except Exception:  # keep the local stack alive; the next tick retries
            log.exception("periodic task failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


async def _serve_tool_servers(stack: contextlib.AsyncExitStack, settings: Settings, demo: bool) -> Settings:
    """Serve the receiver (and, for the demo, the demo RAP server); the settings that point at them."""
    from stepagent.aws.clients import aws_session, client
    from stepagent.devstack.rap_demo_server import build_server
    from stepagent.rap.receiver import ViewUpdate
    from stepagent.rap.receiver_app import answered_in, receiver_app
    from stepagent.rap.server import serve_in_background
    from stepagent.senders.sqs import SqsSender
    from stepagent.stores.dynamodb import DynamoStateStore

    session = aws_session(settings)
    sqs = await stack.enter_async_context(client(session, "sqs", settings))
    s3 = await stack.enter_async_context(client(session, "s3", settings))
    sender = SqsSender(sqs, str(settings.input_queue_url), s3_client=s3, bucket=settings.blob_bucket)
    dynamodb = await stack.enter_async_context(client(session, "dynamodb", settings))
    state = DynamoStateStore(
        dynamodb, state_table=str(settings.state_table), s3_client=s3, bucket=settings.blob_bucket
    )

    async def on_view(view: ViewUpdate) -> None:
        log.info("view %s of thread %s updated", view.view_type, view.thread_id)

    if not settings.callback_url:
        app = receiver_app(str(settings.callback_secret), sender, on_view, answered=answered_in(state))
        url = await stack.enter_async_context(serve_in_background(app))
        settings = dataclasses.replace(settings, callback_url=url)
    if demo and not settings.rap_servers:
        tools_url = await stack.enter_async_context(serve_in_background(build_server().app))
        settings = dataclasses.replace(settings, rap_servers=(tools_url,))
    return settings


@contextlib.asynccontextmanager
async def local_services(
    settings: Settings, *, demo: bool = False, provider: ModelProvider | None = None, **runtime_options: Any
) -> AsyncIterator[LocalServices]:
    """Run the worker, tool runner and timer relay of ``settings`` until the context exits. Without a
    ``callback_url`` the receiver is served on loopback, and with ``demo`` and no ``rap_servers`` the demo
    RAP server; :attr:`LocalServices.settings` points at them."""
    async with contextlib.AsyncExitStack() as stack:
        settings = await _serve_tool_servers(stack, settings, demo)
        runtime = await stack.enter_async_context(
            AwsRuntime.open(settings, provider=provider, **runtime_options)
        )
        sqs = runtime.sqs
        assert settings.input_queue_url and settings.tool_queue_url and settings.delay_queue_url
        services = LocalServices(settings, runtime)
        services.sources = [
            SqsEventSource(sqs, settings.input_queue_url, runtime.handle_sqs_batch),
            SqsEventSource(sqs, settings.tool_queue_url, runtime.handle_tool_batch, batch_size=1),
            SqsEventSource(sqs, settings.delay_queue_url, runtime.handle_delay_batch),
        ]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(source.run(stop)) for source in services.sources]
        tasks.append(asyncio.create_task(_every(1.0, runtime.deliver_due_schedules, stop)))
        exporting = runtime.tracer if getattr(runtime.tracer, "exporter", None) is not None else None
        if exporting is not None:
            # Lambda exports after each invocation; here, the spans go out once a second (off the loop).
            flush = getattr(exporting, "flush")  # noqa: B009 - an OtelTracer; the port does not flush
            tasks.append(asyncio.create_task(_every(1.0, lambda: asyncio.to_thread(flush), stop)))
        try:
            yield services
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if exporting is not None:
                await asyncio.to_thread(flush)
