"""The project's billing model of Anthropic's prompt cache (``bench/prompt_billing.py``): each rule it
applies, so the bench's figures rest on rules that are themselves checked."""

from __future__ import annotations

from typing import Any

from bench.prompt_billing import LOOKBACK, PromptCacheBilling, physical_limit

HOUR = {"type": "ephemeral", "ttl": "1h"}
FIVE = {"type": "ephemeral"}


def text(n: int, size: int = 400) -> dict[str, Any]:
    return {"type": "text", "text": f"{n:06d}" + "x" * (size - 6)}


def body(blocks: int, *, marked: dict[str, Any] | None = FIVE, size: int = 400) -> dict[str, Any]:
    """One user message of ``blocks`` text blocks, the last one a breakpoint."""
    content = [text(n, size) for n in range(blocks)]
    if marked is not None:
        content[-1] = {**content[-1], "cache_control": marked}
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


def test_a_repeated_prefix_is_written_once_then_read() -> None:
    billing = PromptCacheBilling()
    first = billing.bill(body(20))
    assert (first.cache_read, first.input) == (0, 0) and first.cache_write_5m == first.total
    second = billing.bill(body(21))  # one more block after the cached prefix
    assert second.cache_read == first.total and second.cache_write_5m == second.total - first.total


def test_prefixes_under_the_minimum_are_never_cached() -> None:
    billing = PromptCacheBilling()
    small = body(2)  # ~200 tokens
    billing.bill(small)
    again = billing.bill(small)
    assert again.cache_read == again.cache_write == 0 and again.input == again.total


def test_the_lookup_goes_back_twenty_blocks_and_no_further() -> None:
    billing = PromptCacheBilling()
    billing.bill(body(30))
    near = billing.bill(body(30 + LOOKBACK))  # the entry sits exactly LOOKBACK blocks back
    assert near.cache_read > 0
    billing = PromptCacheBilling()
    billing.bill(body(30))
    far = billing.bill(body(30 + LOOKBACK + 1))
    assert far.cache_read == 0


def test_entries_expire_after_their_ttl_and_reads_refresh_them() -> None:
    billing = PromptCacheBilling()
    billing.bill(body(20))
    billing.now += 299
    assert billing.bill(body(20)).cache_read > 0  # read: refreshed for five more minutes
    billing.now += 299
    assert billing.bill(body(20)).cache_read > 0
    billing.now += 301
    assert billing.bill(body(20)).cache_read == 0  # expired: written again
    hour = PromptCacheBilling()
    written = hour.bill(body(20, marked=HOUR))
    assert written.cache_write_1h == written.total and written.cost == 2.0 * written.total
    hour.now += 3_000
    assert hour.bill(body(20, marked=HOUR)).cache_read == written.total


def test_the_physical_limit_pays_each_token_once() -> None:
    billing = PromptCacheBilling()
    for blocks in (20, 21, 22):
        billing.bill(body(blocks))
    tokens = [p.total for p in billing.prefixes]
    expected = tokens[0] * 1.25 + (tokens[0] * 0.1 + (tokens[1] - tokens[0]) * 1.25)
    expected += tokens[1] * 0.1 + (tokens[2] - tokens[1]) * 1.25
    assert abs(physical_limit(billing.prefixes) - expected) < 1e-6
    assert abs(sum(b.cost for b in billing.bills) - expected) < 1e-6  # this stream is at the limit
