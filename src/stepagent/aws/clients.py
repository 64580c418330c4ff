"""AWS clients for the async runtime: aioboto3 (aiobotocore over aiohttp), the one stack for every AWS call.

Guarantees:

- :func:`client` / :func:`open_client` yield aiobotocore's low-level client: API methods are coroutines
  with botocore's names and arguments (``await dynamodb.query(TableName=..., ...)``), raising botocore's
  exceptions (``ClientError``; transport failures as ``BotoCoreError`` subclasses), and ``get_paginator``
  gives async paginators (``async for page in paginator.paginate(...)``). It honours the settings'
  endpoint (``AWS_ENDPOINT_URL``: moto, LocalStack) and region, with standard retries (4 attempts) and
  5 s / 30 s connect / read timeouts; leaving the context closes the client's connections.
- Every request runs on the caller's event loop, in the caller's task: concurrent coroutines' calls are in
  flight together (up to :data:`POOL_SIZE` connections per client), botocore's event hooks see the
  caller's context variables (log keys), and cancelling the caller aborts its request — the connection
  is dropped, not left to finish in a thread. (A request already on the wire may still have been
  applied; every write the stores make is conditioned or idempotent for that reason.)
- A streamed response body (S3 ``GetObject``) reads with ``async with response["Body"] as s: await
  s.read()`` and is released on exit.
- A client belongs to the event loop that opened it (its aiohttp connector does). Long-lived owners open
  each client once and keep it: the Lambda runtime for the life of the process (every invocation runs on
  one persistent loop), the Bedrock provider once per loop.
- Nothing here opens a connection or loads a service model until a client is opened; :class:`LazyClient`
  defers even that to the first call, for clients most invocations never use (S3, the largest model).
- TLS: each client builds its verifying context and parses the CA bundle once, at its first request
  (aiobotocore does so even for a plain-HTTP endpoint), and reuses it for all its connections. aiobotocore offers no public way to give several clients
  one context (its ``ssl_context`` connector argument collides with aiohttp's ``ssl``), so a process pays
  one parse per client it opens — which is why clients are opened once and kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

import aioboto3
from aiobotocore.config import AioConfig

from stepagent.aws.settings import Settings

if TYPE_CHECKING:
    # The clients' types come from the types-aiobotocore stubs, a development dependency only: nothing
    # here imports them at run time (the Lambda layer does not ship them).
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_scheduler import EventBridgeSchedulerClient
    from types_aiobotocore_secretsmanager import SecretsManagerClient
    from types_aiobotocore_sqs import SQSClient
    from types_aiobotocore_ssm import SSMClient
    from types_aiobotocore_sts import STSClient

C = TypeVar("C")

# Connections each client keeps: a worker batch runs at most ten threads' steps at once, each with at
# most a couple of requests in flight.
POOL_SIZE = 16

# Standard retry mode with a few attempts: transient AWS errors are retried by botocore first, then by
# the queue redelivering the record.
_CONFIG = AioConfig(
    retries={"max_attempts": 4, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=POOL_SIZE,
)


class AwsSession:
    """One aioboto3 session (credentials, loaded service models) for a region; its clients share them."""

    def __init__(self, region: str, credentials: tuple[str, str] | None = None) -> None:
        """``credentials`` (access key id, secret) replace botocore's lookup chain (benchmarks on moto)."""
        self.region = region
        key, secret = credentials if credentials is not None else (None, None)
        self.session = aioboto3.Session(
            region_name=region, aws_access_key_id=key, aws_secret_access_key=secret
        )

    def client(
        self, service: str, endpoint_url: str | None = None, config: AioConfig | None = None
    ) -> AbstractAsyncContextManager[Any]:
        """An async context manager opening a client for ``service`` on the running loop (see the module
        docstring). ``config`` overrides the defaults it sets (tests use it for fewer retries)."""
        merged = _CONFIG if config is None else _CONFIG.merge(config)
        opening: AbstractAsyncContextManager[Any] = self.session.client(
            service, region_name=self.region, endpoint_url=endpoint_url, config=merged
        )
        return opening


def aws_session(settings: Settings) -> AwsSession:
    """The session for the settings' region (``us-east-1`` when none is set)."""
    return AwsSession(settings.region or "us-east-1")


