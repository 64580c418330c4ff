"""A billing model of Anthropic's Messages API prompt cache, to price what a runtime sends.

:class:`PromptCacheBilling` bills request bodies (the JSON a client posts to ``/v1/messages``) the way the
documented prompt-caching rules do, on a simulated clock:

- **Blocks and order.** A request is a sequence of blocks: each tool definition, each system block, then
  each content block of each message, in that order. A block's tokens are its UTF-8 bytes (compact JSON,
  without ``cache_control``) divided by ``bytes_per_token``.
- **Breakpoints.** A block with ``cache_control`` is a breakpoint; its prefix (every block up to and
  including it) is what a cache entry holds. ``{"type": "ephemeral"}`` lives five minutes,
  ``"ttl": "1h"`` an hour; a read refreshes an entry for its own TTL.
- **Lookup.** For each breakpoint the cache is checked at the breakpoint and at the block boundaries up to
  :data:`LOOKBACK` blocks before it; the longest live entry found is read. Prefixes shorter than
  :data:`MIN_CACHEABLE` tokens are never cached.
- **Bill.** ``cache_read`` = the tokens of the longest hit; ``cache_write`` = the tokens from there to the
  last cacheable breakpoint (written at the TTL of the breakpoint that ends each stretch); ``input`` = the
  rest. Prices, relative to uncached input: read 0.1, five-minute write 1.25, one-hour write 2.0.

:func:`physical_limit` is the floor for the same requests: every token written once at the five-minute
price the first time any request contains it (as a prefix), read at 0.1 in every later request, no TTL and
no block granularity. A runtime at the limit pays for each token once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

LOOKBACK = 20
MIN_CACHEABLE = 1024
PRICE_INPUT = 1.0
PRICE_READ = 0.1
PRICE_WRITE = {"5m": 1.25, "1h": 2.0}
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


def _canonical(block: dict[str, Any]) -> bytes:
    body = {k: v for k, v in block.items() if k != "cache_control"}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def _ttl(block: dict[str, Any]) -> str | None:
    control = block.get("cache_control")
    if not isinstance(control, dict):
        return None
    return "1h" if control.get("ttl") == "1h" else "5m"


def blocks(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The request's blocks in cache order: tools, system, then every message's content blocks."""
    yield from body.get("tools", [])
    system = body.get("system", [])
    if isinstance(system, str):
        yield {"type": "text", "text": system}
    else:
        yield from system
    for message in body.get("messages", []):
        content = message["content"]
        if isinstance(content, str):
            yield {"type": "text", "text": content, "role": message["role"]}
        else:
            for block in content:
                yield {**block, "role": message["role"]}  # the role is part of the prefix


@dataclass(frozen=True, slots=True)
class Prefix:
    """One request as the cache sees it: cumulative tokens and prefix hashes per block, breakpoints."""

    tokens: list[int]  # tokens[i] = tokens of blocks 0..i
    hashes: list[str]  # hashes[i] = identity of blocks 0..i
    breakpoints: list[tuple[int, str]]  # (block index, ttl)

    @property
    def total(self) -> int:
        return self.tokens[-1] if self.tokens else 0


def prefix_of(body: dict[str, Any], bytes_per_token: float) -> Prefix:
    tokens: list[int] = []
    hashes: list[str] = []
    breakpoints: list[tuple[int, str]] = []
    running = hashlib.sha256(str(body.get("model", "")).encode())
    total_bytes = 0
    for index, block in enumerate(blocks(body)):
        data = _canonical(block)
        running.update(len(data).to_bytes(8, "big") + data)
        total_bytes += len(data)
        tokens.append(int(total_bytes / bytes_per_token))
        hashes.append(running.hexdigest())
        ttl = _ttl(block)
        if ttl is not None:
            breakpoints.append((index, ttl))
    return Prefix(tokens, hashes, breakpoints)


@dataclass(frozen=True, slots=True)
class Bill:
    """What one request is billed (tokens) and its price in uncached-input-token equivalents."""

    input: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int
    at: float

    @property
    def cache_write(self) -> int:
        return self.cache_write_5m + self.cache_write_1h

    @property
    def total(self) -> int:
        return self.input + self.cache_read + self.cache_write

    @property
    def cost(self) -> float:
        return (
            self.input * PRICE_INPUT
            + self.cache_read * PRICE_READ
            + self.cache_write_5m * PRICE_WRITE["5m"]
            + self.cache_write_1h * PRICE_WRITE["1h"]
        )

    @property
    def read_share(self) -> float:
        return self.cache_read / self.total if self.total else 0.0


@dataclass(slots=True)
class PromptCacheBilling:
    """The cache of one organisation and model, on a simulated clock (``now``, seconds)."""

    bytes_per_token: float = 4.0
    now: float = 0.0
    #: prefix hash -> (expires at, ttl)
    entries: dict[str, tuple[float, str]] = field(default_factory=dict)
    bills: list[Bill] = field(default_factory=list)
    prefixes: list[Prefix] = field(default_factory=list)

    def _live(self, digest: str) -> bool:
        entry = self.entries.get(digest)
        return entry is not None and entry[0] > self.now

    def bill(self, body: dict[str, Any]) -> Bill:
        prefix = prefix_of(body, self.bytes_per_token)
        self.prefixes.append(prefix)
        cacheable = [(i, ttl) for i, ttl in prefix.breakpoints if prefix.tokens[i] >= MIN_CACHEABLE]
        hit = -1  # the block index of the longest live entry found
        for index, _ in cacheable:
            for back in range(index, max(-1, index - LOOKBACK - 1), -1):
                if back > hit and prefix.tokens[back] >= MIN_CACHEABLE and self._live(prefix.hashes[back]):
                    hit = back
                    break
        read = prefix.tokens[hit] if hit >= 0 else 0
        if hit >= 0:
            _, ttl = self.entries[prefix.hashes[hit]]
            self.entries[prefix.hashes[hit]] = (self.now + TTL_SECONDS[ttl], ttl)  # a read refreshes
        written = {"5m": 0, "1h": 0}
        covered = hit
        for index, ttl in cacheable:
            if index <= hit:
                continue
            start = prefix.tokens[covered] if covered >= 0 else 0
            written[ttl] += prefix.tokens[index] - start
            covered = index
            self.entries[prefix.hashes[index]] = (self.now + TTL_SECONDS[ttl], ttl)
        end = prefix.tokens[covered] if covered >= 0 else 0
        bill = Bill(prefix.total - end, read, written["5m"], written["1h"], self.now)
        self.bills.append(bill)
        return bill


def physical_limit(prefixes: Sequence[Prefix]) -> float:
    """The floor for these requests: each request reads its longest prefix shared with any earlier
    request (at 0.1) and writes the rest once (at 1.25); see the module docstring."""
    seen: set[str] = set()
    cost = 0.0
    for prefix in prefixes:
        shared = 0
        for index in range(len(prefix.hashes) - 1, -1, -1):
            if prefix.hashes[index] in seen:
                shared = prefix.tokens[index]
                break
        cost += shared * PRICE_READ + (prefix.total - shared) * PRICE_WRITE["5m"]
        seen.update(prefix.hashes)
    return cost
