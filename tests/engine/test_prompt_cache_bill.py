"""What a long tool-using conversation costs in model input, through the engine and the Anthropic provider
against the project's billing model of the prompt cache (``bench/prompt_cache.py``): it never wedges,
compaction and children read their parent's cache, and ``auto`` keeps the cache across slow waits."""

from __future__ import annotations

import pytest

from bench.prompt_cache import GAP_SECONDS, run_conversation

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("bytes_per_token", [3.5, 4.0])
async def test_a_long_conversation_in_a_16k_window_compacts_and_answers_every_turn(
    bytes_per_token: float,
) -> None:
    run = await run_conversation(turns=40, context_window=16_000, bytes_per_token=bytes_per_token)
    assert run.failed_steps == 0 and run.rejected_requests == 0
    assert run.answered == 40
    assert run.compactions >= 3
    # A compaction thread's request extends its parent's cached prefix.
    assert min(run.compaction_read_shares) >= 0.9


async def test_a_spawned_childs_first_request_reads_its_inherited_part_from_the_cache() -> None:
    run = await run_conversation(turns=6, spawn_at=(5,))
    [share] = run.child_inherited_read_shares
    assert share >= 0.9


async def test_auto_ttl_keeps_the_cache_across_slow_waits() -> None:
    gaps = {"tool_seconds": GAP_SECONDS, "user_seconds": GAP_SECONDS, "slow_lookup": True}
    auto = await run_conversation(turns=40, ttl="auto", **gaps)
    assert auto.ttl_1h_write_tokens > 0 and auto.ratio <= 1.2
    five = await run_conversation(turns=12, ttl="5m", **gaps)  # every wait re-writes everything
    assert five.ttl_1h_write_tokens == 0 and five.ratio > 3
    # A conversation with fast tools and no waits keeps five-minute entries: at the limit.
    fast = await run_conversation(turns=12)
    assert fast.ttl_1h_write_tokens == 0 and fast.ratio <= 1.02
