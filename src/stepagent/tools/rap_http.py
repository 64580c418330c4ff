"""HTTP to RAP tool servers: configured servers, optional SigV4 signing, and bounded retries.

``STEPAGENT_RAP_SERVERS`` is a comma-separated list of base URLs. Convention: a base URL whose query has
``sigv4=1`` (e.g. ``https://abc.lambda-url.eu-west-1.on.aws/?sigv4=1``) is a Lambda Function URL with
``AWS_IAM`` auth; every request to that server (discovery, invocation, lifecycle) is signed with SigV4,
service ``lambda``, in the region named by the Function URL host (else ``AWS_REGION``), with the
process's default AWS credentials. The flag is removed from the base URL. Signing is off by default.

Guarantees of :class:`RapHttp`:

- A request body is serialised once; every retry sends the same bytes (re-signed, since SigV4 signatures
  carry a timestamp), so a server sees the same invocation ``id`` each time and can deduplicate.
- :meth:`RapHttp.request` retries connection errors, timeouts and 5xx answers (``RAP_BACKOFF.attempts``
  in all, exponential backoff through an injectable ``sleep``) and never retries a 4xx. It returns the
  last status, or raises :class:`RapTransportError` when no attempt got an answer.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from stepagent.backoff import Backoff
from stepagent.tracing import trace_attributes

_LAMBDA_URL_HOST = re.compile(r"^[a-z0-9]+\.lambda-url\.([a-z0-9-]+)\.on\.aws$")
_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class RapServerConfig:
    """One configured tool server: its base URL (no trailing slash) and whether to sign with SigV4."""

    base_url: str
    sigv4: bool = False
    region: str | None = None

    @classmethod
    def parse(cls, entry: str, *, default_region: str | None = None) -> RapServerConfig:
        parts = urlsplit(entry.strip())
        query = parse_qsl(parts.query, keep_blank_values=True)
        sigv4 = any(k == "sigv4" and v.lower() in _TRUE for k, v in query)
        kept = urlencode([(k, v) for k, v in query if k != "sigv4"])
        path = parts.path.rstrip("/")
        base = urlunsplit(parts._replace(path=path, query=kept))
        match = _LAMBDA_URL_HOST.match(parts.hostname or "")
        return cls(base, sigv4, match.group(1) if match else default_region)

    def url(self, path: str) -> str:
        """``path`` (e.g. ``/close_thread``) under the base URL, keeping the base's query."""
        parts = urlsplit(self.base_url)
        return urlunsplit(parts._replace(path=parts.path + path))


class RapTransportError(Exception):
    """No attempt reached the server (connection refused, DNS, timeouts)."""


#: RAP requests: three attempts, waiting about 0.2 s then 0.8 s (jittered).
RAP_BACKOFF = Backoff(attempts=3, base=0.2, factor=4.0, cap=5.0)


Sleep = Callable[[float], Awaitable[None]]


class SigV4Signer:
    """Signs requests with botocore's SigV4 (service ``lambda``). Credentials are read per request, so
    rotated temporary credentials are picked up."""

    def __init__(self, credentials: Any = None) -> None:
        self._credentials = credentials

    def _frozen(self) -> Any:
        if self._credentials is None:
            import botocore.session

            self._credentials = botocore.session.get_session().get_credentials()
        if self._credentials is None:
            raise RapTransportError("SigV4 signing is on but no AWS credentials are available")
        return self._credentials.get_frozen_credentials()

    def headers(
        self, method: str, url: str, body: bytes, headers: dict[str, str], region: str
    ) -> dict[str, str]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=url, data=body, headers=headers)
        SigV4Auth(self._frozen(), "lambda", region).add_auth(request)
        return dict(request.headers.items())


class RapHttp:
    """Sends JSON to RAP servers through one ``httpx.AsyncClient``."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        retry: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
        signer: SigV4Signer | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.client = client
        self.retry = retry if retry is not None else RAP_BACKOFF
        self.sleep = sleep
        self.signer = signer if signer is not None else SigV4Signer()
        self.timeout = timeout

    def _headers(self, server: RapServerConfig, method: str, url: str, body: bytes) -> dict[str, str]:
        headers = {"accept": "application/json"}
        if method == "POST":
            headers["content-type"] = "application/json"
        # The RAP server joins the calling step's trace (and may send it back with its callback).
        headers.update(trace_attributes())
        if server.sigv4:
            headers = self.signer.headers(method, url, body, headers, server.region or "us-east-1")
        return headers

    async def _once(self, server: RapServerConfig, method: str, url: str, body: bytes) -> httpx.Response:
        headers = self._headers(server, method, url, body)
        content = body if method == "POST" else None
        return await self.client.request(method, url, content=content, headers=headers, timeout=self.timeout)

    async def request(
        self, server: RapServerConfig, method: str, url: str, payload: Any = None, *, retry: bool = True
    ) -> httpx.Response:
        """Send (with retries unless ``retry`` is false) and return the last response."""
        body = b"" if payload is None else json.dumps(payload, ensure_ascii=False).encode()
        attempts = self.retry.attempts if retry else 1
        last_error: Exception | None = None
        response: httpx.Response | None = None
        for attempt in range(1, attempts + 1):
            try:
                response = await self._once(server, method, url, body)
                last_error = None
            except httpx.HTTPError as exc:  # transport failures: connect, read, timeouts, protocol
                response, last_error = None, exc
            if response is not None and response.status_code < 500:
                return response
            if attempt < attempts:
                await self.sleep(self.retry.delay(attempt))
        if response is not None:
            return response
        raise RapTransportError(f"{type(last_error).__name__}: {last_error}") from last_error

    async def post(self, server: RapServerConfig, url: str, payload: Any, *, retry: bool = True) -> int:
        return (await self.request(server, "POST", url, payload, retry=retry)).status_code

    async def get_json(self, server: RapServerConfig, url: str) -> tuple[int, bytes]:
        response = await self.request(server, "GET", url)
        return response.status_code, response.content
