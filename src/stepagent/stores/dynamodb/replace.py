"""Rewind, whole-history replacement and generation sweeping for the DynamoDB conversation store.

What it guarantees:

- **Rewind** is one ``TransactWriteItems``: the head update (``tail`` = the cut, ``version`` + 1,
  conditioned on the expected version), the deletion of summaries past the cut and the state cleanup
  (intents, subscriptions, deferred events, choices, the compaction claim; call-index entries and child
  closes when they fit — otherwise they follow the head, idempotently; a cleanup too big for one
  transaction goes through the head's journal, :mod:`~stepagent.stores.dynamodb.journal`). Answered/processed markers are
  removed just before (harmless if the rewind then loses its race). Rows past the cut stay as debris that
  the row condition (``cv <= expected``) lets the next commit overwrite.
- **Replacement** never exposes a partial history. ``stage_history`` reads the head and, if it exists,
  marks it ``pending_gen``/``pending_at`` (conditioned on the version, without changing it). Rows are
  written with BatchWriteItem under ``R#g{gen}#{order}`` — keys no reader queries, because readers follow
  the head's ``gen``. The flip is ONE transaction: the head (``gen``, ``tail``, version + 1, pending mark
  removed; conditioned on the version *and* on the pending mark still being ours, or on the head not
  existing for a new thread), the child-index entry of a new child, the summaries (deleted and re-put:
  summaries keep their generation-less ``S#`` keys), the state additions and the cleanup. A crash at any
  write before the flip leaves the old history; after it, the new one.
- **Sweep** deletes rows (and their S3 blobs) of every generation other than the head's and a pending
  one younger than the lease; an older pending mark is removed first (conditionally), so its writer's
  flip can no longer succeed. A reader that was paging through a just-swept generation fails loudly
  (a gap is a ``CorruptRowError``) and is retried; it never reads a mix.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import replace
from typing import Protocol

from stepagent.errors import ConcurrentWriteError, InvalidRewindError
from stepagent.history_items import Summary, encode_item
from stepagent.stores.base import HistoryEntry, Replacement, Rewind, StateCleanup, ThreadInfo, iterate_entries
from stepagent.stores.dynamodb.io import (
    ConditionFailed,
    DynamoIo,
    DynamoItem,
    Request,
    Write,
    delete,
    fits,
    insertion_seq,
    item_key,
    n_attr,
    put,
    s_attr,
    update,
)
from stepagent.stores.dynamodb.journal import flip as journal_flip
from stepagent.stores.dynamodb.layout import (
    CHILD_PREFIX,
    FLAGS_ATTRIBUTE,
    HEAD_SK,
    SUMMARY_ORDER_ATTRIBUTE,
    SUMMARY_TOKEN_ATTRIBUTE,
    head_generation,
    head_item,
    info_from_item,
    row_generation,
    row_sk,
    summary_call_ids_attribute,
    summary_sk,
)
from stepagent.stores.dynamodb.state import state_writes

#: Staged rows are flushed every 25 rows (BatchWriteItem's limit) or at this many bytes, whichever first.
_STAGE_BYTES = 2_000_000


class ConversationTable(Protocol):
    """What this module uses of :class:`~stepagent.stores.dynamodb.conversation.DynamoConversationStore`: its tables,
    its counted I/O, its consistent head read and its classified transaction. A protocol, because the store
    calls into this module: importing the store here would close an import cycle."""

    table: str
    state_table: str
    _io: DynamoIo

    async def _read_head(self, thread_id: str) -> DynamoItem | None: ...

    async def _get_head(self, thread_id: str) -> DynamoItem | None: ...

    async def _transact(self, thread_id: str, writes: list[Write]) -> None: ...

    async def latest_summary(self, thread_id: str, up_to: int | None = None) -> Summary | None: ...

    def _remember(self, thread_id: str, head: DynamoItem | None) -> None: ...


def _versioned_head(head: DynamoItem | None, thread_id: str, expected: int) -> None:
    current = int(head["version"]["N"]) if head and "version" in head else 0
    if current != expected:
        raise ConcurrentWriteError(f"thread {thread_id} is at version {current}, not {expected}")


def _cleanup_writes(
    store: ConversationTable, thread_id: str, cleanup: StateCleanup, added: set[str]
) -> tuple[list[DynamoItem], list[Write], list[Write]]:
    """(marker keys to delete first, deletes that move with the head, writes that may follow it).

    ``added`` holds state sort keys the same transaction puts; they are not also deleted (one action per
    item per transaction)."""
    state = store.state_table
    markers = [item_key(thread_id, f"A#{c}") for c in cleanup.answered]
    markers += [item_key(thread_id, f"P#{m}") for m in cleanup.processed]
    core_keys = [f"I#{i}" for i in cleanup.intents] + [f"SUB#{s}" for s in cleanup.subscriptions]
    core_keys += [f"D#{d}" for d in cleanup.deferred] + [f"CHOICE#{c}" for c in cleanup.choices]
    if cleanup.release_compaction:
        core_keys.append("COMPACTION")
    core = [delete(state, item_key(thread_id, sk)) for sk in dict.fromkeys(core_keys) if sk not in added]
    late = [
        delete(state, item_key(thread_id, sk))
        for sk in dict.fromkeys(f"CALL#{c}" for c in cleanup.indexed_calls)
        if sk not in added
    ]
    for child in dict.fromkeys(cleanup.close_threads):
        late.append(
            update(
                store.table,
                item_key(child, HEAD_SK),
                "SET #closed = :t",
                {"#closed": "closed", "#pk": "pk"},
                {":t": {"BOOL": True}},
                ConditionExpression="attribute_exists(#pk)",
            )
        )
    return markers, core, late


async def _apply(
    store: ConversationTable,
    thread_id: str,
    core: list[Write],
    late: list[Write],
    *,
    with_head: int = 1,
) -> None:
    """``core`` (head action first) as one transaction, with ``late`` in it too when it fits, else after.
    When ``core`` itself does not fit, its first ``with_head`` writes flip the head and the rest follow
    through the head's journal (:mod:`~stepagent.stores.dynamodb.journal`)."""
    if fits([*core, *late]):
        await store._transact(thread_id, [*core, *late])
        return
    await journal_flip(store, thread_id, HEAD_SK, core[:with_head], core[with_head:])
    for write in late:  # idempotent: deleting an index entry, closing a thread
        with contextlib.suppress(ConditionFailed):
            await store._io.write(write)


