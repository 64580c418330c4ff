"""AWS clients for the async runtime: botocore's low-level clients, called from a small thread pool.

Guarantees:

- :func:`client` yields an object whose API methods are coroutines with botocore's names and arguments
  (``await dynamodb.query(TableName=..., ...)``), raising botocore's exceptions (``ClientError``,
  ``BotoCoreError``), so the stores are written against one async interface. It honours the settings'
  endpoint (``AWS_ENDPOINT_URL``: moto, LocalStack) and region, with standard retries (4 attempts) and
  5 s / 30 s connect / read timeouts; leaving the context closes the client's connections.
- Each call runs the real botocore client in a thread of one process-wide pool (:data:`POOL_SIZE` threads,
  the same number of pooled connections per client), so calls from concurrent coroutines overlap; botocore
  clients are thread-safe. A cancelled caller stops waiting at once; its request still completes (or fails)
  in its thread, exactly as a request already on the wire would — every write the stores make is
  conditioned or idempotent for that reason.
- A streamed response body (S3 ``GetObject``) is wrapped so that ``async with response["Body"] as s:
  await s.read()`` reads it in the pool and closes it on exit.
- All clients share one TLS context per CA bundle, loaded once, at the first HTTPS request
  (:func:`_share_tls`): botocore's own re-parses the bundle for every new connection, about 40 ms of CPU
  each at cold start.
- Nothing here opens a connection or loads a service model until a client is created; :class:`LazyClient`
  defers even that to the first call, for clients most invocations never use (S3).

Why not aioboto3 here: importing aiobotocore pulls in aiohttp and its dependencies, about a third of the
worker's cold import, for no gain in a process that makes a handful of concurrent requests. The Bedrock
provider keeps aioboto3 (its streaming API); it is imported only when a ``bedrock:`` model is configured.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.httpsession import URLLib3Session, create_urllib3_context, get_cert_path
from botocore.response import StreamingBody

from stepagent.aws.settings import Settings

# Threads in the pool, and connections each client keeps: a worker batch runs at most ten threads' steps
# at once, each with at most a couple of requests in flight.
POOL_SIZE = 16

# Standard retry mode with a few attempts: transient AWS errors are retried by botocore first, then by
# the queue redelivering the record.
_CONFIG = Config(
    retries={"max_attempts": 4, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=POOL_SIZE,
)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """The process's pool, created on the first call (threads start only as calls need them)."""
    global _pool
    if _pool is not None:
        return _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="stepagent-aws")
        return _pool


async def _in_pool(function: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_executor(), function)


class _SharedTls:
    """One verifying TLS context (urllib3's defaults, as botocore builds it) trusting exactly a CA bundle,
    which it parses on the first HTTPS request, once: a plain-HTTP endpoint (moto, LocalStack) never pays."""

    def __init__(self, ca_bundle: str) -> None:
        self.ca_bundle = ca_bundle
        self.context: ssl.SSLContext = create_urllib3_context()
        self._loaded = False
        self._lock = threading.Lock()

    def ensure_loaded(self) -> None:
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self.context.load_verify_locations(self.ca_bundle)
                    self._loaded = True


@functools.cache
def _shared_tls(ca_bundle: str) -> _SharedTls:
    return _SharedTls(ca_bundle)


def _share_tls(sync_client: Any) -> None:
    """Make ``sync_client``'s direct connections use the process's context for its CA bundle instead of
    loading the bundle into its own context on every new connection. Only the plain case is changed
    (verification on with botocore's bundle or ``AWS_CA_BUNDLE``, no client certificate); a connection
    through a proxy keeps botocore's own path."""
    http = getattr(getattr(sync_client, "_endpoint", None), "http_session", None)
    if not isinstance(http, URLLib3Session) or not http._verify or http._cert_file is not None:
        return
    shared = _shared_tls(get_cert_path(http._verify))
    http._manager.connection_pool_kw["ssl_context"] = shared.context
    setup = http._setup_ssl_cert

    def setup_shared(conn: Any, url: str, verify: Any) -> None:
        # botocore calls this before every request, in the calling thread, before any connection opens.
        setup(conn, url, verify)
        if conn.ca_certs == shared.ca_bundle and http._proxy_config.proxy_url_for(url) is None:
            shared.ensure_loaded()
            conn.ca_certs = None  # the shared context already trusts exactly this bundle

    http._setup_ssl_cert = setup_shared


