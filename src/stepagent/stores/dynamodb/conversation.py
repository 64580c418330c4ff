"""DynamoDB implementations of the store ports (async low-level clients, :mod:`stepagent.aws.clients`).

:class:`DynamoConversationStore` and :class:`~stepagent.stores.dynamodb.state.DynamoStateStore` behave
exactly like the in-memory stores (the contract suite runs against both) and add:

- **Atomic, fenced commit.** A :class:`~stepagent.stores.base.Commit` is one ``TransactWriteItems``
  conditioned on the head version — on the head the step's snapshot read (or its previous commit wrote)
  at that version, remembered by the store, else one consistent ``GetItem`` of it first — so its cost
  depends on the commit's size, never on the history's length. A commit over the transaction limits
  (100 actions, ~4 MB) is written then flipped: rows are staged past the tail in transactions that each
  re-check the head version, then one transaction advances the head together with every non-row item —
  or, when those do not fit one transaction either (1,000 released events), together with a journal of
  them that is applied next and that every later reader of the head completes first
  (:mod:`~stepagent.stores.dynamodb.journal`). Readers read only orders ``<= tail`` and roll a named
  journal forward before using the head, so nobody ever sees a partial commit, whatever its size.
- **Debris past the tail is safe.** Rows past the tail are leftovers of aborted writers. Each row carries
  ``cv``, the head version its commit produces, and row puts are conditioned on
  ``attribute_not_exists(sk) OR cv <= expected``: older debris is overwritten, a row of a newer commit
  never is. Debris from a writer with the *same* base version (a crashed, or still running, write-then-flip)
  fails that condition; the store then fences: it bumps the head version (conditioned on the version it
  read), which dooms that other writer's flip, and retries once from the new version.
- **Claim check.** An encoded row over :data:`~stepagent.stores.dynamodb.io.INLINE_LIMIT` bytes keeps its
  skeleton inline and names its large texts' content-addressed objects (``blobs/sha256/<hex>``, shared
  with the queue body and output event that carry the same text; put before the transaction unless known
  to exist) in ``texts``; a row too big even without them is put to S3 under
  ``rows/{thread}/{order:012d}-{cv}-{sha256[:16]}`` and stores that key in ``blob``. Without a blob bucket
  it raises :class:`~stepagent.errors.PayloadTooLargeError`.
- **Usage.** A commit's :class:`~stepagent.stores.base.UsageRecord` is one ``U#{version}`` item written
  in the transaction that moves the head to ``version`` (with the head, in a write-then-flip), so it is
  stored exactly when the step is; ``usage_records`` is one paginated Query over the ``U#`` range.
- **Streaming reads.** ``load_rows`` reads the head, then runs one strongly consistent, paginated Query over
  exactly the asked ``R#`` range, holding one page at a time, and checks that orders are gap-free.
- **One snapshot per step.** ``open_thread`` (:mod:`~stepagent.stores.dynamodb.snapshot`) reads the head,
  the latest summary's copy, the root metadata and the batch's dedup markers in one ``BatchGetItem`` and
  the rows after the summary (or after what a warm caller holds) in one ``Query`` page per MB; the head's
  state flags (maintained by every write of that state, ``layout``) spare the state queries.
- **Thread tree.** A spawn writes the child's head and a ``C#`` index entry in the parent's partition in
  one transaction (idempotent by child id), so ``children`` is one Query plus batched head reads.
- **Generations.** A rewind is one conditional head update (rows past the new tail become debris, as
  above). A whole-history replacement (:mod:`~stepagent.stores.dynamodb.replace`) marks the head pending,
  writes rows under a fresh generation's keys, then flips the head to that generation in one conditional
  transaction; readers read the head first and follow its ``gen``, so they see exactly the old or the new
  history. Rows of other generations are invisible and removed by ``sweep_generations``.
- **Turn flag and inbox.** Every commit's head update sets ``turn_complete`` and deletes the ids it
  processed from the head's ``inbox`` string set, which :meth:`DynamoConversationStore.note_inbound` adds
  to before another thread's message is sent. Both ride on the one head update: no extra request.
- **Errors.** AWS failures become :class:`~stepagent.errors.StoreError` (operation and table named); a lost
  version race is :class:`~stepagent.errors.ConcurrentWriteError`.

The item layout (keys and the head codec) is :mod:`~stepagent.stores.dynamodb.layout`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from stepagent.blobs import ContentBlobs
from stepagent.errors import ConcurrentWriteError, CorruptRowError, StoreError, TransactionConflictError
from stepagent.history_items import Summary, decode_item, encode_item
from stepagent.stores.base import (
    Commit,
    HistoryStaging,
    KnownRows,
    Rewind,
    StoredRow,
    ThreadInfo,
    ThreadKind,
    ThreadSnapshot,
    UsageRecord,
    with_pace,
)
from stepagent.stores.dynamodb.io import (
    ConditionFailed,
    DynamoIo,
    DynamoItem,
    Request,
    TransactionCancelled,
    Write,
    fits,
    insertion_seq,
    item_key,
    n_attr,
    put,
    s_attr,
    transaction_chunks,
    update,
)
from stepagent.stores.dynamodb.journal import JOURNAL_ATTR, roll_forward
from stepagent.stores.dynamodb.journal import flip as journal_flip
from stepagent.stores.dynamodb.layout import (
    CHILD_PREFIX,
    HEAD_SK,
    INBOX_ATTRIBUTE,
    USAGE_PREFIX,
    deferred_after,
    head_after,
    head_generation,
    head_item,
    head_update,
    info_from_item,
    row_sk,
    usage_from_item,
    usage_item,
    usage_sk,
)
from stepagent.stores.dynamodb.replace import rewind_thread, stage_history, sweep_generations
from stepagent.stores.dynamodb.snapshot import latest_summary, open_thread, save_summary
from stepagent.stores.dynamodb.state import DynamoStateStore, meta_writes, state_writes
from stepagent.stores.metrics import StoreMetrics

if TYPE_CHECKING:  # the types-aiobotocore stubs: development only
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_s3 import S3Client

__all__ = ["DynamoConversationStore", "DynamoStateStore", "dynamo_stores"]


#: Heads a store remembers (the last one each thread's snapshot read or commit wrote), so a commit does not
#: read the head its step just read. Small items; bounded so a long-lived worker's memory stays flat.
REMEMBERED_HEADS = 256


def _conflict_on_head(reasons: Sequence[str]) -> bool:
    """Whether the conflict was on the head (the first action): another writer of this very thread."""
    return bool(reasons) and reasons[0] == "TransactionConflict"


class _RowConflict(Exception):
    """Only row conditions failed: same-base debris past the tail (see the module docstring)."""


class DynamoConversationStore:
    """``ConversationStore`` on the conversation table; commits also write the state table, atomically.

    ``page_size`` is the Query ``Limit`` for ``load_rows`` (``None``: DynamoDB's 1 MB pages)."""

    def __init__(
        self,
        client: DynamoDBClient,
        *,
        conversation_table: str,
        state_table: str,
        s3_client: S3Client | None = None,
        bucket: str | None = None,
        metrics: StoreMetrics | None = None,
        page_size: int | None = 100,
        blobs: ContentBlobs | None = None,
    ) -> None:
        self.table = conversation_table
        self.state_table = state_table
        self.metrics = metrics if metrics is not None else StoreMetrics()
        self.page_size = page_size
        self._io = DynamoIo(client, s3_client, bucket, self.metrics, blobs)
        self._heads: OrderedDict[str, DynamoItem] = OrderedDict()
        #: The fingerprint of the agent configuration the steps committed here run with (recorded on each
        #: head a commit moves; the runtime sets it once it knows its tools), or ``None``.
        self.config_fingerprint: str | None = None

    def _remember(self, thread_id: str, head: DynamoItem | None) -> None:
        """Keep ``head`` as the thread's head at its version (``None`` forgets it)."""
        self._heads.pop(thread_id, None)
        if head is not None and JOURNAL_ATTR not in head:
            self._heads[thread_id] = head
            while len(self._heads) > REMEMBERED_HEADS:
                self._heads.popitem(last=False)

    def _remembered(self, thread_id: str, version: int) -> DynamoItem | None:
        """The remembered head of ``thread_id`` if it is at ``version``. Safe to use for a commit
        conditioned on ``version``: everything a commit reads from the head (tail, epoch, generation,
        deferred set) changes only together with the version."""
        head = self._heads.get(thread_id)
        if head is None or int(head.get("version", {}).get("N", "0")) != version:
            return None
        return head

    async def open_thread(
        self,
        thread_id: str,
        *,
        message_ids: Sequence[str] = (),
        tool_call_ids: Sequence[str] = (),
        known: KnownRows | None = None,
    ) -> ThreadSnapshot:
        """What a step reads first, in one ``BatchGetItem`` and one ``Query`` page per MB of rows
        (:mod:`~stepagent.stores.dynamodb.snapshot`)."""
        return await open_thread(
            self, thread_id, message_ids=message_ids, tool_call_ids=tool_call_ids, known=known
        )

    # ---- thread records ----------------------------------------------------------------------------------

    async def get_thread(self, thread_id: str) -> ThreadInfo | None:
        item = await self._read_head(thread_id)
        return info_from_item(item) if item else None

    async def _read_head(self, thread_id: str) -> DynamoItem | None:
        """The head, after completing any journal it names (see :mod:`~stepagent.stores.dynamodb.journal`),
        so whoever reads a thread sees all of its last commit or none of it."""
        item = await self._get_head(thread_id)
        if item is not None and JOURNAL_ATTR in item:
            item = await roll_forward(self, item, HEAD_SK)
        return item

    async def _get_head(self, thread_id: str) -> DynamoItem | None:
        response = await self._io.call(
            "GetItem", self.table, TableName=self.table, Key=item_key(thread_id, HEAD_SK), ConsistentRead=True
        )
        item: DynamoItem | None = response.get("Item")
        return item or None

    async def spawn_thread(
        self,
        parent_id: str,
        *,
        child_id: str,
        spawn_tool_call_id: str,
        kind: ThreadKind,
        spawn_order: int | None = None,
    ) -> ThreadInfo:
        # One consistent BatchGetItem reads both heads: the child (idempotency) and the parent (root, tail).
        keys = [item_key(t, HEAD_SK) for t in dict.fromkeys([child_id, parent_id])]
        found = await self._io.batch_get(self.table, keys)
        heads = {info.thread_id: info for info in map(info_from_item, found)}
        if child_id in heads:
            return heads[child_id]
        parent = heads.get(parent_id) or await self._create_root(parent_id)
        child = ThreadInfo(
            thread_id=child_id,
            root_id=parent.root_id,
            parent_id=parent_id,
            spawn_order=parent.tail if spawn_order is None else spawn_order,
            spawn_tool_call_id=spawn_tool_call_id,
            kind=kind,
        )
        # The child's head and the parent's index entry for it land together, or neither does.
        head = put(self.table, head_item(child, fresh=True), "attribute_not_exists(#pk)", {"#pk": "pk"})
        entry = {**item_key(parent_id, f"{CHILD_PREFIX}{child_id}"), "seq": n_attr(insertion_seq())}
        try:
            # a cancellation is never tried again here: the head condition decides who spawned the child
            await self._io.transact(self.table, [head, put(self.table, entry)], retry_if=lambda _: False)
        except TransactionCancelled as exc:
            if exc.reasons[:1] != ["ConditionalCheckFailed"]:
                raise StoreError(
                    f"spawning thread {child_id} was cancelled: {', '.join(exc.reasons)}"
                ) from None
            return await self._existing(child_id)  # a concurrent spawn of the same child won
        return child

    async def _create_root(self, thread_id: str) -> ThreadInfo:
        """Put a root head only if the thread has none; if another writer created it first, return theirs."""
        info = ThreadInfo(thread_id=thread_id, root_id=thread_id)
        try:
            await self._io.write(
                put(self.table, head_item(info, fresh=True), "attribute_not_exists(#pk)", {"#pk": "pk"})
            )
        except ConditionFailed:
            return await self._existing(thread_id)
        return info

    async def _existing(self, thread_id: str) -> ThreadInfo:
        existing = await self.get_thread(thread_id)
        if existing is None:  # a conditional write just saw it, and nothing deletes heads
            raise StoreError(f"thread {thread_id}: head vanished while creating it")
        return existing

    async def children(self, thread_id: str) -> list[ThreadInfo]:
        # One Query for the parent's child index, then consistent BatchGetItems for the children's heads
        # (their versions, tails and closed flags change; the index entry does not).
        entries = await self._io.query_prefix(self.table, thread_id, CHILD_PREFIX)
        entries.sort(key=lambda item: (int(item["seq"]["N"]), str(item["sk"]["S"])))
        ids = [str(item["sk"]["S"])[len(CHILD_PREFIX) :] for item in entries]
        if not ids:
            return []
        # The parent's head rides along: a thread that does not exist has no children (an import writes
        # its children first and the root's head last).
        keys = [item_key(child, HEAD_SK) for child in [thread_id, *ids]]
        found = await self._io.batch_get(self.table, keys)
        heads = {info.thread_id: info for info in map(info_from_item, found)}
        if thread_id not in heads:
            return []
        missing = [child for child in ids if child not in heads]
        if missing:
            raise CorruptRowError(f"thread {thread_id}: child index lists {missing} without a head")
        return [heads[child] for child in ids]

    async def close_thread(self, thread_id: str) -> None:
        write = update(
            self.table,
            item_key(thread_id, HEAD_SK),
            "SET #closed = :t",
            {"#closed": "closed", "#pk": "pk"},
            {":t": {"BOOL": True}},
            ConditionExpression="attribute_exists(#pk)",
        )
        # Closing a thread that was never created is a no-op, as in memory (no head is conjured up).
        with contextlib.suppress(ConditionFailed):
            await self._io.write(write)

    # ---- rows ---------------------------------------------------------------------------------------------

    async def load_rows(
        self, thread_id: str, after: int = 0, up_to: int | None = None
    ) -> AsyncIterator[StoredRow]:
        head = await self._read_head(thread_id)
        if head is None:
            return
        info = info_from_item(head)
        last = info.tail if up_to is None else min(up_to, info.tail)
        async for row in self._query_rows(thread_id, head_generation(head), max(after, 0) + 1, last):
            yield row

    async def _query_rows(
        self, thread_id: str, generation: str, first: int, last: int
    ) -> AsyncIterator[StoredRow]:
        """Rows ``first..last`` of ``generation`` (committed: ``last`` is at most the tail), gap-free."""
        if first > last:
            return
        query: Request = {
            "TableName": self.table,
            "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :lo AND :hi",
            "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
            "ExpressionAttributeValues": {
                ":pk": s_attr(thread_id),
                ":lo": s_attr(row_sk(first, generation)),
                ":hi": s_attr(row_sk(last, generation)),
            },
            "ConsistentRead": True,  # the previous step may have committed a moment ago
        }
        if self.page_size is not None:
            query["Limit"] = self.page_size
        expected = first
        while True:
            # Only the current page is held: its rows are decoded and yielded one by one, then it is dropped.
            page = await self._io.call("Query", self.table, **query)
            for raw in page.get("Items", []):
                order = int(str(raw["sk"]["S"])[-12:])
                if order != expected:
                    raise CorruptRowError(f"thread {thread_id}: row {expected} is missing (found {order})")
                data = await self._io.read_payload(raw, f"thread {thread_id} row {order}")
                self.metrics.rows_read += 1
                expected += 1
                epoch = int(raw["ep"]["N"]) if "ep" in raw else 0
                yield StoredRow(
                    order, str(raw["message_id"]["S"]), decode_item(data), epoch, len(data.encode())
                )
            start = page.get("LastEvaluatedKey")
            if not start:
                break
            query["ExclusiveStartKey"] = start
        if expected != last + 1:
            raise CorruptRowError(f"thread {thread_id}: rows {expected}..{last} are missing below the tail")

    # ---- usage --------------------------------------------------------------------------------------------

    async def usage_records(self, thread_id: str, after_version: int = 0) -> AsyncIterator[UsageRecord]:
        query: Request = {
            "TableName": self.table,
            "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :lo AND :hi",
            "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
            "ExpressionAttributeValues": {
                ":pk": s_attr(thread_id),
                ":lo": s_attr(usage_sk(max(after_version, 0) + 1)),
                ":hi": s_attr(USAGE_PREFIX + "~"),  # "~" sorts after digits
            },
            "ConsistentRead": True,
        }
        if self.page_size is not None:
            query["Limit"] = self.page_size
        while True:
            page = await self._io.call("Query", self.table, **query)
            for raw in page.get("Items", []):
                yield usage_from_item(raw)
            start = page.get("LastEvaluatedKey")
            if not start:
                return
            query["ExclusiveStartKey"] = start

    # ---- commit -------------------------------------------------------------------------------------------

    async def commit(self, thread_id: str, commit: Commit) -> ThreadInfo:
        # The head this step's snapshot read (or its previous commit wrote) at the expected version is the
        # head the conditional transaction checks: no second read.
        head = self._remembered(thread_id, commit.expected_version) or await self._read_head(thread_id)
        info = info_from_item(head) if head else ThreadInfo(thread_id=thread_id, root_id=thread_id)
        generation = head_generation(head) if head else ""
        if info.version != commit.expected_version:
            raise ConcurrentWriteError(
                f"thread {thread_id} is at version {info.version}, commit expected {commit.expected_version}"
            )
        encoded = [(message_id, encode_item(item)) for item, message_id in commit.rows]
        deferred = deferred_after(head, commit)
        try:
            new = await self._commit_at(info, generation, encoded, commit, deferred)
        except _RowConflict:
            # Same-base debris past the tail: fence its writer out, then retry once above it.
            self._remember(thread_id, None)
            await self._fence(info)
            try:
                fenced = replace(info, version=info.version + 1)
                new = await self._commit_at(fenced, generation, encoded, commit, deferred)
            except _RowConflict:
                raise ConcurrentWriteError(f"thread {thread_id}: rows past the tail keep changing") from None
            return new
        except ConcurrentWriteError:
            self._remember(thread_id, None)
            raise
        self._remember(thread_id, head_after(head, new, commit, deferred) if head else None)
        return new

    def _head_update(
        self,
        info: ThreadInfo,
        new_tail: int,
        commit: Commit | None = None,
        deferred: set[str] | None = None,
    ) -> Write:
        return head_update(
            self.table,
            info,
            new_tail,
            commit,
            deferred,
            now_ms=int(time.time() * 1000),
            config=self.config_fingerprint,
        )

    def _head_check(self, info: ThreadInfo) -> Write:
        names = {"#v": "version"}
        condition = "#v = :e"
        if info.version == 0:
            names["#pk"] = "pk"
            condition = "attribute_not_exists(#pk) OR #v = :e"
        request: Request = {
            "TableName": self.table,
            "Key": item_key(info.thread_id, HEAD_SK),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": {":e": n_attr(info.version)},
        }
        return Write("ConditionCheck", request, 0)

    async def _fence(self, info: ThreadInfo) -> None:
        """Bump the version without changing the tail: any writer still working from ``info.version`` (the
        one whose debris we found) can no longer flip the head."""
        try:
            await self._io.write(self._head_update(info, info.tail))
        except ConditionFailed:
            raise ConcurrentWriteError(f"thread {info.thread_id} moved past version {info.version}") from None

    async def _row_write(
        self, info: ThreadInfo, generation: str, order: int, message_id: str, data: str
    ) -> Write:
        cv = info.version + 1
        folder = f"rows/{info.thread_id}/g{generation}" if generation else f"rows/{info.thread_id}"
        payload = await self._io.payload(data, f"{folder}/{order:012d}-{cv}")
        item = {
            **item_key(info.thread_id, row_sk(order, generation)),
            "message_id": s_attr(message_id),
            "cv": n_attr(cv),
        }
        if info.epoch:
            item["ep"] = n_attr(info.epoch)
        return put(
            self.table,
            item | payload,
            "attribute_not_exists(#sk) OR #cv <= :e",
            {"#sk": "sk", "#cv": "cv"},
            {":e": n_attr(info.version)},
            is_row=True,
        )

    async def _commit_at(
        self,
        info: ThreadInfo,
        generation: str,
        encoded: list[tuple[str, str]],
        commit: Commit,
        deferred: set[str] | None = None,
    ) -> ThreadInfo:
        thread_id = info.thread_id
        # Large rows go to S3 here, before any transaction, so a committed row never points at nothing.
        rows = [
            await self._row_write(info, generation, info.tail + index, message_id, data)
            for index, (message_id, data) in enumerate(encoded, start=1)
        ]
        others = await state_writes(
            self._io, self.state_table, thread_id, commit, info.version + 1, meta=False
        )
        # The root's metadata and spend: written with the head flip itself (an ADD must never be re-applied
        # by a journal roll-forward, which may repeat an entry).
        meta = await meta_writes(self._io, self.state_table, info.root_id, commit)
        if commit.usage is not None:
            others.append(
                put(self.table, usage_item(thread_id, commit.usage, info.version + 1, info.tail + len(rows)))
            )
        head = self._head_update(info, info.tail + len(rows), commit, deferred)
        if fits([head, *rows, *meta, *others]):
            await self._transact(thread_id, [head, *rows, *meta, *others])
        else:
            # Write-then-flip: stage rows past the tail (invisible to readers), each chunk re-checking the
            # head so staging stops as soon as another writer wins; then flip the head with everything else
            # (through a journal when that does not fit one transaction either).
            for chunk in transaction_chunks(rows, reserve=1):
                await self._transact(thread_id, [self._head_check(info), *chunk])
            await journal_flip(self, thread_id, HEAD_SK, [head, *meta], others)
        new = replace(
            info, version=info.version + 1, tail=info.tail + len(rows), turn_complete=commit.turn_complete
        )
        if commit.turn_model_calls is not None:
            new = replace(new, turn_model_calls=commit.turn_model_calls)
        new = with_pace(new, commit)
        return new

    async def _transact(self, thread_id: str, writes: list[Write]) -> None:
        """Run ``writes`` (head action first) as one transaction and classify a cancellation."""
        actions = [w.action() for w in writes]
        # A token derived from the content makes botocore's own retry of a transaction whose response was
        # lost idempotent (DynamoDB answers success for 10 minutes) instead of failing its version check.
        token = hashlib.sha256(json.dumps(actions, sort_keys=True).encode()).hexdigest()[:36]

        def row_conflict(reasons: Sequence[str]) -> bool:
            return any(
                r == "ConditionalCheckFailed" and w.is_row for w, r in zip(writes, reasons, strict=False)
            )

        def retryable(reasons: list[str]) -> bool:
            # Another thread of the same tree committing at the same moment touches the root's metadata
            # item (the conversation's spend): the head condition still guards this thread, so trying the
            # same transaction again is safe and spares the step a re-run (which would repeat its model
            # call). A conflict on the head itself is another writer of this thread: not retried.
            return (
                reasons[:1] != ["ConditionalCheckFailed"]
                and not row_conflict(reasons)
                and "TransactionConflict" in reasons
                and not _conflict_on_head(reasons)
            )

        try:
            await self._io.transact(self.table, writes, token=token, retry_if=retryable)
        except TransactionCancelled as exc:
            reasons = exc.reasons
            if reasons and reasons[0] == "ConditionalCheckFailed":
                raise ConcurrentWriteError(f"thread {thread_id}: another writer committed first") from None
            if row_conflict(reasons):
                raise _RowConflict from None
            if "TransactionConflict" in reasons:
                raise TransactionConflictError(
                    f"thread {thread_id}: a concurrent transaction touched it"
                ) from None
            raise StoreError(
                f"DynamoDB TransactWriteItems on table {self.table} for thread {thread_id} was "
                f"cancelled: {', '.join(reasons)}"
            ) from None

    # ---- inbound messages (what a client needs to tell an idle thread from one with mail on the way)

    async def note_inbound(self, thread_id: str, message_id: str) -> bool:
        """Record on ``thread_id``'s head that a message with logical id ``message_id`` is on its way to it;
        the commit that processes it takes it out again. One transaction, and a no-op (``False``) when the
        thread has no head or has already processed that id (a re-sent message), so the set only ever
        holds messages still to come."""
        writes = [
            Write(
                "ConditionCheck",
                {
                    "TableName": self.state_table,
                    "Key": item_key(thread_id, f"P#{message_id}"),
                    "ConditionExpression": "attribute_not_exists(#pk)",
                    "ExpressionAttributeNames": {"#pk": "pk"},
                },
                0,
            ),
            update(
                self.table,
                item_key(thread_id, HEAD_SK),
                "ADD #in :in",
                {"#in": INBOX_ATTRIBUTE, "#pk": "pk"},
                {":in": {"SS": [message_id]}},
                ConditionExpression="attribute_exists(#pk)",
            ),
        ]
        try:
            # a conflict is the thread's own commit touching the head at the same moment: tried again
            await self._io.transact(self.table, writes)
        except TransactionCancelled as exc:
            if "ConditionalCheckFailed" in exc.reasons:
                return False
            raise StoreError(
                f"noting inbound message {message_id} for thread {thread_id} was cancelled: "
                f"{', '.join(exc.reasons)}"
            ) from None
        return True
        return False  # unreachable: the last attempt returns or raises

    # ---- rewind and whole-history replacement (implemented in replace.py, on this store's I/O)

    async def rewind(self, thread_id: str, rewind: Rewind) -> ThreadInfo:
        return await rewind_thread(self, thread_id, rewind)

    async def stage_history(self, thread_id: str, expected_version: int) -> HistoryStaging:
        return await stage_history(self, thread_id, expected_version)

    async def sweep_generations(self, thread_id: str, *, now: float, lease_seconds: float) -> int:
        return await sweep_generations(self, thread_id, now=now, lease_seconds=lease_seconds)

    # ---- summaries ----------------------------------------------------------------------------------------

    async def save_summary(self, thread_id: str, summary: Summary) -> None:
        await save_summary(self, thread_id, summary)

    async def latest_summary(self, thread_id: str, up_to: int | None = None) -> Summary | None:
        return await latest_summary(self, thread_id, up_to)


def dynamo_stores(
    client: DynamoDBClient,
    *,
    conversation_table: str,
    state_table: str,
    s3_client: S3Client | None = None,
    bucket: str | None = None,
    metrics: StoreMetrics | None = None,
    page_size: int | None = 100,
    blobs: ContentBlobs | None = None,
) -> tuple[DynamoConversationStore, DynamoStateStore]:
    """Both stores over one client, sharing one :class:`StoreMetrics` and one
    :class:`~stepagent.blobs.ContentBlobs` (``blobs``, e.g. the queues' too; else one of their own)."""
    shared = metrics if metrics is not None else StoreMetrics()
    if blobs is None and s3_client is not None and bucket is not None:
        blobs = ContentBlobs(s3_client, bucket, shared)
    conversation = DynamoConversationStore(
        client,
        conversation_table=conversation_table,
        state_table=state_table,
        s3_client=s3_client,
        bucket=bucket,
        metrics=shared,
        page_size=page_size,
        blobs=blobs,
    )
    state = DynamoStateStore(
        client,
        state_table=state_table,
        s3_client=s3_client,
        bucket=bucket,
        metrics=shared,
        conversation_table=conversation_table,
        blobs=blobs,
    )
    return conversation, state