# ---- rewind ----------------------------------------------------------------------------------------------


async def rewind_thread(store: ConversationTable, thread_id: str, rewind: Rewind) -> ThreadInfo:
    """Drop the rows after ``rewind.to_order`` in one conditional head update (a new epoch)."""
    head = await store._read_head(thread_id)
    _versioned_head(head, thread_id, rewind.expected_version)
    if head is None:
        raise ConcurrentWriteError(f"thread {thread_id} does not exist")
    info = info_from_item(head)
    if not 0 <= rewind.to_order <= info.tail:
        raise InvalidRewindError(f"thread {thread_id}: cannot rewind to {rewind.to_order} (tail {info.tail})")
    markers, cleanup, late = _cleanup_writes(store, thread_id, rewind.cleanup, set())
    # The summary pointer moves to the latest summary the cut keeps; the state flags are dropped (the
    # cleanup changes state they do not track), so readers ask the state table again.
    removed = set(rewind.summaries_removed)
    bound: int | None = rewind.to_order
    kept = None
    while bound is not None and bound >= 0:
        kept = await store.latest_summary(thread_id, up_to=bound)
        if kept is None or kept.up_to_order not in removed:
            break
        bound, kept = kept.up_to_order - 1, None
    await store._io.batch_delete(store.state_table, markers)
    store._remember(thread_id, None)
    # A new epoch: the orders past the cut will be reused, and (order, epoch) tells their rows apart.
    head_update = update(
        store.table,
        item_key(thread_id, HEAD_SK),
        "SET #v = :nv, #t = :nt, #ep = :ep, #sum = :sum REMOVE #fl, #sv",
        {
            "#v": "version",
            "#t": "tail",
            "#ep": "epoch",
            "#sum": SUMMARY_ORDER_ATTRIBUTE,
            "#fl": FLAGS_ATTRIBUTE,
            "#sv": SUMMARY_TOKEN_ATTRIBUTE,
        },
        {
            ":nv": n_attr(info.version + 1),
            ":nt": n_attr(rewind.to_order),
            ":e": n_attr(info.version),
            ":ep": n_attr(info.epoch + 1),
            ":sum": n_attr(kept.up_to_order if kept is not None else -1),
        },
        ConditionExpression="#v = :e",
    )
    summaries = [
        delete(store.table, item_key(thread_id, summary_sk(order)))
        for order in dict.fromkeys(rewind.summaries_removed)
    ]
    await _apply(store, thread_id, [head_update, *summaries, *cleanup], late)
    return replace(info, version=info.version + 1, tail=rewind.to_order, epoch=info.epoch + 1)


