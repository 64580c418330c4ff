"""aioboto3 session and client factories that honour the settings' endpoint (moto, LocalStack).

One session per process; clients are async context managers bound to the running event loop, so a
long-lived process (a Lambda container, the local stack) opens them once and keeps them.
:class:`LazyClient` stands in for a client that most invocations never call (S3 holds only payloads too
large for a queue message or a DynamoDB item): it is opened on its first call, once, so a cold start does
not pay for loading its service model. All clients share one TLS context (:class:`SharedTlsSession`)
instead of parsing the same CA bundle once per client.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aioboto3
import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from botocore.httpsession import create_urllib3_context, get_cert_path

from stepagent.aws.settings import Settings


@functools.cache
def _tls_context(ca_bundle: str) -> ssl.SSLContext:
    """botocore's client TLS context verifying with ``ca_bundle``: what aiobotocore builds per client."""
    context: ssl.SSLContext = create_urllib3_context()
    context.load_verify_locations(ca_bundle)
    return context


class SharedTlsSession(AIOHTTPSession):  # type: ignore[misc]  # aiobotocore is untyped
    """aiobotocore's aiohttp session with one TLS context per CA bundle and process: its own builds one
    per client, each parsing the bundle again (tens of ms of CPU per client at cold start). Only the
    plain case is shared (verification on, with botocore's bundle or ``AWS_CA_BUNDLE``, no proxy, no client
    certificate); any other takes aiobotocore's own path unchanged."""

    def _create_connector(self, proxy_url: str | None) -> aiohttp.TCPConnector:
        ca_bundle = get_cert_path(self._verify) if self._verify else None
        if proxy_url or self._cert_file or not ca_bundle:
            own: aiohttp.TCPConnector = super()._create_connector(proxy_url)
            return own
        return aiohttp.TCPConnector(
            limit=self._max_pool_connections, ssl=_tls_context(ca_bundle), **self._connector_args
        )


# Standard retry mode with a few attempts: transient AWS errors are retried by botocore first, then by
# the queue redelivering the record.
_CONFIG = AioConfig(
    retries={"max_attempts": 4, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    http_session_cls=SharedTlsSession,
)


def aws_session(settings: Settings) -> aioboto3.Session:
    """The aioboto3 session for the settings' region (``us-east-1`` when none is set)."""
    return aioboto3.Session(region_name=settings.region or "us-east-1")


def client(session: aioboto3.Session, service: str, settings: Settings) -> AbstractAsyncContextManager[Any]:
    """An aioboto3 client for ``service``; ``AWS_ENDPOINT_URL`` (moto, LocalStack) applies to all of them."""
    kwargs: dict[str, Any] = {"config": _CONFIG}
    if settings.endpoint_url:
        kwargs["endpoint_url"] = settings.endpoint_url
    return session.client(service, **kwargs)  # type: ignore[no-any-return]


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