class AwsSession:
    """One botocore session (credentials, loaded service models) for a region; clients share it."""

    def __init__(self, region: str, credentials: tuple[str, str] | None = None) -> None:
        """``credentials`` (access key id, secret) replace botocore's lookup chain (benchmarks on moto)."""
        self.region = region
        self._session = botocore.session.get_session()
        if credentials is not None:
            self._session.set_credentials(*credentials)
        # Creating clients loads and caches service models in the session, which is not thread-safe.
        self._lock = threading.Lock()

    def create_client(
        self, service: str, endpoint_url: str | None = None, config: Config | None = None
    ) -> AsyncClient:
        """An async client for ``service`` (see the module docstring); close it with :meth:`AsyncClient.close`.
        ``config`` overrides the defaults it sets (tests use it for fewer retries)."""
        merged = _CONFIG if config is None else _CONFIG.merge(config)
        with self._lock:
            sync_client = self._session.create_client(
                service, region_name=self.region, endpoint_url=endpoint_url, config=merged
            )
        _share_tls(sync_client)
        return AsyncClient(sync_client)


class AsyncBody:
    """A streamed response body read in the pool: ``async with body as s: data = await s.read()``."""

    def __init__(self, body: StreamingBody) -> None:
        self._body = body

    async def read(self, amount: int | None = None) -> bytes:
        data: bytes = await _in_pool(functools.partial(self._body.read, amount))
        return data

    async def __aenter__(self) -> AsyncBody:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._body.close()


class AsyncClient:
    """botocore's client with every API method a coroutine run in the pool; ``meta`` and ``exceptions``
    are the real client's."""

    def __init__(self, sync_client: Any) -> None:
        self._client = sync_client
        self.meta = sync_client.meta
        self.exceptions = sync_client.exceptions

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._client, name)

        async def call(**kwargs: Any) -> Any:
            response = await _in_pool(functools.partial(method, **kwargs))
            if isinstance(response, dict) and isinstance(response.get("Body"), StreamingBody):
                response["Body"] = AsyncBody(response["Body"])
            return response

        call.__name__ = name
        # Cached on the instance: the next lookup of ``name`` skips ``__getattr__``.
        setattr(self, name, call)
        return call

    def close(self) -> None:
        """Close the client's pooled connections."""
        self._client.close()


def aws_session(settings: Settings) -> AwsSession:
    """The session for the settings' region (``us-east-1`` when none is set)."""
    return AwsSession(settings.region or "us-east-1")


@asynccontextmanager
async def open_client(
    session: AwsSession, service: str, endpoint_url: str | None = None, config: Config | None = None
) -> AsyncIterator[AsyncClient]:
    """An :class:`AsyncClient` for ``service``, closed when the context exits."""
    opened = session.create_client(service, endpoint_url, config)
    try:
        yield opened
    finally:
        opened.close()


def client(session: AwsSession, service: str, settings: Settings) -> AbstractAsyncContextManager[AsyncClient]:
    """A client for ``service``; ``AWS_ENDPOINT_URL`` (moto, LocalStack) applies to all of them."""
    return open_client(session, service, settings.endpoint_url or None)


class LazyClient:
    """A client whose API calls (``await lazy.put_object(...)``) open the real one first, exactly once.

    ``opener`` opens it and returns it (typically entering :func:`client` in the owner's exit stack, which
    then closes it). Only API methods are forwarded; a lazy client has no ``meta`` or ``exceptions``."""

    def __init__(self, opener: Callable[[], Awaitable[Any]]) -> None:
        self._opener = opener
        self._client: Any = None
        self._lock = asyncio.Lock()

    @property
    def opened(self) -> bool:
        """Whether the real client has been opened."""
        return self._client is not None

    async def opened_client(self) -> Any:
        """The real client (opening it now if no call has yet): for its ``meta`` or ``exceptions``."""
        return await self._opened()

    async def _opened(self) -> Any:
        async with self._lock:
            if self._client is None:
                self._client = await self._opener()
        return self._client

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name.startswith("_") or name in {"meta", "exceptions"}:
            raise AttributeError(name)

        async def call(**kwargs: Any) -> Any:
            return await getattr(await self._opened(), name)(**kwargs)

        return call
