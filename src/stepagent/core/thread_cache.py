"""A warm worker's cache of loaded threads: bounded in bytes, least recently used first out.

What it guarantees:

- **Bounded.** The entries' sizes (the encoded bytes of their items) never add up to more than
  ``max_bytes``; putting an entry evicts the least recently used ones until it fits, and an entry larger
  than the whole bound is not kept. ``max_bytes`` 0 disables the cache. Nothing else is retained.
- **Never served stale.** An entry is only a claim — "the own history at head ``version`` / ``epoch`` /
  ``tail`` with the summary covering ``summary_order`` was this" (:class:`~stepagent.stores.base.KnownRows`).
  The loader hands that claim to the store, which reads the thread's head in the same request as
  everything else and uses the entry only when the head proves those rows unchanged (same epoch and
  summary, tail not behind); it then reads only the rows after the entry's tail. The step's commit is
  conditioned on the version the store just read, so even a wrong guess could not be committed over.
- **Private copies.** :meth:`get` returns the entry's lists; the loader copies them before handing them to
  a :class:`~stepagent.core.history.HistoryManager` (which appends to its own), and :meth:`put` stores
  copies, so no step can change another step's view.

Items are immutable (frozen dataclasses), so entries share them with the history that was loaded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from stepagent.call_id_filter import ENCODED_BYTES
from stepagent.history_items import HistoryItem, Summary, encode_item
from stepagent.stores.base import KnownRows

__all__ = ["DEFAULT_CACHE_BYTES", "CachedThread", "ThreadCache", "item_bytes"]

#: The default bound: 8 MiB of encoded history per warm worker (the worker's ``STEPAGENT_THREAD_CACHE_BYTES`` setting overrides).
DEFAULT_CACHE_BYTES = 8 * 2**20


def item_bytes(item: HistoryItem) -> int:
    """What an item counts against the bound: its encoded size (a summary: its text and its call-id
    filter)."""
    if isinstance(item, Summary):
        return len(item.text.encode()) + 16 + (ENCODED_BYTES if item.call_ids is not None else 0)
    return len(encode_item(item).encode())


@dataclass(frozen=True, slots=True)
class CachedThread:
    """One thread's own history as loaded: ``items[i]`` has own-log order ``orders[i]`` (a summary: the
    order it covers)."""

    known: KnownRows
    items: tuple[HistoryItem, ...]
    orders: tuple[int, ...]
    size: int


class ThreadCache:
    """Thread id → :class:`CachedThread`, at most ``max_bytes`` in all."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, CachedThread] = OrderedDict()
        self.size = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, thread_id: str) -> CachedThread | None:
        entry = self._entries.get(thread_id)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(thread_id)
        self.hits += 1
        return entry

    def put(self, thread_id: str, entry: CachedThread) -> None:
        self.drop(thread_id)
        if entry.size > self.max_bytes:
            return
        self._entries[thread_id] = entry
        self.size += entry.size
        while self.size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.size -= evicted.size
            self.evictions += 1

    def drop(self, thread_id: str) -> None:
        entry = self._entries.pop(thread_id, None)
        if entry is not None:
            self.size -= entry.size
