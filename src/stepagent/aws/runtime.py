"""The AWS runtime: everything the handlers need, built once per process from :class:`Settings`.

Guarantees:

- :meth:`AwsRuntime.create` does all cold-start work once: settings are checked for the roles asked
  (``worker``, ``tool_runner``, ``timer_relay``; one :class:`~stepagent.errors.ConfigurationError` naming
  every missing variable; for the worker, the agent settings too, one line per bad value), AWS
  clients are opened once (:mod:`stepagent.aws.clients`, ``AWS_ENDPOINT_URL`` honoured), the stores, the
  model providers (the default one and one per profile model) and the toolsets are built. A provider's
  own client (Bedrock's, an HTTP provider's) opens at its first model call and is kept; all close with
  the runtime. The EventBridge Scheduler and S3 clients are opened on
  first use only (long timers; payloads too large for a message or an item).
  Its HTTP clients and locks are bound to the event loop that created it: call its handlers on that loop.
- The handlers (:meth:`handle_sqs_batch`, :meth:`handle_tool_batch`, :meth:`handle_delay_batch`) take a
  Lambda-shaped event and return ``{"batchItemFailures": [...]}``; they never raise for a partial failure.
  ``remaining_ms`` (the Lambda context's ``get_remaining_time_in_millis``) bounds provider retries and tool
  runs, so a retry that cannot finish in time is not started.
- The input DLQ (for bad input) is the explicit ``input_dlq_url``, else the input queue's redrive target,
  read once with ``GetQueueAttributes`` on first need.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any

from stepagent.agent_config import AgentConfig
from stepagent.aws.clients import AwsSession, LazyClient, aws_session, client
from stepagent.aws.inbox import InboxSender
from stepagent.aws.lambda_events import BatchResponse, SqsEvent
from stepagent.aws.live import LiveText, NoticingPublisher
from stepagent.aws.secrets import provider_environment, resolve_secrets
from stepagent.aws.settings import Settings
from stepagent.aws.timers import AwsTimers, deliver_due_schedules, handle_delay_batch
from stepagent.aws.tool_runner import SqsFunctionRunner, handle_tool_batch
from stepagent.aws.worker import CountingMetrics, MetricsSink, Worker
from stepagent.blobs import ContentBlobs
from stepagent.config_fingerprint import config_fingerprint
from stepagent.core.completion import RetryPolicy
from stepagent.core.step import StepConfig
from stepagent.core.thread_cache import ThreadCache
from stepagent.errors import ConfigurationError
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import ModelProvider
from stepagent.providers.factory import make_provider
from stepagent.senders.sqs import SqsQueues, SqsSender
from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore, dynamo_stores
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.dynamodb.quotas import SubjectCounters
from stepagent.stores.metrics import StoreMetrics
from stepagent.tools.base import Tool, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import Invocable, load_toolset
from stepagent.tools.mcp_config import needs_oauth
from stepagent.tools.remote import load_remote
from stepagent.tools.sleep import Clock, Sleep, SleepUntil, utc_now
from stepagent.tracing import Tracer

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_scheduler import EventBridgeSchedulerClient
    from types_aiobotocore_sqs import SQSClient

    from stepagent.tools.mcp_oauth import OAuthServices  # loaded at run time only where sign-ins are used

WORKER, TOOL_RUNNER, TIMER_RELAY = "worker", "tool_runner", "timer_relay"
ALL_ROLES = frozenset({WORKER, TOOL_RUNNER, TIMER_RELAY})

_QUEUE_AND_BUCKET = ("STEPAGENT_INPUT_QUEUE_URL", "STEPAGENT_BLOB_BUCKET")
_REQUIRED: dict[str, tuple[str, ...]] = {
    WORKER: (
        "STEPAGENT_CONVERSATION_TABLE",
        "STEPAGENT_STATE_TABLE",
        *_QUEUE_AND_BUCKET,
        "STEPAGENT_OUTPUT_QUEUE_URL",
        "STEPAGENT_DELAY_QUEUE_URL",
        "STEPAGENT_TOOL_QUEUE_URL",
        "STEPAGENT_SCHEDULER_ROLE_ARN",
        "STEPAGENT_SCHEDULER_DLQ_ARN",
    ),
    TOOL_RUNNER: _QUEUE_AND_BUCKET,
    TIMER_RELAY: _QUEUE_AND_BUCKET,
}

RemainingMs = Callable[[], int]
_REMAINING: ContextVar[RemainingMs | None] = ContextVar("stepagent_remaining_ms", default=None)


def remaining_seconds() -> float:
    """Seconds left in the current invocation (infinite outside one)."""
    remaining = _REMAINING.get()
    return math.inf if remaining is None else remaining() / 1000.0


class AwsRuntime:
    """Clients, stores, provider, tools and the three batch handlers. Build with :meth:`create`."""

    settings: Settings
    roles: frozenset[str]
    sqs: SQSClient
    s3: S3Client
    dynamodb: DynamoDBClient
    queues: SqsQueues
    sender: SqsSender
    metrics: MetricsSink
    #: Every store and blob S3 call of this runtime (the queues' claim checks included).
    store_metrics: StoreMetrics
    blobs: ContentBlobs | None
    user_tools: list[Tool]
    function_tools: dict[str, Invocable]
    agent: AgentConfig
    tracer: Tracer | None
    live: LiveText

    def __init__(self) -> None:
        self.agent = AgentConfig()
        self.tracer = None
        self.profile_providers: dict[str, ModelProvider] = {}
        self._stack = AsyncExitStack()
        self._scheduler_client: EventBridgeSchedulerClient | None = None
        self._scheduler_lock = asyncio.Lock()
        self._input_dlq: str | None = None
        self._worker: Worker | None = None
        self._system: AgentSystem | None = None
        self._stores: tuple[DynamoConversationStore, DynamoStateStore] | None = None
        #: Reads a person's answer to an MCP server's question (the tool runner role; see handle_tool_batch).
        self._read_kept: Callable[[str], Awaitable[str | None]] | None = None
        #: Users' sign-ins to ``"auth": "oauth"`` MCP servers (``None``: no such server).
        self.oauth: OAuthServices | None = None
        self.live = LiveText.disabled()
        # The providers this runtime built: their HTTP/AWS clients (kept per loop) close with it.
        self._made_providers: list[ModelProvider] = []

    @classmethod
    async def create(
        cls,
        settings: Settings | None = None,
        *,
        roles: Iterable[str] = ALL_ROLES,
        provider: ModelProvider | None = None,
        tools: Sequence[Tool] | None = None,
        input_dlq_url: str | None = None,
        metrics: MetricsSink | None = None,
        session: AwsSession | None = None,
        clock: Clock = utc_now,
        agent: AgentConfig | None = None,
        tracer: Tracer | None = None,
    ) -> AwsRuntime:
        """Build the runtime for ``roles``. ``provider``/``tools``/``agent`` override ``STEPAGENT_MODEL``/
        ``STEPAGENT_TOOLS``/the agent settings; ``tracer`` receives the steps' spans (none: no tracing)."""
        settings = settings if settings is not None else Settings.from_env()
        wanted = frozenset(roles)
        if not wanted or wanted - ALL_ROLES:
            raise ConfigurationError(
                f"roles must be a non-empty subset of {sorted(ALL_ROLES)}, got {sorted(wanted)}"
            )
        required = {name for role in wanted for name in _REQUIRED[role]}
        if WORKER in wanted and provider is None:
            required.add("STEPAGENT_MODEL")
        settings.require(*sorted(required))
        runtime = cls()
        runtime.settings, runtime.roles = settings, wanted
        runtime.metrics = metrics if metrics is not None else CountingMetrics()
        runtime._input_dlq = input_dlq_url
        # Everything that can fail on configuration runs before any client is opened.
        runtime.user_tools = (
            list(tools) if tools is not None else (load_toolset(settings.tools) if settings.tools else [])
        )
        runtime.function_tools = {t.name: t for t in runtime.user_tools if isinstance(t, Invocable)}
        if WORKER in wanted:
            runtime.agent = agent if agent is not None else settings.agent_config()
        runtime.tracer = tracer
        session = session if session is not None else aws_session(settings)
        if WORKER in wanted:
            settings = runtime.settings = await resolve_secrets(settings, session)
            # API keys: from a secret when STEPAGENT_PROVIDER_API_KEY_ID is set, else the environment.
            environ = provider_environment(settings, dict(os.environ))
            if provider is None:
                provider = make_provider(
                    str(settings.model), environ=environ, context_window=runtime.agent.context_window
                )
                runtime._made_providers.append(provider)
            for profile in runtime.agent.profiles.values():
                if isinstance(profile.model, str) and profile.model not in runtime.profile_providers:
                    runtime.profile_providers[profile.model] = made = make_provider(
                        profile.model, environ=environ, context_window=profile.context_window
                    )
                    runtime._made_providers.append(made)
        try:
            await runtime._open(session, provider, clock)
        except BaseException:
            await runtime.aclose()
            raise
        return runtime

    async def _open(self, session: AwsSession, provider: ModelProvider | None, clock: Clock) -> None:
        settings = self.settings
        self._session = session
        for made in self._made_providers:
            close = getattr(made, "aclose", None)
            if close is not None:
                self._stack.push_async_callback(close)
        self.sqs = await self._stack.enter_async_context(client(session, "sqs", settings))
        # S3 holds only oversized payloads: its client (the largest service model) opens on first use.
        self.s3 = LazyClient(
            lambda: self._stack.enter_async_context(client(session, "s3", settings))
        ).as_client()
        self.store_metrics = StoreMetrics()
        # One ContentBlobs for the queues, the stores and the publisher: a text that arrived by reference is
        # known to exist, so its row and output event store it no second time (stepagent.blobs).
        bucket = settings.blob_bucket
        self.blobs = ContentBlobs(self.s3, bucket, self.store_metrics) if bucket else None
        self.queues = SqsQueues(self.sqs, blobs=self.blobs)
        self.sender = SqsSender(self.sqs, str(settings.input_queue_url), queues=self.queues)
        local_tools = [*builtin_tools(), Sleep(), SleepUntil(clock), *self.user_tools]
        if WORKER not in self.roles:
            if TOOL_RUNNER in self.roles and settings.mcp_servers:
                from stepagent.tools.mcp import load_mcp_tools

                mcp_tools = await load_mcp_tools(settings.mcp_servers, existing=local_tools)
                self.function_tools.update({t.name: t for t in mcp_tools if isinstance(t, Invocable)})
                if settings.state_table:
                    # An older MCP server's call is held open for the person's answer, which the thread's
                    # step keeps in the state table (read only).
                    dynamodb = await self._stack.enter_async_context(client(session, "dynamodb", settings))
                    _, reader = dynamo_stores(
                        dynamodb,
                        conversation_table=str(settings.conversation_table or settings.state_table),
                        state_table=str(settings.state_table),
                    )
                    self._read_kept = reader.cache_get
                    if needs_oauth(settings.mcp_servers):
                        from stepagent.aws.oauth_setup import open_oauth  # the sign-in code: only if used

                        self.oauth = await open_oauth(
                            settings, reader, self._stack, session=session, required=True
                        )
                elif needs_oauth(settings.mcp_servers):
                    raise ConfigurationError(
                        'an MCP server with "auth": "oauth" needs STEPAGENT_STATE_TABLE (where sign-ins and tokens are kept)'
                    )
            return
        assert provider is not None  # create() resolved it for the worker role
        self.dynamodb = await self._stack.enter_async_context(client(session, "dynamodb", settings))
        self._stores = conversation, state = dynamo_stores(
            self.dynamodb,
            conversation_table=str(settings.conversation_table),
            state_table=str(settings.state_table),
            s3_client=self.s3,
            bucket=settings.blob_bucket,
            metrics=self.store_metrics,
            blobs=self.blobs,
            page_size=None,  # DynamoDB's 1 MB pages: one Query for any context under a megabyte
        )
        if needs_oauth(settings.mcp_servers) and TOOL_RUNNER in self.roles:
            # The tool runner makes the MCP calls: a worker alone never opens a user's tokens.
            from stepagent.aws.oauth_setup import open_oauth

            self.oauth = await open_oauth(settings, state, self._stack, session=session, required=True)
        timers = AwsTimers(
            self.queues,
            delay_queue_url=str(settings.delay_queue_url),
            input_queue_url=str(settings.input_queue_url),
            scheduler=self.scheduler,
            role_arn=settings.scheduler_role_arn,
            dead_letter_arn=settings.scheduler_dlq_arn,
            clock=clock,
        )
        # Remote tools (RAP servers, MCP servers) are listed once per process, at cold start. Only RAP
        # servers need an HTTP client: without them httpx is not even imported.
        http = None
        if settings.rap_servers:
            import httpx

            http = await self._stack.enter_async_context(httpx.AsyncClient(timeout=30.0))
        remote = await load_remote(
            settings, state, http, existing=local_tools, mcp=bool(settings.mcp_servers)
        )
        self.function_tools.update({t.name: t for t in remote.tools if isinstance(t, Invocable)})
        toolset = Toolset.of([*local_tools, *remote.tools])
        # Each commit records the release and this configuration on its thread's head (stepagent configs).
        conversation.config_fingerprint = config_fingerprint(
            self.agent, [t.name for t in (*local_tools, *remote.tools)], settings.model
        )
        # Thread-to-thread messages are noted on the target's head first (what clients read to tell idle).
        config = StepConfig(
            provider=provider,
            toolset=toolset,
            sender=InboxSender(self.sender, conversation),
            callback_url=settings.callback_url,
            timers=timers,
            runner=SqsFunctionRunner(self.queues, str(settings.tool_queue_url)),
            notifier=remote.notifier,
            retry=RetryPolicy(remaining=remaining_seconds),
            agent=self.agent,
            providers=self.profile_providers,
            tracer=self.tracer,
            thread_cache=ThreadCache(settings.thread_cache_bytes),
            prices=settings.prices,
        )
        self._system = AgentSystem(conversation, state, config)
        self.live = LiveText(self.dynamodb, str(settings.state_table), enabled=settings.live_text)
        publisher = NoticingPublisher(
            self.queues, str(settings.output_queue_url), conversation, state, self.live
        )
        self._worker = Worker(
            self._system,
            self.queues,
            publisher,
            self.input_dlq_url,
            self.metrics,
            live=self.live,
            max_receive_count=settings.max_receive_count,
            counters=SubjectCounters(
                DynamoIo(self.dynamodb, None, None, self.store_metrics), str(settings.state_table)
            ),
        )

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: Settings | None = None, **options: Any) -> AsyncIterator[AwsRuntime]:
        """``async with AwsRuntime.open(settings) as runtime``: :meth:`create`, closed on exit."""
        runtime = await cls.create(settings, **options)
        try:
            yield runtime
        finally:
            await runtime.aclose()

    async def aclose(self) -> None:
        await self._stack.aclose()

    async def __aenter__(self) -> AwsRuntime:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- the parts ----------------------------------------------------------------------------------------

    @property
    def system(self) -> AgentSystem:
        if self._system is None:
            raise ConfigurationError("this runtime was not built for the worker role")
        return self._system

    @property
    def worker(self) -> Worker:
        if self._worker is None:
            raise ConfigurationError("this runtime was not built for the worker role")
        return self._worker

    @property
    def conversation(self) -> DynamoConversationStore:
        if self._stores is None:
            raise ConfigurationError("this runtime was not built for the worker role")
        return self._stores[0]

    @property
    def state(self) -> DynamoStateStore:
        if self._stores is None:
            raise ConfigurationError("this runtime was not built for the worker role")
        return self._stores[1]

    async def scheduler(self) -> EventBridgeSchedulerClient:
        """The EventBridge Scheduler client, opened on first use (only long timers need it)."""
        async with self._scheduler_lock:
            if self._scheduler_client is None:
                self._scheduler_client = await self._stack.enter_async_context(
                    client(self._session, "scheduler", self.settings)
                )
        return self._scheduler_client

    async def input_dlq_url(self) -> str:
        """Where bad input is copied: explicit, else the input queue's redrive target (same account/region,
        so its URL is the input queue's with the last path segment replaced)."""
        if self._input_dlq is None:
            url = str(self.settings.input_queue_url)
            found = await self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
            policy = found.get("Attributes", {}).get("RedrivePolicy")
            if not policy:
                raise ConfigurationError(
                    f"the input queue {url} has no RedrivePolicy, so bad input has no DLQ"
                )
            arn = str(json.loads(policy)["deadLetterTargetArn"])
            self._input_dlq = url.rsplit("/", 1)[0] + "/" + arn.rsplit(":", 1)[1]
        return self._input_dlq

    # ---- handlers -----------------------------------------------------------------------------------------

    async def handle_sqs_batch(
        self, event: SqsEvent, remaining_ms: RemainingMs | None = None
    ) -> BatchResponse:
        """The worker: one input-queue batch → steps → output events."""
        token = _REMAINING.set(remaining_ms)
        try:
            return await self.worker.handle(event)
        finally:
            _REMAINING.reset(token)

    async def handle_tool_batch(
        self, event: SqsEvent, remaining_ms: RemainingMs | None = None
    ) -> BatchResponse:
        """The tool runner: run queued function-tool calls and send their results."""
        read_kept = self._read_kept
        if read_kept is None and self._stores is not None:
            read_kept = self._stores[1].cache_get
        return await handle_tool_batch(
            event,
            self.function_tools,
            self.queues,
            self.sender,
            remaining_ms,
            tracer=self.tracer,
            metrics=self.metrics,
            read_kept=read_kept,
            input_wait=self.settings.mcp_input_wait,
            oauth=self.oauth,
        )

    async def handle_delay_batch(
        self, event: SqsEvent, remaining_ms: RemainingMs | None = None
    ) -> BatchResponse:
        """The timer relay: forward due delay-queue wake-ups to the input queue."""
        return await handle_delay_batch(event, self.queues, self.sender)

    async def deliver_due_schedules(self, now: datetime | None = None) -> int:
        """Fire due long timers where EventBridge Scheduler does not run (moto)."""
        return await deliver_due_schedules(await self.scheduler(), self.sqs, now)
