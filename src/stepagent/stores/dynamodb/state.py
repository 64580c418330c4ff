"""The DynamoDB :class:`~stepagent.stores.base.StateStore` and the state-table side of a commit.

What it guarantees (beyond the port's contract, which it meets exactly like the in-memory store):

- Dedup reads touch only the asked ids: one consistent ``BatchGetItem`` per 100 ids, never a thread-sized
  read. Processed/answered markers are one item each with a TTL (:data:`MARKER_TTL_S`, longer than SQS's
  14-day retention), so state stays bounded.
- Ordered sets (intents, deferred inputs, pending choices) keep their insertion order through a ``seq``
  attribute written only on first insert (``if_not_exists``), the way a dict keeps a replaced key's
  position; listing them is one Query on the sort-key prefix, sorted by ``seq``.
- With the conversation table known (:func:`~stepagent.stores.dynamodb.dynamo_stores` passes it), marking
  an intent done and adding or removing a pending choice change the item and the head's state-flag set
  (``oi`` / ``ch``, see ``layout``) in one transaction, so the head's flags stay exact; a thread
  without a head gets the plain write (and, for an addition, a ``FLAGS_UNKNOWN`` item that tells readers
  the head's flags do not cover that thread).
- :func:`state_writes` produces the commit's state actions with the in-memory semantics (later entries
  win, removals apply after additions) and at most one action per item, as a transaction requires.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepagent.blobs import ContentBlobs
from stepagent.errors import StoreError
from stepagent.messages import InputMessage, ToolCall, UserChoiceRequired
from stepagent.stores.base import Commit, DeferredInput, DispatchIntent, Spend
from stepagent.stores.dynamodb.io import (
    MARKER_TTL_S,
    PAYLOAD_ATTRIBUTES,
    ConditionFailed,
    DynamoIo,
    DynamoItem,
    TransactionCancelled,
    Write,
    delete,
    insertion_seq,
    item_key,
    marker_item,
    n_attr,
    payload_write,
    put,
    s_attr,
    update,
)
from stepagent.stores.metrics import StoreMetrics

if TYPE_CHECKING:  # the types-aiobotocore stubs: development only
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_s3 import S3Client

__all__ = ["MARKER_TTL_S", "DynamoStateStore", "state_writes"]

META_SK = "META"
#: The root's ``META`` item carries the conversation's spend next to its metadata: tokens, and dollars as
#: a whole number of picodollars (integer ``ADD`` is exact everywhere; fractional numbers drift or, on
#: some DynamoDB emulators, fail once a sum needs exponent notation).
SPEND_TOKENS_ATTRIBUTE = "sp_tokens"
SPEND_COST_ATTRIBUTE = "sp_pusd"
_PICO = 10**12
#: Present when state was added to a thread before it had a head: its head's state flags are not exact.
FLAGS_UNKNOWN_SK = "FLAGS_UNKNOWN"
COMPACTION_SK = "COMPACTION"
CACHE_SK = "CACHE"
# Intents and deferrals are ordered by commit: head versions only grow, the index orders within a commit.
_SEQ_PER_VERSION = 1_000_000


async def state_writes(
    io: DynamoIo, table: str, thread_id: str, commit: Commit, new_version: int, *, meta: bool = True
) -> list[Write]:
    """The state-table actions of ``commit``, which will produce head version ``new_version`` (without its
    metadata write when ``meta`` is false: the caller writes the root's ``META`` with :func:`meta_writes`)."""
    writes = [
        put(table, marker_item(thread_id, f"P#{m}")) for m in dict.fromkeys(commit.processed_message_ids)
    ]
    writes += [
        put(table, marker_item(thread_id, f"A#{c}")) for c in dict.fromkeys(commit.answered_tool_calls)
    ]
    seq = new_version * _SEQ_PER_VERSION
    intents = {intent.tool_call_id: intent for intent in commit.intents_added}
    for index, intent in enumerate(intents.values()):
        sk = f"I#{intent.tool_call_id}"
        writes.append(await payload_write(io, table, thread_id, sk, _intent_json(intent), seq + index))
    removed_subscriptions = set(commit.subscriptions_removed)
    for tool_call_id in dict.fromkeys(commit.subscriptions_added):
        if tool_call_id not in removed_subscriptions:
            writes.append(put(table, item_key(thread_id, f"SUB#{tool_call_id}")))
    for tool_call_id in dict.fromkeys(commit.subscriptions_removed):
        writes.append(delete(table, item_key(thread_id, f"SUB#{tool_call_id}")))
    removed_deferred = set(commit.deferred_removed)
    deferred = {d.message_id: d for d in commit.deferred_added if d.message_id not in removed_deferred}
    for index, item in enumerate(deferred.values()):
        sk = f"D#{item.message_id}"
        writes.append(await payload_write(io, table, thread_id, sk, _deferred_json(item), seq + index))
    for message_id in dict.fromkeys(commit.deferred_removed):
        writes.append(delete(table, item_key(thread_id, f"D#{message_id}")))
    for call in {call.id: call for call in commit.indexed_calls}.values():
        payload = await io.payload(call.model_dump_json(), f"state/{thread_id}/CALL#{call.id}")
        writes.append(put(table, {**item_key(thread_id, f"CALL#{call.id}"), **payload}))
    if meta and commit.metadata is not None:
        root_id, value = commit.metadata
        writes.append(await _metadata_write(io, table, root_id, value))
    return writes


async def _metadata_write(io: DynamoIo, table: str, root_id: str, value: Any) -> Write:
    # An upsert of the payload attributes only: the item also holds the conversation's spend.
    return await payload_write(io, table, root_id, META_SK, json.dumps(value), None)


async def meta_writes(io: DynamoIo, table: str, root_id: str, commit: Commit) -> list[Write]:
    """The ``META`` writes of a commit of a thread under ``root_id``: its metadata change and the spend of
    its usage record (``ADD``, so concurrent commits of the tree's threads all count), as ONE update when
    both concern the root (a transaction may touch an item only once)."""
    writes: list[Write] = []
    metadata = commit.metadata
    if metadata is not None and metadata[0] != root_id:
        writes.append(await _metadata_write(io, table, metadata[0], metadata[1]))
        metadata = None
    usage = commit.usage
    if usage is None:
        if metadata is not None:
            writes.append(await _metadata_write(io, table, root_id, metadata[1]))
        return writes
    names = {"#st": SPEND_TOKENS_ATTRIBUTE, "#sc": SPEND_COST_ATTRIBUTE}
    values: DynamoItem = {":st": n_attr(usage.tokens), ":sc": n_attr(round((usage.cost_usd or 0.0) * _PICO))}
    expression = "ADD #st :st, #sc :sc"
    if metadata is not None:
        base = await _metadata_write(io, table, root_id, metadata[1])
        names |= base.request["ExpressionAttributeNames"]
        values |= base.request["ExpressionAttributeValues"]
        expression = f"{base.request['UpdateExpression']} {expression}"
    writes.append(update(table, item_key(root_id, META_SK), expression, names, values))
    return writes


def spend_from_item(item: DynamoItem | None) -> Spend:
    """The conversation spend a root's ``META`` item holds (none: nothing spent yet)."""
    if not item:
        return Spend()
    tokens = int(item[SPEND_TOKENS_ATTRIBUTE]["N"]) if SPEND_TOKENS_ATTRIBUTE in item else 0
    cost = int(item[SPEND_COST_ATTRIBUTE]["N"]) / _PICO if SPEND_COST_ATTRIBUTE in item else 0.0
    return Spend(tokens, cost)


def has_metadata(item: DynamoItem | None) -> bool:
    """Whether a ``META`` item holds metadata (it may hold only the spend)."""
    return item is not None and any(name in item for name in PAYLOAD_ATTRIBUTES)


def _intent_json(intent: DispatchIntent) -> str:
    raw: dict[str, Any] = {
        "tool_call_id": intent.tool_call_id,
        "tool_name": intent.tool_name,
        "arguments": intent.arguments,
        "call_id": intent.call_id,
    }
    if intent.resume is not None:
        raw["resume"] = intent.resume
    return json.dumps(raw)


def _deferred_json(deferred: DeferredInput) -> str:
    return json.dumps(
        {"message_id": deferred.message_id, "message": deferred.message.model_dump(mode="json")}
    )


class DynamoStateStore:
    """``StateStore`` on the state table. Commit-time changes are written by
    :meth:`~stepagent.stores.dynamodb.conversation.DynamoConversationStore.commit` in the same transaction as the rows."""

    def __init__(
        self,
        client: DynamoDBClient,
        *,
        state_table: str,
        s3_client: S3Client | None = None,
        bucket: str | None = None,
        metrics: StoreMetrics | None = None,
        conversation_table: str | None = None,
        blobs: ContentBlobs | None = None,
    ) -> None:
        self.table = state_table
        self.conversation_table = conversation_table
        self.metrics = metrics if metrics is not None else StoreMetrics()
        self._io = DynamoIo(client, s3_client, bucket, self.metrics, blobs)

    async def _with_head_flag(
        self, write: Write, thread_id: str, attribute: str, op: str, value: str
    ) -> None:
        """``write`` and ``{op} {attribute} {value}`` on the thread's head (``ADD`` / ``DELETE`` of a
        string-set member) in one transaction; only ``write`` when the head does not exist or the
        conversation table is unknown."""
        if self.conversation_table is None:
            await self._io.write(write)
            return
        flag = update(
            self.conversation_table,
            item_key(thread_id, "HEAD"),
            f"{op} #f :f",
            {"#f": attribute, "#pk": "pk"},
            {":f": {"SS": [value]}},
            ConditionExpression="attribute_exists(#pk)",
        )
        try:
            # a conflict is the thread's own commit touching the head at the same moment: tried again
            await self._io.transact(self.table, [flag, write])
        except TransactionCancelled as exc:
            if exc.reasons[:1] != ["ConditionalCheckFailed"]:
                raise StoreError(
                    f"updating {attribute} of thread {thread_id} was cancelled: {', '.join(exc.reasons)}"
                ) from None
        else:
            return
        await self._io.write(write)  # no head: nothing to flag
        if op == "ADD":
            # State for a thread without a head (a choice before its first commit): the head its first
            # commit creates would claim to know this thread's state. The marker tells readers it does not.
            await self._io.write(put(self.table, item_key(thread_id, FLAGS_UNKNOWN_SK)))

    async def _present(self, thread_id: str, prefix: str, ids: Sequence[str]) -> set[str]:
        unique = list(dict.fromkeys(ids))  # BatchGetItem rejects duplicate keys
        if not unique:
            return set()
        keys = [item_key(thread_id, prefix + i) for i in unique]
        found = await self._io.batch_get(self.table, keys, keys_only=True)
        return {str(item["sk"]["S"])[len(prefix) :] for item in found}

    async def filter_processed(self, thread_id: str, message_ids: Sequence[str]) -> set[str]:
        return await self._present(thread_id, "P#", message_ids)

    async def filter_answered(self, thread_id: str, tool_call_ids: Sequence[str]) -> set[str]:
        return await self._present(thread_id, "A#", tool_call_ids)

    async def mark_processed(self, thread_id: str, message_ids: Sequence[str]) -> None:
        items = [marker_item(thread_id, f"P#{m}") for m in dict.fromkeys(message_ids)]
        await self._io.batch_put(self.table, items)

    async def get_metadata(self, root_id: str) -> Any:
        response = await self._io.call(
            "GetItem", self.table, TableName=self.table, Key=item_key(root_id, META_SK), ConsistentRead=True
        )
        item: DynamoItem | None = response.get("Item")
        if item is None or not has_metadata(item):
            return None
        return json.loads(await self._io.read_payload(item, f"metadata of {root_id}"))

    async def spend(self, root_id: str) -> Spend:
        response = await self._io.call(
            "GetItem", self.table, TableName=self.table, Key=item_key(root_id, META_SK), ConsistentRead=True
        )
        return spend_from_item(response.get("Item"))

    async def set_metadata(self, root_id: str, metadata: Any) -> None:
        await self._io.write(await _metadata_write(self._io, self.table, root_id, metadata))

    async def active_subscriptions(self, thread_id: str) -> set[str]:
        items = await self._io.query_prefix(self.table, thread_id, "SUB#")
        return {str(item["sk"]["S"])[len("SUB#") :] for item in items}

    async def add_subscription(self, thread_id: str, tool_call_id: str) -> None:
        await self._io.write(put(self.table, item_key(thread_id, f"SUB#{tool_call_id}")))

    async def remove_subscription(self, thread_id: str, tool_call_id: str) -> None:
        await self._io.write(delete(self.table, item_key(thread_id, f"SUB#{tool_call_id}")))

    async def _ordered_payloads(self, thread_id: str, prefix: str) -> list[str]:
        items = await self._io.query_prefix(self.table, thread_id, prefix)
        items.sort(key=lambda item: (int(item["seq"]["N"]), str(item["sk"]["S"])))
        return [await self._io.read_payload(item, f"thread {thread_id} {item['sk']['S']}") for item in items]

    async def pending_choices(self, thread_id: str) -> list[UserChoiceRequired]:
        payloads = await self._ordered_payloads(thread_id, "CHOICE#")
        return [UserChoiceRequired.model_validate_json(payload) for payload in payloads]

    async def add_pending_choice(self, thread_id: str, choice: UserChoiceRequired) -> None:
        sk = f"CHOICE#{choice.id}"
        write = await payload_write(
            self._io, self.table, thread_id, sk, choice.model_dump_json(), insertion_seq()
        )
        await self._with_head_flag(write, thread_id, "ch", "ADD", choice.id)

    async def remove_pending_choice(self, thread_id: str, choice_id: str) -> None:
        write = delete(self.table, item_key(thread_id, f"CHOICE#{choice_id}"))
        await self._with_head_flag(write, thread_id, "ch", "DELETE", choice_id)

    async def open_intents(self, thread_id: str) -> list[DispatchIntent]:
        intents = []
        for payload in await self._ordered_payloads(thread_id, "I#"):
            raw = json.loads(payload)
            intents.append(
                DispatchIntent(
                    tool_call_id=raw["tool_call_id"],
                    tool_name=raw["tool_name"],
                    arguments=raw["arguments"],
                    call_id=raw.get("call_id"),
                    resume=raw.get("resume") if isinstance(raw.get("resume"), dict) else None,
                )
            )
        return intents

    async def mark_intent_done(self, thread_id: str, tool_call_id: str) -> None:
        write = delete(self.table, item_key(thread_id, f"I#{tool_call_id}"))
        await self._with_head_flag(write, thread_id, "oi", "DELETE", tool_call_id)

    async def deferred_inputs(self, thread_id: str) -> list[DeferredInput]:
        deferred = []
        for payload in await self._ordered_payloads(thread_id, "D#"):
            raw = json.loads(payload)
            message = InputMessage.model_validate(raw["message"])
            deferred.append(DeferredInput(message_id=raw["message_id"], message=message))
        return deferred

    async def indexed_call(self, thread_id: str, tool_call_id: str) -> ToolCall | None:
        response = await self._io.call(
            "GetItem",
            self.table,
            TableName=self.table,
            Key=item_key(thread_id, f"CALL#{tool_call_id}"),
            ConsistentRead=True,
        )
        item = response.get("Item")
        if not item:
            return None
        return ToolCall.model_validate_json(await self._io.read_payload(item, f"indexed call {tool_call_id}"))

    async def claim_compaction(self, thread_id: str, claim_id: str, now: float, lease_seconds: float) -> bool:
        # One conditional write decides the race: free, ours already, or the holder's lease has run out.
        # ``lease_expires`` is deliberately not the TTL attribute: ``now`` is the caller's clock.
        write = update(
            self.table,
            item_key(thread_id, COMPACTION_SK),
            "SET #claim = :claim, #expires = :expires",
            {"#pk": "pk", "#claim": "claim_id", "#expires": "lease_expires"},
            {
                ":claim": s_attr(claim_id),
                ":expires": {"N": repr(now + lease_seconds)},
                ":now": {"N": repr(now)},
            },
            ConditionExpression="attribute_not_exists(#pk) OR #claim = :claim OR #expires <= :now",
        )
        try:
            await self._io.write(write)
        except ConditionFailed:
            return False
        return True

    async def release_compaction(self, thread_id: str) -> None:
        await self._io.write(delete(self.table, item_key(thread_id, COMPACTION_SK)))

    async def cache_get(self, key: str) -> str | None:
        response = await self._io.call(
            "GetItem",
            self.table,
            TableName=self.table,
            Key=item_key(f"cache#{key}", CACHE_SK),
            ConsistentRead=True,
        )
        item = response.get("Item")
        # DynamoDB deletes expired items lazily (up to days later), so expiry is checked on read too.
        if not item or float(item["expires_at"]["N"]) <= time.time():
            return None
        return await self._io.read_payload(item, f"cache entry {key}")

    async def cache_put(self, key: str, value: str, expires_at: float) -> None:
        pk = f"cache#{key}"
        payload = await self._io.payload(value, f"state/{pk}/{CACHE_SK}")
        item: DynamoItem = {**item_key(pk, CACHE_SK), **payload, "expires_at": {"N": str(int(expires_at))}}
        await self._io.write(put(self.table, item))
