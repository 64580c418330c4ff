"""Which rows make up a thread's model-facing history: the ancestor chain and the compaction cut.

What it guarantees (the worked examples are in ``tests/contract``):

- :func:`ancestor_chain` walks parent links up to the root and fails loudly on a cycle, so a corrupt tree
  can never loop forever;
- :func:`load_history_with_ancestors` starts at the latest compaction summary that applies — the thread's
  own, else the closest ancestor's within what the path inherited — and streams only the rows after it
  through :meth:`~stepagent.stores.base.ConversationStore.load_rows`, so what a step reads does not grow
  with history that compaction already covers.

This is policy over the store port, and works on any implementation of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stepagent.errors import CorruptDataError
from stepagent.history_items import HistoryItem
from stepagent.stores.base import ConversationStore


@dataclass(frozen=True, slots=True)
class LoadedHistory:
    """What :func:`load_history_with_ancestors` returns.

    ``orders[i]`` is the own-log order of ``items[i]`` (the summary's ``up_to_order`` for an own summary),
    or ``None`` for items inherited from ancestors."""

    items: list[HistoryItem]
    orders: list[int | None]
    compacted_up_to: int | None
    ancestor_prefix_len: int
    rows_read: int = 0


@dataclass(slots=True)
class AncestorLink:
    """One ancestor on a thread's path to its root and how much of its log the path inherits (``cutoff``)."""

    thread_id: str
    cutoff: int


async def ancestor_chain(store: ConversationStore, thread_id: str) -> list[AncestorLink]:
    """``[(ancestor, cutoff)]`` root first, excluding ``thread_id``; each cutoff is the spawn order of the
    thread directly below that ancestor on the path (how much of the ancestor's log the path inherits)."""
    chain: list[AncestorLink] = []
    info = await store.get_thread(thread_id)
    seen = {thread_id}
    while info is not None and info.parent_id is not None:
        if info.parent_id in seen:
            raise CorruptDataError(f"thread tree has a cycle at {info.parent_id}")
        seen.add(info.parent_id)
        chain.append(AncestorLink(info.parent_id, info.spawn_order or 0))
        info = await store.get_thread(info.parent_id)
    chain.reverse()
    return chain


@dataclass(slots=True)
class _Builder:
    items: list[HistoryItem] = field(default_factory=list)
    orders: list[int | None] = field(default_factory=list)
    rows_read: int = 0

    async def extend(
        self, store: ConversationStore, thread_id: str, after: int, up_to: int | None, own: bool
    ) -> None:
        async for row in store.load_rows(thread_id, after=after, up_to=up_to):
            self.items.append(row.item)
            self.orders.append(row.order if own else None)
            self.rows_read += 1


async def load_history_with_ancestors(
    store: ConversationStore, thread_id: str, chain: Sequence[AncestorLink] | None = None
) -> LoadedHistory:
    """Reconstruct the model-facing history of ``thread_id``:

    1. the thread's own latest summary, if any, then its rows after it — ancestors are not loaded;
    2. otherwise the closest ancestor summary that lies within what the path inherited, the rest of that
       ancestor's inherited rows, each later ancestor's inherited rows, then the thread's own rows.
    """
    built = _Builder()
    own_summary = await store.latest_summary(thread_id)
    if own_summary is not None:
        built.items.append(own_summary)
        built.orders.append(own_summary.up_to_order)
        await built.extend(store, thread_id, own_summary.up_to_order, None, own=True)
        return LoadedHistory(built.items, built.orders, own_summary.up_to_order, 0, built.rows_read)

    if chain is None:
        chain = await ancestor_chain(store, thread_id)
    start = 0
    after = 0
    for index in range(len(chain) - 1, -1, -1):
        link = chain[index]
        summary = await store.latest_summary(link.thread_id, up_to=link.cutoff)
        if summary is not None:
            built.items.append(summary)
            built.orders.append(None)
            start, after = index, summary.up_to_order
            break
    for index in range(start, len(chain)):
        link = chain[index]
        await built.extend(store, link.thread_id, after if index == start else 0, link.cutoff, own=False)
    prefix = len(built.items)
    await built.extend(store, thread_id, 0, None, own=True)
    return LoadedHistory(built.items, built.orders, None, prefix, built.rows_read)