# ---- replacement -----------------------------------------------------------------------------------------


async def stage_history(store: ConversationTable, thread_id: str, expected_version: int) -> DynamoStaging:
    """Start replacing a thread's whole history: rows are staged under a new generation, then flipped."""
    head = await store._read_head(thread_id)
    _versioned_head(head, thread_id, expected_version)
    staging = DynamoStaging(store, thread_id, uuid.uuid4().hex[:16], expected_version, head)
    if head is not None:
        mark = update(
            store.table,
            item_key(thread_id, HEAD_SK),
            "SET #pg = :g, #pa = :at",
            {"#pg": "pending_gen", "#pa": "pending_at", "#v": "version"},
            {
                ":g": s_attr(staging.generation),
                ":at": n_attr(int(time.time())),
                ":e": n_attr(expected_version),
            },
            ConditionExpression="#v = :e",
        )
        try:
            await store._io.write(mark)
        except ConditionFailed:
            raise ConcurrentWriteError(f"thread {thread_id} moved past version {expected_version}") from None
    return staging


class DynamoStaging:
    """``HistoryStaging`` on DynamoDB (see the module docstring for the protocol)."""

    def __init__(
        self,
        store: ConversationTable,
        thread_id: str,
        generation: str,
        expected: int,
        head: DynamoItem | None,
    ) -> None:
        self.thread_id = thread_id
        self.generation = generation
        self._store = store
        self._expected = expected
        self._head = head
        self._count = 0
        self._summaries: dict[int, DynamoItem] = {}
        self._blobs: list[str] = []
        self._flipped = False
        # A replaced history starts a new epoch (a brand-new thread never published anything: epoch 0).
        self._epoch = info_from_item(head).epoch + 1 if head is not None else 0

    async def add(self, entries: AsyncIterable[HistoryEntry] | Iterable[HistoryEntry]) -> None:
        store, thread_id = self._store, self.thread_id
        cv = self._expected + 1
        batch: list[DynamoItem] = []
        size = 0
        async for entry in iterate_entries(entries):
            if isinstance(entry, Summary):
                sk = summary_sk(entry.up_to_order)
                payload = await store._io.payload(entry.text, f"summaries/{thread_id}/{sk}")
                # The filter (when the entry has one) is staged with the text: a replaced history's
                # summaries describe the rows staged with them.
                self._summaries[entry.up_to_order] = (
                    item_key(thread_id, sk) | payload | summary_call_ids_attribute(entry)
                )
                continue
            item, message_id = entry
            self._count += 1
            order = self._count
            blob_key = f"rows/{thread_id}/g{self.generation}/{order:012d}-{cv}"
            payload = await store._io.payload(encode_item(item), blob_key)
            if "blob" in payload:
                self._blobs.append(str(payload["blob"]["S"]))
            row = item_key(thread_id, row_sk(order, self.generation))
            row |= {"message_id": s_attr(message_id), "cv": n_attr(cv)} | payload
            if self._epoch:
                row["ep"] = n_attr(self._epoch)
            batch.append(row)
            size += len(str(payload.get("body", {}).get("S", "")))
            # Only this batch is held: memory stays bounded whatever the history's length.
            if len(batch) >= 25 or size >= _STAGE_BYTES:
                await store._io.batch_put(store.table, batch)
                batch, size = [], 0
        if batch:
            await store._io.batch_put(store.table, batch)

    async def flip(self, replacement: Replacement) -> ThreadInfo:
        store, thread_id, head = self._store, self.thread_id, self._head
        current = info_from_item(head) if head is not None else None
        base = replacement.record or current or ThreadInfo(thread_id=thread_id, root_id=thread_id)
        new = replace(
            base, thread_id=thread_id, version=self._expected + 1, tail=self._count, epoch=self._epoch
        )
        state = replacement.state
        others = (
            await state_writes(store._io, store.state_table, thread_id, state, new.version) if state else []
        )
        added = {str(w.request["Key" if "Key" in w.request else "Item"]["sk"]["S"]) for w in others}
        markers, cleanup, late = _cleanup_writes(store, thread_id, replacement.cleanup, added)
        await store._io.batch_delete(store.state_table, markers)
        writes = [self._head_write(new), *await self._summary_writes(), *others, *cleanup]
        with_head = 1
        if head is None and new.parent_id is not None:
            entry = {**item_key(new.parent_id, f"{CHILD_PREFIX}{thread_id}"), "seq": n_attr(insertion_seq())}
            writes.insert(1, put(store.table, entry))
            with_head = 2  # a new child's index entry lands with its head, whatever else is journaled
        store._remember(thread_id, None)
        await _apply(store, thread_id, writes, late, with_head=with_head)
        self._flipped = True
        return new

    def _head_write(self, new: ThreadInfo) -> Write:
        store = self._store
        if self._head is None:  # a new thread: the flip creates its head, only if nobody else did
            item = head_item(new) | {
                "gen": s_attr(self.generation),
                SUMMARY_ORDER_ATTRIBUTE: n_attr(max(self._summaries, default=-1)),
            }
            return put(store.table, item, "attribute_not_exists(#pk)", {"#pk": "pk"})
        names = {
            "#v": "version",
            "#t": "tail",
            "#g": "gen",
            "#pg": "pending_gen",
            "#pa": "pending_at",
            "#sum": SUMMARY_ORDER_ATTRIBUTE,
            "#fl": FLAGS_ATTRIBUTE,
            "#sv": SUMMARY_TOKEN_ATTRIBUTE,
        }
        values: DynamoItem = {
            ":nv": n_attr(new.version),
            ":nt": n_attr(new.tail),
            ":g": s_attr(self.generation),
            ":e": n_attr(self._expected),
            ":sum": n_attr(max(self._summaries, default=-1)),
        }
        # The staged summaries are the thread's now (the pointer names the latest); the state flags are
        # dropped, since the replacement's state and cleanup change what they track.
        sets = ["#v = :nv", "#t = :nt", "#g = :g", "#sum = :sum"]
        removes = ["#pg", "#pa", "#fl", "#sv"]
        fields = head_item(new)
        for name in ("root_id", "kind", "closed", "parent_id", "spawn_order", "spawn_tool_call_id", "epoch"):
            names[f"#{name}"] = name
            if name in fields:
                sets.append(f"#{name} = :{name}")
                values[f":{name}"] = fields[name]
            else:
                removes.append(f"#{name}")
        return update(
            store.table,
            item_key(self.thread_id, HEAD_SK),
            f"SET {', '.join(sets)} REMOVE {', '.join(removes)}",
            names,
            values,
            ConditionExpression="#v = :e AND #pg = :g",
        )

    async def _summary_writes(self) -> list[Write]:
        store = self._store
        writes = [put(store.table, item) for item in self._summaries.values()]
        if self._head is not None:
            async for key in _keys(store, self.thread_id, "S#0", "S#9~"):
                if int(str(key["sk"]["S"])[2:]) not in self._summaries:
                    writes.append(delete(store.table, {"pk": key["pk"], "sk": key["sk"]}))
        return writes

    async def abandon(self) -> None:
        if self._flipped:
            return
        store = self._store
        if self._head is not None:
            clear = update(
                store.table,
                item_key(self.thread_id, HEAD_SK),
                "REMOVE #pg, #pa",
                {"#pg": "pending_gen", "#pa": "pending_at"},
                {":g": s_attr(self.generation)},
                ConditionExpression="#pg = :g",
            )
            with contextlib.suppress(ConditionFailed):
                await store._io.write(clear)
        keys = [item_key(self.thread_id, row_sk(o, self.generation)) for o in range(1, self._count + 1)]
        await store._io.batch_delete(store.table, keys)
        for blob in self._blobs:
            await store._io.delete_blob(blob)


