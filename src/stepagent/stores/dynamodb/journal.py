"""Head flips whose other changes do not fit one DynamoDB transaction: a redo journal.

A commit (or a rewind, or a history replacement) is one conditional head update plus changes to other
items: processed/answered markers, intents, deferrals, subscriptions, indexed calls, metadata, cleanup
deletes. Their number grows with the input (1,000 released events make 3,000 of them), while a
``TransactWriteItems`` takes at most 100 actions and 4 MB. No commit may depend on fitting one.

What :func:`flip` guarantees:

- **Small changes are one transaction**, exactly as before: ``must`` (the head write first) and ``rest``
  together, when they fit.
- **Otherwise a journal.** ``rest`` is cut into transaction-sized chunks, written as ``J#{token}#{n}``
  entries in the state table under the thread (each the JSON of its actions, claim-checked to S3 when
  big, TTL'd like the markers) — invisible to every reader, harmless if the flip never happens. Then ONE
  transaction flips the head (``must``) and records ``journal`` = token and ``journal_n`` = entry count
  on it. Then each entry is applied as one transaction that also checks the head still names this
  journal, and finally the head's journal attributes are removed (conditioned the same way) and the
  entries deleted.
- **Readers never see half of it.** The store reads a head before any of its state is used (a step loads
  the thread first; commits, rewinds and replacements read the head first): a head that names a journal is
  rolled forward (:func:`roll_forward`) before it is returned. So whoever reads the thread after the flip
  sees every change of the commit, and before the flip none of them.
- **Crash-safe and idempotent.** A crash before the flip leaves the old state (entries are debris that
  expire). A crash after it leaves a journal the next reader completes. Applying is idempotent (puts and
  deletes of distinct items, no conditions), and an entry can never be applied after its journal was
  completed — its transaction's head check fails — so a slow writer cannot resurrect state that a later
  commit removed.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from stepagent.errors import ConcurrentWriteError, CorruptRowError, StoreError
from stepagent.stores.dynamodb.io import (
    ConditionFailed,
    DynamoIo,
    DynamoItem,
    Request,
    Write,
    fits,
    item_key,
    marker_item,
    n_attr,
    s_attr,
    transaction_chunks,
    update,
)

log = logging.getLogger(__name__)

JOURNAL_ATTR = "journal"
JOURNAL_COUNT_ATTR = "journal_n"
_ENTRY_PREFIX = "J#"


class JournalStore(Protocol):
    """What the journal needs from :class:`~stepagent.stores.dynamodb.conversation.DynamoConversationStore`."""

    table: str
    state_table: str
    _io: DynamoIo

    async def _transact(self, thread_id: str, writes: list[Write]) -> None: ...

    async def _get_head(self, thread_id: str) -> DynamoItem | None: ...


def _entry_sk(token: str, index: int) -> str:
    return f"{_ENTRY_PREFIX}{token}#{index:06d}"


def _head_key(thread_id: str, head_sk: str) -> DynamoItem:
    return item_key(thread_id, head_sk)


def _with_journal(head: Write, token: str, count: int) -> Write:
    """``head`` (a Put or an Update of the head item) that also records the journal on the head."""
    request = dict(head.request)
    if head.kind == "Put":
        request["Item"] = {
            **request["Item"],
            JOURNAL_ATTR: s_attr(token),
            JOURNAL_COUNT_ATTR: n_attr(count),
        }
    elif head.kind == "Update":
        expression = str(request["UpdateExpression"])
        if not expression.startswith("SET "):
            raise StoreError(f"cannot attach a journal to the head update {expression!r}")
        # The SET clause ends where the next clause (REMOVE, DELETE or ADD) begins.
        ends = [i for i in (expression.find(f" {c} ") for c in ("REMOVE", "DELETE", "ADD")) if i > 0]
        cut = min(ends, default=len(expression))
        request["UpdateExpression"] = f"{expression[:cut]}, #jt = :jt, #jn = :jn{expression[cut:]}"
        request["ExpressionAttributeNames"] = {
            **request.get("ExpressionAttributeNames", {}),
            "#jt": JOURNAL_ATTR,
            "#jn": JOURNAL_COUNT_ATTR,
        }
        request["ExpressionAttributeValues"] = {
            **request.get("ExpressionAttributeValues", {}),
            ":jt": s_attr(token),
            ":jn": n_attr(count),
        }
    else:
        raise StoreError(f"cannot attach a journal to a {head.kind} of the head")
    return Write(head.kind, request, head.size + 40)


def _encode(chunk: Sequence[Write]) -> str:
    return json.dumps([{"kind": w.kind, "request": w.request, "size": w.size} for w in chunk])


def _decode(text: str) -> list[Write]:
    return [Write(raw["kind"], raw["request"], int(raw["size"])) for raw in json.loads(text)]


async def flip(
    store: JournalStore, thread_id: str, head_sk: str, must: list[Write], rest: Sequence[Write]
) -> None:
    """Apply ``must`` (head write first) and ``rest`` atomically from a reader's point of view."""
    if fits([*must, *rest]):
        await store._transact(thread_id, [*must, *rest])
        return
    if not fits(must):
        raise StoreError(f"thread {thread_id}: the head flip alone does not fit one transaction")
    chunks = list(transaction_chunks(rest, reserve=1))
    # A fresh token per attempt: two writers from the same base never share entries, and the head names
    # exactly the entries of the flip that won.
    token = uuid.uuid4().hex[:16]
    entries: list[DynamoItem] = []
    for index, chunk in enumerate(chunks):
        sk = _entry_sk(token, index)
        payload = await store._io.payload(_encode(chunk), f"state/{thread_id}/{sk}")
        entries.append(marker_item(thread_id, sk) | payload)
    await store._io.batch_put(store.state_table, entries)
    await store._transact(thread_id, [_with_journal(must[0], token, len(chunks)), *must[1:]])
    await _apply(store, thread_id, head_sk, token, chunks)


