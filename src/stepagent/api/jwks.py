"""The identity provider's signing keys (a JWKS URL), cached so that the provider's trouble never becomes
the API's: neither an amplifier against it nor an outage of every request.

Guarantees:

- **One fetch at a time** (single flight): concurrent requests that need the key set share one fetch.
- **Cached keys are served without waiting.** A key younger than :data:`LIFESPAN_S` is used as is; an
  older one is still used, for up to :data:`GRACE_S` more, while a refresh runs in the background — so a
  hung or failing provider never stalls a request whose key is cached (as awslabs ``aws-jwt-verify``
  keeps serving its cached keys). Past the grace period a request waits for a fresh set.
- **A token naming an unknown key** (``kid``) makes the set be fetched again (a rotated key works at
  once), at most once per ``refetch_s`` seconds after a fetch that answered; a token still unknown is
  refused (:class:`KeyNotFound`, a 401).
- **A failed fetch starts a backoff** (:data:`FAILURE_BACKOFF`: 10 s, doubling to 5 minutes): until it
  has passed no request fetches again, so a flood of unknown-``kid`` tokens costs the provider at most
  one request. Meanwhile a request that needs the provider fails fast with :class:`ProviderUnavailable`
  (a 503 with ``Retry-After``, never a 401: the token may well be valid).
- **Bounded fetches**: ``timeout_s`` for the whole fetch, :data:`MAX_JWKS_BYTES` of body. The reason a
  fetch failed is logged for the operator, never told to the caller.
- **Only usable keys are kept**: RS256 and ES256 signature keys; an RSA key under
  :data:`MIN_RSA_BITS` bits is dropped (RFC 7518 §3.3 asks for 2048 at least). A set with no usable key
  counts as a failed fetch (the last good keys stay).

Why not :class:`jwt.PyJWKClient` whole: it fetches with blocking ``urllib`` under a lock (one hung fetch
holds every request needing a key), starts no cooldown after a failure and drops its cache when the
lifespan ends. Its parts are used: :class:`jwt.PyJWKSet` parses the set and :class:`jwt.PyJWK` binds each
key to its algorithm, which PyJWT then enforces against the token's ``alg``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt

from stepagent.backoff import Backoff

log = logging.getLogger(__name__)

#: Seconds a fetched key set is fresh.
LIFESPAN_S = 300.0
#: Seconds past the lifespan during which the last good keys are still served while the provider fails.
GRACE_S = 3600.0
#: Seconds a whole fetch may take.
FETCH_TIMEOUT_S = 3.0
MAX_JWKS_BYTES = 1024 * 1024
MIN_RSA_BITS = 2048
ALGORITHMS = ("RS256", "ES256")
#: The pause after the n-th failed fetch in a row.
FAILURE_BACKOFF = Backoff(base=10.0, factor=2.0, cap=300.0, jitter=0.0)


class ProviderUnavailable(Exception):
    """The identity provider's keys cannot be had now; ``retry_after`` seconds until the next try."""

    def __init__(self, retry_after: float) -> None:
        super().__init__("the identity provider cannot be reached")
        self.retry_after = max(1, math.ceil(retry_after))


class KeyNotFound(Exception):
    """The provider's current key set has no key with the token's ``kid``."""


class FetchFailed(Exception):
    """One fetch of the key set did not give a usable set (the reason is for the log)."""


def usable_keys(document: Any) -> dict[str, jwt.PyJWK]:
    """The signature keys of a JWKS document that this API accepts, by ``kid``."""
    if not isinstance(document, dict):
        raise FetchFailed("the JWKS is not a JSON object")
    try:
        parsed = jwt.PyJWKSet.from_dict(document)
    except jwt.PyJWTError as error:
        raise FetchFailed(f"the JWKS has no usable key: {error}") from None
    keys: dict[str, jwt.PyJWK] = {}
    for key in parsed.keys:
        if key.key_id is None or key.algorithm_name not in ALGORITHMS or key.public_key_use == "enc":
            continue
        size = getattr(key.key, "key_size", None)
        if key.algorithm_name == "RS256" and (size is None or size < MIN_RSA_BITS):
            log.warning(
                "JWKS key %r ignored: an RSA key of %s bits (at least %d)", key.key_id, size, MIN_RSA_BITS
            )
            continue
        keys[key.key_id] = key
    if not keys:
        raise FetchFailed(f"the JWKS has no {'/'.join(ALGORITHMS)} signature key of an accepted size")
    return keys


