"""Contract: the state store's small key/value cache (``cache_get`` / ``cache_put``), on every store."""

from __future__ import annotations

import time
import uuid

from stepagent.stores.base import ConversationStore, StateStore

StorePair = tuple[ConversationStore, StateStore]


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def test_a_put_value_is_read_back_until_it_expires(stores: StorePair) -> None:
    _, state = stores
    key = uid("k")
    assert await state.cache_get(key) is None
    await state.cache_put(key, '{"a": 1}', time.time() + 60)
    assert await state.cache_get(key) == '{"a": 1}'
    assert await state.cache_get(uid("other")) is None


async def test_a_second_put_replaces_the_value_and_its_expiry(stores: StorePair) -> None:
    _, state = stores
    key = uid("k")
    await state.cache_put(key, "old", time.time() + 60)
    await state.cache_put(key, "new", time.time() + 120)
    assert await state.cache_get(key) == "new"
    await state.cache_put(key, "gone", time.time() - 1)
    assert await state.cache_get(key) is None


async def test_an_expired_entry_is_not_returned_even_before_the_store_deletes_it(stores: StorePair) -> None:
    _, state = stores
    key = uid("k")
    await state.cache_put(key, "stale", time.time() - 5)
    assert await state.cache_get(key) is None


async def test_cache_keys_do_not_collide_with_thread_state(stores: StorePair) -> None:
    _, state = stores
    thread = uid("t")
    await state.add_subscription(thread, "call-1")
    await state.cache_put(thread, "value", time.time() + 60)
    assert await state.active_subscriptions(thread) == {"call-1"}
    assert await state.cache_get(thread) == "value"


async def test_large_values_round_trip(stores: StorePair) -> None:
    _, state = stores
    key = uid("k")
    value = "x" * 400_000  # over the DynamoDB inline budget: the blob bucket holds it
    await state.cache_put(key, value, time.time() + 60)
    assert await state.cache_get(key) == value