@overload
def open_client(
    session: AwsSession,
    service: Literal["dynamodb"],
    endpoint_url: str | None = None,
    config: AioConfig | None = None,
) -> AbstractAsyncContextManager[DynamoDBClient]: ...
@overload
def open_client(
    session: AwsSession,
    service: Literal["s3"],
    endpoint_url: str | None = None,
    config: AioConfig | None = None,
) -> AbstractAsyncContextManager[S3Client]: ...
@overload
def open_client(
    session: AwsSession,
    service: Literal["sqs"],
    endpoint_url: str | None = None,
    config: AioConfig | None = None,
) -> AbstractAsyncContextManager[SQSClient]: ...
@overload
def open_client(
    session: AwsSession,
    service: Literal["scheduler"],
    endpoint_url: str | None = None,
    config: AioConfig | None = None,
) -> AbstractAsyncContextManager[EventBridgeSchedulerClient]: ...
@overload
def open_client(
    session: AwsSession,
    service: Literal["ssm"],
    endpoint_url: str | None = None,
    config: AioConfig | None = None,
) -> AbstractAsyncContextManager[SSMClient]: ...
@overload
def open_client(
    session: AwsSession,
    service: Literal["secretsmanager"],
    endpoint_url: str | None = None,
    config: AioConfig | None = None,
) -> AbstractAsyncContextManager[SecretsManagerClient]: ...
@overload
def open_client(
    session: AwsSession,
    service: Literal["sts"],
    endpoint_url: str | None = None,
    config: AioConfig | None = None,
) -> AbstractAsyncContextManager[STSClient]: ...
@overload
def open_client(
    session: AwsSession, service: str, endpoint_url: str | None = None, config: AioConfig | None = None
) -> AbstractAsyncContextManager[Any]: ...
def open_client(
    session: AwsSession, service: str, endpoint_url: str | None = None, config: AioConfig | None = None
) -> AbstractAsyncContextManager[Any]:
    """A client for ``service`` at ``endpoint_url`` (botocore's own endpoint when ``None``), closed when
    the context exits; typed by the stubs for the services the runtime uses, ``Any`` for the others."""
    return _open_client(session, service, endpoint_url, config)


@asynccontextmanager
async def _open_client(
    session: AwsSession, service: str, endpoint_url: str | None, config: AioConfig | None
) -> AsyncIterator[Any]:
    async with session.client(service, endpoint_url, config) as opened:
        yield opened


@overload
def client(
    session: AwsSession, service: Literal["dynamodb"], settings: Settings
) -> AbstractAsyncContextManager[DynamoDBClient]: ...
@overload
def client(
    session: AwsSession, service: Literal["s3"], settings: Settings
) -> AbstractAsyncContextManager[S3Client]: ...
@overload
def client(
    session: AwsSession, service: Literal["sqs"], settings: Settings
) -> AbstractAsyncContextManager[SQSClient]: ...
@overload
def client(
    session: AwsSession, service: Literal["scheduler"], settings: Settings
) -> AbstractAsyncContextManager[EventBridgeSchedulerClient]: ...
@overload
def client(
    session: AwsSession, service: Literal["ssm"], settings: Settings
) -> AbstractAsyncContextManager[SSMClient]: ...
@overload
def client(
    session: AwsSession, service: Literal["secretsmanager"], settings: Settings
) -> AbstractAsyncContextManager[SecretsManagerClient]: ...
@overload
def client(
    session: AwsSession, service: Literal["sts"], settings: Settings
) -> AbstractAsyncContextManager[STSClient]: ...
@overload
def client(session: AwsSession, service: str, settings: Settings) -> AbstractAsyncContextManager[Any]: ...
def client(session: AwsSession, service: str, settings: Settings) -> AbstractAsyncContextManager[Any]:
    """A client for ``service``; ``AWS_ENDPOINT_URL`` (moto, LocalStack) applies to all of them."""
    return _open_client(session, service, settings.endpoint_url or None, None)


class LazyClient(Generic[C]):
    """A client whose API calls (``await lazy.put_object(...)``) open the real one first, exactly once.

    ``opener`` opens it and returns it (typically entering :func:`client` in the owner's exit stack, which
    then closes it). Only API methods are forwarded; a lazy client has no ``meta`` or ``exceptions`` (use
    :meth:`opened_client`). :meth:`as_client` hands it to code typed for the real client."""

    def __init__(self, opener: Callable[[], Awaitable[C]]) -> None:
        self._opener = opener
        self._client: C | None = None
        self._lock = asyncio.Lock()

    @property
    def opened(self) -> bool:
        """Whether the real client has been opened."""
        return self._client is not None

    def as_client(self) -> C:
        """This lazy client, typed as the client it opens: callers use only its API methods, which it
        forwards (see the class docstring)."""
        return self  # type: ignore[return-value]  # duck-typed: the API methods are forwarded

    async def opened_client(self) -> C:
        """The real client (opening it now if no call has yet): for its ``meta`` or ``exceptions``."""
        return await self._opened()

    async def _opened(self) -> C:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    self._client = await self._opener()
        return self._client

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        # get_paginator is synchronous on a real client: forwarding it as a coroutine would change its
        # contract, so a lazy client refuses it (open the client first).
        if name.startswith("_") or name in {"meta", "exceptions", "get_paginator", "can_paginate"}:
            raise AttributeError(name)

        async def call(**kwargs: Any) -> Any:
            return await getattr(await self._opened(), name)(**kwargs)

        return call