@dataclass(slots=True)
class KeyCache:
    """The signing keys of ``url`` (see the module docstring). ``clock`` is monotonic seconds."""

    url: str
    refetch_s: float = 10.0
    timeout_s: float = FETCH_TIMEOUT_S
    lifespan_s: float = LIFESPAN_S
    grace_s: float = GRACE_S
    clock: Callable[[], float] = time.monotonic
    keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    fetched_at: float | None = None  # when the keys were fetched (None: never)
    fetches: int = 0  # fetch attempts, for metrics and tests
    _attempted_at: float | None = None
    _failures: int = 0
    _flight: asyncio.Task[None] | None = None

    async def key(self, kid: str) -> jwt.PyJWK:
        """The key named ``kid``; :class:`KeyNotFound` or :class:`ProviderUnavailable` otherwise."""
        now = self.clock()
        known = self.keys.get(kid)
        age = math.inf if self.fetched_at is None else now - self.fetched_at
        if known is not None and age <= self.lifespan_s:
            return known
        if known is not None and age <= self.lifespan_s + self.grace_s:
            if self._next_fetch_at(now) <= now:
                self._start_fetch()  # in the background: this request goes on with the cached key
            return known
        # Unknown kid, or keys too old to trust: this request needs a fresh set.
        if self._flight is None and self._next_fetch_at(now) > now:
            if self._failures or not self.keys or age > self.lifespan_s + self.grace_s:
                raise ProviderUnavailable(self._next_fetch_at(now) - now)
            raise KeyNotFound(kid)
        await asyncio.shield(self._start_fetch())
        if self._failures:
            # The provider failed: only keys still within their grace may be used.
            stale = self.keys.get(kid)
            fetched = self.fetched_at
            if (
                stale is not None
                and fetched is not None
                and self.clock() - fetched <= self.lifespan_s + self.grace_s
            ):
                return stale
            raise ProviderUnavailable(self._next_fetch_at(self.clock()) - self.clock())
        found = self.keys.get(kid)
        if found is None:
            raise KeyNotFound(kid)
        return found

    def _next_fetch_at(self, now: float) -> float:
        if self._attempted_at is None:
            return now
        if self._failures:
            return self._attempted_at + max(self.refetch_s, FAILURE_BACKOFF.delay(self._failures))
        return self._attempted_at + self.refetch_s

    def _start_fetch(self) -> asyncio.Task[None]:
        if self._flight is None:
            self._attempted_at = self.clock()
            self._flight = asyncio.create_task(self._fetch())
        return self._flight

    async def _fetch(self) -> None:
        self.fetches += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                keys = usable_keys(await self._download())
        except (FetchFailed, httpx.HTTPError, TimeoutError, ValueError) as error:
            self._failures += 1
            log.warning(
                "the JWKS %s could not be fetched (failure %d in a row): %s", self.url, self._failures, error
            )
        else:
            self.keys, self.fetched_at, self._failures = keys, self.clock(), 0
        finally:
            self._attempted_at = self.clock()
            self._flight = None

    async def _download(self) -> Any:
        async with (
            httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as http,
            http.stream("GET", self.url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise FetchFailed(f"HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise FetchFailed(f"the JWKS is over {MAX_JWKS_BYTES} bytes")
        return json.loads(body)

    async def aclose(self) -> None:
        """Stop a fetch in flight (at shutdown)."""
        flight, self._flight = self._flight, None
        if flight is not None:
            flight.cancel()
            await asyncio.gather(flight, return_exceptions=True)
