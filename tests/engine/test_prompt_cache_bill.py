"""What a long tool-using conversation costs in model input, through the engine and the Anthropic provider
against the project's billing model of the prompt cache (``bench/prompt_cache.py``): it never wedges,
compaction and children read their parent's cache, and ``auto`` keeps the cache across slow waits."""

from __future__ import annotations

import pytest

from bench.prompt_cache import GAP_SECONDS, PROMPT_SECONDS, run_conversation
from stepagent.core.cache_ttl import choose_ttl, is_slow_person


@pytest.mark.parametrize("bytes_per_token", [3.5, 4.0])
@pytest.mark.asyncio
async def test_a_long_conversation_in_a_16k_window_compacts_and_answers_every_turn(
    bytes_per_token: float,
) -> None:
    run = await run_conversation(turns=40, context_window=16_000, bytes_per_token=bytes_per_token)
    assert run.failed_steps == 0 and run.rejected_requests == 0
    assert run.answered == 40
    assert run.compactions >= 3
    # A compaction thread's request extends its parent's cached prefix.
    assert min(run.compaction_read_shares) >= 0.9


@pytest.mark.asyncio
async def test_a_spawned_childs_first_request_reads_its_inherited_part_from_the_cache() -> None:
    run = await run_conversation(turns=6, spawn_at=(5,))
    [share] = run.child_inherited_read_shares
    assert share >= 0.9


@pytest.mark.asyncio
async def test_auto_ttl_keeps_the_cache_across_slow_waits() -> None:
    gaps = {"tool_seconds": GAP_SECONDS, "user_seconds": GAP_SECONDS, "slow_lookup": True}
    auto = await run_conversation(turns=40, ttl="auto", **gaps)
    assert auto.ttl_1h_write_tokens > 0 and auto.ratio <= 1.2
    five = await run_conversation(turns=12, ttl="5m", **gaps)  # every wait re-writes everything
    assert five.ttl_1h_write_tokens == 0 and five.ratio > 3
    # A conversation with fast tools and no waits keeps five-minute entries: at the limit.
    fast = await run_conversation(turns=12)
    assert fast.ttl_1h_write_tokens == 0 and fast.ratio <= 1.02


@pytest.mark.asyncio
async def test_auto_ttl_treats_the_end_of_a_turn_as_a_wait_for_a_slow_person() -> None:
    # A plain chat with a fast tool: the only slow wait is the person, who writes 7 minutes after each
    # answer. ``auto`` learns it from the thread's first gap and keeps the cache from then on.
    slow = await run_conversation(turns=40, user_seconds=GAP_SECONDS)
    assert slow.failed_steps == 0 and slow.answered == 40
    assert slow.ttl_1h_write_tokens > 0 and slow.ratio <= 1.2
    # A person who answers within a minute keeps five-minute entries: at the limit.
    prompt = await run_conversation(turns=40, user_seconds=PROMPT_SECONDS)
    assert prompt.ttl_1h_write_tokens == 0 and prompt.ratio <= 1.02


def test_a_person_slower_than_four_minutes_is_a_slow_wait() -> None:
    assert not is_slow_person(None)  # not measured yet
    assert not is_slow_person(55.0)
    assert is_slow_person(7 * 60.0)
    assert choose_ttl("auto", slow=is_slow_person(7 * 60.0)) == "1h"
    assert choose_ttl("5m", slow=is_slow_person(7 * 60.0)) == "5m"
