"""The warm worker's thread cache (``core/thread_cache.py``): bounded in bytes, LRU, and never served
stale — a worker whose cached thread another worker (another Lambda container) advanced, rewound or
compacted sends the model exactly the history a cold worker would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bench.step_costs import peer_script, user_text
from bench.workload import Workload
from stepagent.core.thread_cache import CachedThread, ThreadCache, item_bytes
from stepagent.history_items import AssistantText, Summary
from stepagent.lifecycle.rewind import rewind_thread
from stepagent.messages import InputMessage
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import KnownRows
from stepagent.stores.memory import memory_stores


def entry(size_text: str, version: int = 1) -> CachedThread:
    item = AssistantText(size_text)
    return CachedThread(KnownRows(version, 0, 1, None), (item,), (1,), item_bytes(item))


def test_the_cache_stays_within_its_bytes_evicting_least_recently_used() -> None:
    one = entry("x" * 1000)
    cache = ThreadCache(max_bytes=3 * one.size)
    for thread in ("a", "b", "c"):
        cache.put(thread, entry("x" * 1000))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("d", entry("x" * 1000))
    assert cache.get("b") is None and cache.get("a") is not None and len(cache) == 3
    assert cache.size <= cache.max_bytes
    cache.put("big", entry("x" * 10_000))  # larger than the whole bound: not kept, nothing evicted for it
    assert cache.get("big") is None and len(cache) == 3
    cache.put("a", entry("y" * 10))  # replacing an entry frees its old size
    assert cache.size == sum(e.size for e in (cache.get("a"), cache.get("c"), cache.get("d")) if e)
    assert ThreadCache(max_bytes=0).get("a") is None


def test_cache_bound_setting() -> None:
    from stepagent.aws.settings import Settings
    from stepagent.errors import ConfigurationError

    assert Settings.from_env({}).thread_cache_bytes == 8 * 2**20
    assert Settings.from_env({"STEPAGENT_THREAD_CACHE_BYTES": "0"}).thread_cache_bytes == 0
    with pytest.raises(ConfigurationError, match="STEPAGENT_THREAD_CACHE_BYTES"):
        Settings.from_env({"STEPAGENT_THREAD_CACHE_BYTES": "-1"})


class Recording:
    """The scripted model, remembering the history of every request it was sent."""

    def __init__(self) -> None:
        self.inner = ScriptedProvider(peer_script())
        self.histories: list[list[Any]] = []

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.histories.append(list(request.history))
        async for event in self.inner.stream(request):
            yield event


async def turn(workload: Workload, thread: str, n: int) -> None:
    await workload.queue.send(InputMessage.user_text(thread, user_text(n), id=f"ask-{n}"), f"ask-{n}")
    while workload.queue.pending:
        await workload.step()


async def stored(conversation: Any, thread: str) -> list[Any]:
    summary = await conversation.latest_summary(thread)
    after = summary.up_to_order if summary is not None else 0
    rows = [row.item async for row in conversation.load_rows(thread, after=after)]
    return ([summary] if summary is not None else []) + rows


async def test_a_warm_worker_sees_what_other_workers_did_to_its_cached_thread() -> None:
    conversation, state = memory_stores()
    model_a, model_b = Recording(), Recording()
    cache = ThreadCache()
    a = Workload.build(conversation, state, provider=model_a, thread_cache=cache)
    b = Workload.build(conversation, state, provider=model_b, thread_cache=ThreadCache())

    async def a_sends_the_stored_history(n: int) -> None:
        expected = await stored(conversation, "t")
        before = len(model_a.histories)
        await turn(a, "t", n)
        first = model_a.histories[before]  # the turn's first request: stored history + the new user text
        assert first[:-1] == expected

    await a_sends_the_stored_history(1)  # a caches t
    await turn(b, "t", 2)  # another container advances t
    await a_sends_the_stored_history(3)  # a reads only b's rows after its cached tail
    assert cache.hits >= 2
    await rewind_thread(conversation, state, "t", to_order=5)  # a new epoch behind a's back
    await a_sends_the_stored_history(4)
    await conversation.save_summary("t", Summary("SUMMARY of turns 1-2", 8))  # compacted behind a's back
    await a_sends_the_stored_history(5)
    assert isinstance(model_a.histories[-2][0], Summary)


async def test_a_loaded_thread_is_counted_at_its_stored_encoding_without_encoding_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepagent.core import history as history_module
    from stepagent.core.history import HistoryManager
    from stepagent.history_items import UserItem
    from stepagent.messages import TextContent
    from stepagent.stores.base import Commit

    conversation, state = memory_stores()
    rows = [(UserItem(content=TextContent(text=f"é {n} " * 50)), f"m{n}") for n in range(6)]
    rows += [(AssistantText(f"answer {n} ü" * 40), f"a{n}") for n in range(6)]
    await conversation.commit("t", Commit(expected_version=0, rows=rows))
    encoded: list[Any] = []
    real = history_module.item_bytes
    monkeypatch.setattr(history_module, "item_bytes", lambda item: encoded.append(item) or real(item))
    cache = ThreadCache()
    manager = await HistoryManager.load(conversation, state, "t", cache=cache)
    entry = cache.get("t")
    assert entry is not None and encoded == []  # the rows' stored bytes were used
    assert entry.size == sum(real(item) for item in manager.history)  # the same count as encoding them