# ---- sweep -----------------------------------------------------------------------------------------------


async def _keys(store: ConversationTable, thread_id: str, lo: str, hi: str) -> AsyncIterator[DynamoItem]:
    """Keys (and ``blob``) of the items with ``lo <= sk <= hi``, page by page."""
    query: Request = {
        "TableName": store.table,
        "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :lo AND :hi",
        "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk", "#b": "blob"},
        "ExpressionAttributeValues": {":pk": s_attr(thread_id), ":lo": s_attr(lo), ":hi": s_attr(hi)},
        "ProjectionExpression": "#pk, #sk, #b",
        "ConsistentRead": True,
    }
    while True:
        page = await store._io.call("Query", store.table, **query)
        for item in page.get("Items", []):
            yield item
        if not page.get("LastEvaluatedKey"):
            return
        query["ExclusiveStartKey"] = page["LastEvaluatedKey"]


async def sweep_generations(
    store: ConversationTable, thread_id: str, *, now: float, lease_seconds: float
) -> int:
    """Delete the rows of replaced or abandoned generations whose lease expired; the count deleted."""
    head = await store._read_head(thread_id)
    if head is None:
        return 0
    current = head_generation(head)
    live: str | None = None
    if "pending_gen" in head:
        pending = str(head["pending_gen"]["S"])
        if float(head["pending_at"]["N"]) + lease_seconds > now:
            live = pending
        else:
            clear = update(
                store.table,
                item_key(thread_id, HEAD_SK),
                "REMOVE #pg, #pa",
                {"#pg": "pending_gen", "#pa": "pending_at"},
                {":g": s_attr(pending)},
                ConditionExpression="#pg = :g",
            )
            with contextlib.suppress(ConditionFailed):  # flipped or re-marked meanwhile: leave it
                await store._io.write(clear)
    # Ranges that skip the live generation's rows entirely (they are never even read).
    ranges = [("R#g", f"R#g{current}"), (f"R#g{current}$", "R#g~"), ("R#0", "R#9~")] if current else []
    ranges = ranges or [("R#g", "R#g~")]
    deleted = 0
    for lo, hi in ranges:
        doomed: list[DynamoItem] = []
        async for key in _keys(store, thread_id, lo, hi):
            if row_generation(str(key["sk"]["S"])) == live:
                continue
            doomed.append({"pk": key["pk"], "sk": key["sk"]})
            if "blob" in key:
                await store._io.delete_blob(str(key["blob"]["S"]))
            if len(doomed) >= 25:
                await store._io.batch_delete(store.table, doomed)
                deleted, doomed = deleted + len(doomed), []
        await store._io.batch_delete(store.table, doomed)
        deleted += len(doomed)
    return deleted
