"""What a step reads first, from DynamoDB in as few requests as the layout allows.

:func:`open_thread` returns the same :class:`~stepagent.stores.base.ThreadSnapshot` as the port's separate
reads (``load_snapshot`` composes them; the contract suite checks both agree) with:

- **One ``BatchGetItem``** (consistent) for the thread's ``HEAD``, the ``SUMMARY`` copy of its latest
  summary (only when the caller holds no rows), the ``META`` item of the thread (its root's, for a root:
  the metadata and the conversation's spend, which the limits are checked against)
  and the ``P#`` / ``A#`` markers of the batch's message and tool-call ids — across both tables.
- **One ``Query``** of exactly the rows after the summary (or after the rows the caller still holds, when
  the head proves them unchanged: same epoch and summary, tail not behind), paged by DynamoDB's 1 MB
  (or the store's ``page_size``); none at all when the caller already holds the tail.
- **No state queries** for what the head's flags say is empty (open intents, deferred inputs, pending
  choices: ``layout``); the flags come from the head read in the same request, never a cache,
  and are ignored when the thread's ``FLAGS_UNKNOWN`` item (state added before it had a head) is there.

:func:`save_summary` writes ``S#{up_to}``, the ``SUMMARY`` copy and the head's pointer in one transaction
(only ``S#`` for a head without a pointer, or a summary older than the latest); :func:`latest_summary` is
the ``S#`` query every other reader uses. Both summary items carry the summary's call-id filter (``cid``),
so whichever one a reader gets, it gets the filter with the text.

Fallbacks keep it exact where the fast path cannot be: a head naming a journal is rolled forward and the
snapshot read again (markers and metadata may be in the journal); a head without a summary pointer (written
before it existed) queries ``S#`` as before; a copy whose token does not match the head's is ignored for a
``GetItem`` of ``S#{sum}``; a child's root metadata is one more ``GetItem``. The head read is remembered by
the store, so the step's commit is conditioned on it without reading it again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from stepagent.errors import CorruptRowError, StoreError
from stepagent.history_items import Summary
from stepagent.stores.base import KnownRows, StoredRow, ThreadSnapshot, known_still_hold
from stepagent.stores.dynamodb.io import (
    DynamoIo,
    DynamoItem,
    TransactionCancelled,
    Write,
    item_key,
    n_attr,
    put,
    s_attr,
    update,
)
from stepagent.stores.dynamodb.journal import JOURNAL_ATTR, roll_forward
from stepagent.stores.dynamodb.layout import (
    CHOICES_ATTRIBUTE,
    DEFERRED_ATTRIBUTE,
    FLAGS_ATTRIBUTE,
    HEAD_SK,
    INTENTS_ATTRIBUTE,
    LATEST_SUMMARY_SK,
    SUMMARY_ORDER_ATTRIBUTE,
    SUMMARY_TOKEN_ATTRIBUTE,
    head_generation,
    info_from_item,
    summary_call_ids,
    summary_call_ids_attribute,
    summary_sk,
)
from stepagent.stores.dynamodb.state import FLAGS_UNKNOWN_SK, has_metadata, spend_from_item


class SnapshotTable(Protocol):
    """What this module uses of :class:`~stepagent.stores.dynamodb.conversation.DynamoConversationStore` (a protocol:
    the store calls into this module, so importing it here would close an import cycle)."""

    table: str
    state_table: str
    _io: DynamoIo

    async def _get_head(self, thread_id: str) -> DynamoItem | None: ...

    async def _transact(self, thread_id: str, writes: list[Write]) -> None: ...

    def _remember(self, thread_id: str, head: DynamoItem | None) -> None: ...

    def _query_rows(
        self, thread_id: str, generation: str, first: int, last: int
    ) -> AsyncIterator[StoredRow]: ...


__all__ = ["latest_summary", "open_thread", "save_summary"]

_META_SK = "META"


async def open_thread(
    store: SnapshotTable,
    thread_id: str,
    *,
    message_ids: Sequence[str] = (),
    tool_call_ids: Sequence[str] = (),
    known: KnownRows | None = None,
) -> ThreadSnapshot:
    """What a step reads first (head, summary, metadata, the batch's markers, rows), in the fewest requests."""
    io, table, state_table = store._io, store.table, store.state_table
    processed_ids = list(dict.fromkeys(message_ids))
    answered_ids = list(dict.fromkeys(tool_call_ids))
    keys: list[tuple[str, DynamoItem]] = [(table, item_key(thread_id, HEAD_SK))]
    if known is None:
        keys.append((table, item_key(thread_id, LATEST_SUMMARY_SK)))
    keys.append((state_table, item_key(thread_id, _META_SK)))
    keys.append((state_table, item_key(thread_id, FLAGS_UNKNOWN_SK)))
    keys += [(state_table, item_key(thread_id, f"P#{m}")) for m in processed_ids]
    keys += [(state_table, item_key(thread_id, f"A#{c}")) for c in answered_ids]
    found = await io.batch_get_many(keys)
    by_sk = {(str(i["pk"]["S"]), str(i["sk"]["S"])): i for items in found.values() for i in items}
    head = by_sk.get((thread_id, HEAD_SK))
    if head is not None and JOURNAL_ATTR in head:
        # The journal may hold this thread's markers and metadata: complete it, then read again.
        await roll_forward(store, head, HEAD_SK)
        store._remember(thread_id, None)
        return await open_thread(
            store, thread_id, message_ids=message_ids, tool_call_ids=tool_call_ids, known=known
        )
    snapshot = ThreadSnapshot(info_from_item(head) if head is not None else None)
    store._remember(thread_id, head)
    snapshot.processed = {m for m in processed_ids if (thread_id, f"P#{m}") in by_sk}
    snapshot.answered = {c for c in answered_ids if (thread_id, f"A#{c}") in by_sk}
    info = snapshot.info
    root = info.root_id if info is not None else thread_id
    meta = (
        by_sk.get((root, _META_SK)) if root == thread_id else await _get(store, state_table, root, _META_SK)
    )
    snapshot.metadata = await _metadata(store, meta, root)
    snapshot.spend = spend_from_item(meta)
    if head is None or info is None:
        return snapshot
    if FLAGS_ATTRIBUTE in head and (thread_id, FLAGS_UNKNOWN_SK) not in by_sk:
        snapshot.open_intents = INTENTS_ATTRIBUTE in head
        snapshot.deferred = DEFERRED_ATTRIBUTE in head
        snapshot.choices = CHOICES_ATTRIBUTE in head
    summary: Summary | None = None
    order: int | None
    if SUMMARY_ORDER_ATTRIBUTE in head:
        pointer = int(head[SUMMARY_ORDER_ATTRIBUTE]["N"])
        order = pointer if pointer >= 0 else None
    else:  # a head from before the pointer: the latest summary is found the old way
        summary = await latest_summary(store, thread_id)
        order = summary.up_to_order if summary is not None else None
    snapshot.summary_order = order
    if known is not None and known_still_hold(known, info, order):
        snapshot.incremental = True
        after = known.tail
    else:
        if summary is None and order is not None:
            summary = await _summary(store, head, by_sk.get((thread_id, LATEST_SUMMARY_SK)), order)
        snapshot.summary = summary
        after = order if order is not None else 0
    snapshot.rows = [
        row async for row in store._query_rows(thread_id, head_generation(head), after + 1, info.tail)
    ]
    return snapshot


async def _get(store: SnapshotTable, table: str, pk: str, sk: str) -> DynamoItem | None:
    response = await store._io.call(
        "GetItem", table, TableName=table, Key=item_key(pk, sk), ConsistentRead=True
    )
    item: DynamoItem | None = response.get("Item")
    return item or None


async def _metadata(store: SnapshotTable, item: DynamoItem | None, root: str) -> Any:
    if not has_metadata(item):
        return None
    assert item is not None
    return json.loads(await store._io.read_payload(item, f"metadata of {root}"))


async def _summary(store: SnapshotTable, head: DynamoItem, copy: DynamoItem | None, order: int) -> Summary:
    """The summary covering ``order``: the copy read with the head when its token is the head's, else
    the canonical ``S#`` item."""
    thread_id = str(head["pk"]["S"])
    token = head.get(SUMMARY_TOKEN_ATTRIBUTE)
    if copy is None or token is None or copy.get("sv") != token or int(copy["up_to"]["N"]) != order:
        copy = await _get(store, store.table, thread_id, summary_sk(order))
        if copy is None:
            raise CorruptRowError(f"thread {thread_id}: the head names summary {order}, which is missing")
    text = await store._io.read_payload(copy, f"thread {thread_id} summary")
    return Summary(text=text, up_to_order=order, call_ids=summary_call_ids(copy))


# ---- the summary and its pointer ----------------------------------------------------------------


async def save_summary(store: SnapshotTable, thread_id: str, summary: Summary) -> None:
    """Store a compaction summary and its copy under the fixed latest-summary key."""
    sk = summary_sk(summary.up_to_order)
    payload = await store._io.payload(summary.text, f"summaries/{thread_id}/{sk}")
    payload |= summary_call_ids_attribute(summary)  # on both items: the cold load reads the copy
    canonical = put(store.table, item_key(thread_id, sk) | payload)
    # With the head's summary pointer known (every thread created since it exists), the summary, its
    # copy under a fixed key (read blind with the head) and the pointer move together; the copy's token
    # ties it to this save. Otherwise (an older head, a summary older than the latest) only ``S#``.
    token = uuid.uuid4().hex[:16]
    order = n_attr(summary.up_to_order)
    copy = item_key(thread_id, LATEST_SUMMARY_SK) | payload | {"up_to": order, "sv": s_attr(token)}
    pointer = update(
        store.table,
        item_key(thread_id, HEAD_SK),
        "SET #sum = :n, #sv = :sv",
        {"#sum": SUMMARY_ORDER_ATTRIBUTE, "#sv": SUMMARY_TOKEN_ATTRIBUTE},
        {":n": order, ":sv": s_attr(token)},
        ConditionExpression="attribute_exists(#sum) AND #sum <= :n",
    )
    try:
        await store._io.transact(store.table, [pointer, canonical, put(store.table, copy)])
    except TransactionCancelled as exc:
        if exc.reasons[:1] != ["ConditionalCheckFailed"]:
            raise StoreError(
                f"saving the summary of thread {thread_id} was cancelled: {', '.join(exc.reasons)}"
            ) from None
    else:
        store._remember(thread_id, None)
        return
    await store._io.write(canonical)


async def latest_summary(store: SnapshotTable, thread_id: str, up_to: int | None = None) -> Summary | None:
    """The latest summary covering at most ``up_to`` (all when ``None``; none when negative)."""
    if up_to is not None and up_to < 0:
        return None
    response = await store._io.call(
        "Query",
        store.table,
        TableName=store.table,
        KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
        ExpressionAttributeNames={"#pk": "pk", "#sk": "sk"},
        ExpressionAttributeValues={
            ":pk": s_attr(thread_id),
            ":lo": s_attr(summary_sk(0)),
            ":hi": s_attr(summary_sk(up_to) if up_to is not None else "S#~"),  # "~" sorts after digits
        },
        ScanIndexForward=False,
        Limit=1,
        ConsistentRead=True,
    )
    items = response.get("Items", [])
    if not items:
        return None
    text = await store._io.read_payload(items[0], f"thread {thread_id} summary")
    order = int(str(items[0]["sk"]["S"])[2:])
    return Summary(text=text, up_to_order=order, call_ids=summary_call_ids(items[0]))