async def roll_forward(store: JournalStore, head: DynamoItem, head_sk: str) -> DynamoItem:
    """Complete the journal ``head`` names (a writer flipped it and may have died); the head without it."""
    thread_id = str(head["pk"]["S"])
    token = str(head[JOURNAL_ATTR]["S"])
    count = int(head[JOURNAL_COUNT_ATTR]["N"])
    found = await store._io.query_prefix(store.state_table, thread_id, f"{_ENTRY_PREFIX}{token}#")
    if len(found) != count:
        # Another reader may have completed it (and deleted the entries) meanwhile.
        current = await store._get_head(thread_id)
        if current is not None and current.get(JOURNAL_ATTR) == head[JOURNAL_ATTR]:
            raise CorruptRowError(
                f"thread {thread_id}: journal {token} has {len(found)} of its {count} entries"
            )
        return current if current is not None else head
    found.sort(key=lambda item: str(item["sk"]["S"]))
    chunks = [
        _decode(await store._io.read_payload(item, f"thread {thread_id} journal entry {item['sk']['S']}"))
        for item in found
    ]
    log.info(
        "thread %s: completing journal %s (%d entries) left by an earlier writer", thread_id, token, count
    )
    await _apply(store, thread_id, head_sk, token, chunks)
    return {k: v for k, v in head.items() if k not in (JOURNAL_ATTR, JOURNAL_COUNT_ATTR)}


async def _apply(
    store: JournalStore, thread_id: str, head_sk: str, token: str, chunks: Sequence[Sequence[Write]]
) -> None:
    names = {"#jt": JOURNAL_ATTR}
    values: dict[str, Any] = {":jt": s_attr(token)}
    request: Request = {
        "TableName": store.table,
        "Key": _head_key(thread_id, head_sk),
        "ConditionExpression": "#jt = :jt",
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    check = Write("ConditionCheck", request, 0)
    for chunk in chunks:
        try:
            await store._transact(thread_id, [check, *chunk])
        except ConcurrentWriteError:
            # The head no longer names this journal: someone completed it (fine), unless a concurrent
            # applier merely collided with us, in which case the caller must not go on as if it were done.
            current = await store._get_head(thread_id)
            if current is not None and current.get(JOURNAL_ATTR) == s_attr(token):
                raise StoreError(
                    f"thread {thread_id}: journal {token} is being applied concurrently"
                ) from None
            return
    clear = update(
        store.table,
        _head_key(thread_id, head_sk),
        "REMOVE #jt, #jn",
        {"#jt": JOURNAL_ATTR, "#jn": JOURNAL_COUNT_ATTR},
        {":jt": s_attr(token)},
        ConditionExpression="#jt = :jt",
    )
    try:
        await store._io.write(clear)
    except ConditionFailed:
        return  # another reader completed it first
    keys = [item_key(thread_id, _entry_sk(token, index)) for index in range(len(chunks))]
    try:
        await store._io.batch_delete(store.state_table, keys)
    except StoreError:  # applied entries are inert (the head no longer names them) and expire by TTL
        log.warning("thread %s: could not delete applied journal %s; TTL removes it", thread_id, token)
