"""DynamoDB-specific store behaviour on the moto server (the shared behaviour is in tests/contract).

Covers what the in-memory store cannot show: the S3 claim check for big rows, the write-then-flip path
for commits over the transaction limits (including a crash in the middle of it), fencing of same-base
debris, a real race between two store instances, I/O cost that does not grow with history length,
paginated reads of exactly the asked range, batch chunking, error mapping and table provisioning.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from botocore.config import Config

from stepagent.aws.clients import open_client
from stepagent.aws.resources import STATE_TTL_ATTRIBUTE, ensure_tables
from stepagent.backoff import Backoff
from stepagent.client.watch import StoreReader
from stepagent.errors import (
    ConcurrentWriteError,
    ConfigurationError,
    CorruptRowError,
    PayloadTooLargeError,
    StoreError,
)
from stepagent.history_items import (
    AssistantText,
    HistoryItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    encode_item,
)
from stepagent.messages import InputMessage, TextBlock, TextContent, ToolCall, ToolResult
from stepagent.stores.base import Commit, DeferredInput, DispatchIntent, ThreadInfo, ThreadKind
from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore
from stepagent.stores.dynamodb import io as dynamodb_io
from stepagent.stores.dynamodb.io import (
    INLINE_LIMIT,
    MARKER_TTL_S,
    DynamoIo,
    TransactionCancelled,
    item_key,
    put,
)
from stepagent.stores.metrics import StoreMetrics
from tests.conftest import DynamoEnv, aws_client, aws_session, unique_name

pytestmark = pytest.mark.asyncio


def uid(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def rows(prefix: str, n: int) -> list[tuple[HistoryItem, str]]:
    return [(user(f"{prefix} {i}"), f"{prefix}-m{i}") for i in range(n)]


async def texts(store: DynamoConversationStore, thread: str, **kwargs: Any) -> list[str]:
    out = []
    async for row in store.load_rows(thread, **kwargs):
        assert isinstance(row.item, UserItem)
        out.append(row.item.text or "")
    return out


async def raw_rows(env: DynamoEnv, thread: str) -> dict[int, dict[str, Any]]:
    """Every ``R#`` item of ``thread``, including invisible ones past the tail."""
    response = await env.client.query(
        TableName=env.conversation_table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :r)",
        ExpressionAttributeValues={":pk": {"S": thread}, ":r": {"S": "R#"}},
        ConsistentRead=True,
    )
    assert "LastEvaluatedKey" not in response
    return {int(item["sk"]["S"][2:]): item for item in response["Items"]}


async def seed(store: DynamoConversationStore, thread: str, n: int, batch: int = 99) -> ThreadInfo:
    """A thread with ``n`` committed rows (commits of ``batch`` rows)."""
    info = ThreadInfo(thread_id=thread, root_id=thread)
    done = 0
    while done < n:
        take = min(batch, n - done)
        info = await store.commit(thread, Commit(info.version, rows=rows(f"seed{done}", take)))
        done += take
    return info


async def seed_raw(env: DynamoEnv, thread: str, n: int) -> ThreadInfo:
    """A thread with ``n`` rows committed at version 1, written in the store's layout with BatchWriteItem.

    Only for big histories: moto deep-copies a table once per transaction action, so seeding 1,000 rows
    through commits is quadratic on moto (not on DynamoDB)."""
    items: list[dict[str, Any]] = [
        {
            "pk": {"S": thread},
            "sk": {"S": f"R#{order:012d}"},
            "message_id": {"S": f"seed-m{order}"},
            "cv": {"N": "1"},
            "body": {"S": encode_item(user(f"seed {order}"))},
        }
        for order in range(1, n + 1)
    ]
    items.append(
        {
            "pk": {"S": thread},
            "sk": {"S": "HEAD"},
            "root_id": {"S": thread},
            "kind": {"S": "root"},
            "closed": {"BOOL": False},
            "version": {"N": "1"},
            "tail": {"N": str(n)},
        }
    )
    for start in range(0, len(items), 25):
        chunk = items[start : start + 25]
        await env.client.batch_write_item(
            RequestItems={env.conversation_table: [{"PutRequest": {"Item": item}} for item in chunk]}
        )
    return ThreadInfo(thread_id=thread, root_id=thread, version=1, tail=n)


class InjectedCrash(Exception):
    """Stands for the process dying: not an AWS error, so the store does not handle it."""


class ClientProxy:
    """Forwards to a real client, except the methods given in ``overrides``."""

    def __init__(self, inner: Any, **overrides: Callable[..., Awaitable[Any]]) -> None:
        self._inner = inner
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        return self._overrides.get(name) or getattr(self._inner, name)


def crash_after_transactions(inner: Any, allowed: int) -> ClientProxy:
    calls = 0

    async def transact_write_items(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > allowed:
            raise InjectedCrash(f"crash before transaction {calls}")
        return await inner.transact_write_items(**kwargs)

    return ClientProxy(inner, transact_write_items=transact_write_items)


# ---- claim check ----------------------------------------------------------------------------------------


async def test_five_megabyte_tool_result_round_trips_through_s3(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    thread = uid()
    big = "x" * 5_000_000 + " end ünïcode"
    call = ToolCall(id="call-1", name="fetch", arguments={})
    result = ToolResult(id="call-1", content=[TextBlock(text=big)])
    info = await conversation.commit(
        thread,
        Commit(
            0,
            rows=[(ToolCallItem(call), "m1"), (ToolResultItem(result), "m2")],
            answered_tool_calls=["call-1"],
        ),
    )
    assert info.tail == 2

    loaded = [row async for row in conversation.load_rows(thread)]
    assert loaded[1].item == ToolResultItem(result)
    assert dynamo.metrics.calls["s3:PutObject"] == 1 and "s3:GetObject" not in dynamo.metrics.calls  # cached
    stored = await raw_rows(dynamo, thread)
    assert "body" in stored[1] and "blob" not in stored[1] and "texts" not in stored[1]
    # The row keeps its skeleton inline and names the text's content-addressed object.
    [ref] = json.loads(stored[2]["texts"]["S"])
    assert ref["key"] == f"blobs/sha256/{hashlib.sha256(big.encode()).hexdigest()}"
    assert "blob" not in stored[2] and len(stored[2]["body"]["S"]) < 1_000
    obj = await dynamo.s3.head_object(Bucket=dynamo.bucket, Key=ref["key"])
    assert obj["ContentLength"] == len(big.encode())
    cold, _ = dynamo.stores()  # another process: one read of the object
    assert [row.item async for row in cold.load_rows(thread)][1] == ToolResultItem(result)
    assert dynamo.metrics.calls["s3:GetObject"] == 1


async def test_a_swapped_or_missing_shared_text_fails_the_read_as_before(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    thread = uid()
    big = f"{thread} " + "c" * 400_000  # unique: the bucket is shared with other tests
    await conversation.commit(thread, Commit(0, rows=[(user(big), "m1")]))
    key = f"blobs/sha256/{hashlib.sha256(big.encode()).hexdigest()}"
    await dynamo.s3.put_object(Bucket=dynamo.bucket, Key=key, Body=big[:-1].encode())
    cold, _ = dynamo.stores()
    with pytest.raises(CorruptRowError, match="does not match its sha256"):
        [row async for row in cold.load_rows(thread)]
    await dynamo.s3.delete_object(Bucket=dynamo.bucket, Key=key)
    cold, _ = dynamo.stores()
    with pytest.raises(StoreError, match="does not exist"):
        [row async for row in cold.load_rows(thread)]


async def test_a_big_payload_that_is_not_canonical_json_comes_back_byte_for_byte(dynamo: DynamoEnv) -> None:
    _, state = dynamo.stores()
    spaced = json.dumps({"note": "n" * 400_000, "escaped": "\u00e9"})  # spaces and \u escapes
    key = f"k-{uid()}"
    await state.cache_put(key, spaced, time.time() + 60)
    _, cold = dynamo.stores()
    assert await cold.cache_get(key) == spaced  # a whole-payload object, not a reassembled document
    raw = await dynamo.client.get_item(
        TableName=dynamo.state_table, Key={"pk": {"S": f"cache#{key}"}, "sk": {"S": "CACHE"}}
    )
    assert "blob" in raw["Item"] and "texts" not in raw["Item"]


async def test_large_row_without_bucket_is_rejected_and_writes_nothing(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores(with_blobs=False)
    thread = uid()
    with pytest.raises(PayloadTooLargeError, match="no blob bucket"):
        await conversation.commit(thread, Commit(0, rows=[(user("y" * (INLINE_LIMIT + 1)), "m1")]))
    assert await conversation.get_thread(thread) is None
    assert await raw_rows(dynamo, thread) == {}


async def test_large_deferred_input_round_trips_through_s3(dynamo: DynamoEnv) -> None:
    conversation, state = dynamo.stores()
    thread = uid()
    message = InputMessage(
        content=ToolResult(id="sub-1", content=[TextBlock(text="e" * 400_000)]),
        group_id=thread,
        synthetic={"type": "subscription_event", "tool_call_id": "sub-1"},
    )
    deferred = DeferredInput(message_id="ev-1", message=message)
    await conversation.commit(thread, Commit(0, deferred_added=[deferred]))
    assert await state.deferred_inputs(thread) == [deferred]
    assert dynamo.metrics.calls["s3:PutObject"] == 1


# ---- write-then-flip -------------------------------------------------------------------------------------


async def test_commit_over_transaction_limits_writes_then_flips(dynamo: DynamoEnv) -> None:
    conversation, state = dynamo.stores()
    thread = uid()
    await conversation.commit(thread, Commit(0, rows=rows("first", 2)))
    dynamo.metrics.reset()

    info = await conversation.commit(
        thread,
        Commit(
            1,
            rows=rows("big", 300),
            processed_message_ids=["in-1"],
            intents_added=[DispatchIntent("c1", "tool", {"a": 1})],
        ),
    )
    assert (info.version, info.tail) == (2, 302)
    # 300 rows: four staging transactions (99 + 99 + 99 + 3 rows, each with a head check) and one flip.
    assert dynamo.metrics.calls == {"GetItem": 1, "TransactWriteItems": 5}
    assert await texts(conversation, thread) == [f"first {i}" for i in range(2)] + [
        f"big {i}" for i in range(300)
    ]
    assert await state.filter_processed(thread, ["in-1"]) == {"in-1"}
    assert [i.tool_call_id for i in await state.open_intents(thread)] == ["c1"]


async def test_crash_while_staging_leaves_old_history_and_next_commit_overwrites_debris(
    dynamo: DynamoEnv,
) -> None:
    thread = uid()
    healthy, _ = dynamo.stores()
    await healthy.commit(thread, Commit(0, rows=rows("old", 2)))

    # The writer dies after its first staging transaction: rows 3..101 exist, past the tail.
    crashing, _ = dynamo.stores(client=crash_after_transactions(dynamo.client, allowed=1))
    with pytest.raises(InjectedCrash):
        await crashing.commit(thread, Commit(1, rows=rows("lost", 300), processed_message_ids=["in-lost"]))
    debris = await raw_rows(dynamo, thread)
    assert sorted(debris) == list(range(1, 102)) and debris[3]["cv"]["N"] == "2"

    # A fresh reader sees exactly the old history; nothing of the aborted commit is visible.
    fresh, fresh_state = dynamo.stores()
    assert await fresh.get_thread(thread) == ThreadInfo(thread_id=thread, root_id=thread, version=1, tail=2)
    assert await texts(fresh, thread) == ["old 0", "old 1"]
    assert await fresh_state.filter_processed(thread, ["in-lost"]) == set()

    # The next commit from the same base meets same-base debris: it fences (version 2) and commits (3).
    dynamo.metrics.reset()
    info = await fresh.commit(thread, Commit(1, rows=rows("new", 5)))
    assert (info.version, info.tail) == (3, 7)
    assert dynamo.metrics.calls == {"GetItem": 1, "TransactWriteItems": 2, "UpdateItem": 1}
    assert await texts(fresh, thread) == ["old 0", "old 1"] + [f"new {i}" for i in range(5)]
    after = await raw_rows(dynamo, thread)
    assert {after[o]["cv"]["N"] for o in range(3, 8)} == {"3"}

    # Remaining debris (8..101) is older than the head now and is overwritten without another fence.
    dynamo.metrics.reset()
    info = await fresh.commit(thread, Commit(3, rows=rows("more", 2)))
    assert (info.version, info.tail) == (4, 9)
    assert dynamo.metrics.calls == {"GetItem": 1, "TransactWriteItems": 1}
    assert (await texts(fresh, thread))[-2:] == ["more 0", "more 1"]


async def test_crash_before_the_flip_leaves_nothing_visible(dynamo: DynamoEnv) -> None:
    thread = uid()
    crashing, _ = dynamo.stores(client=crash_after_transactions(dynamo.client, allowed=4))
    with pytest.raises(InjectedCrash):  # all four staging transactions ran; the flip did not
        await crashing.commit(thread, Commit(0, rows=rows("lost", 300)))
    assert len(await raw_rows(dynamo, thread)) == 300
    fresh, _ = dynamo.stores()
    assert await fresh.get_thread(thread) is None
    assert await texts(fresh, thread) == []
    info = await fresh.commit(thread, Commit(0, rows=rows("kept", 1)))
    assert (info.version, info.tail) == (2, 1)  # fenced over the debris of the crashed first commit
    assert await texts(fresh, thread) == ["kept 0"]


# ---- fencing and races -----------------------------------------------------------------------------------


async def put_debris(env: DynamoEnv, thread: str, order: int, cv: int) -> None:
    await env.client.put_item(
        TableName=env.conversation_table,
        Item={
            "pk": {"S": thread},
            "sk": {"S": f"R#{order:012d}"},
            "message_id": {"S": "debris"},
            "cv": {"N": str(cv)},
            "body": {"S": '{"v":1,"kind":"assistant","content":{"text":"debris"}}'},
        },
    )


async def test_stale_debris_is_overwritten_without_fencing(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    thread = uid()
    await seed(conversation, thread, 3)  # version 1, tail 3
    await put_debris(dynamo, thread, 4, cv=1)  # from a writer whose base was older than the head
    dynamo.metrics.reset()
    info = await conversation.commit(thread, Commit(1, rows=rows("r", 1)))
    assert info.version == 2 and "UpdateItem" not in dynamo.metrics.calls
    assert (await texts(conversation, thread))[-1] == "r 0"


async def test_same_base_debris_fences_out_the_other_writer(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    thread = uid()
    await seed(conversation, thread, 3)  # version 1, tail 3
    # Another writer from the same base (version 1) has staged row 4 and is about to flip the head.
    await put_debris(dynamo, thread, 4, cv=2)
    info = await conversation.commit(thread, Commit(1, rows=rows("r", 2)))
    assert (info.version, info.tail) == (3, 5)
    assert dynamo.metrics.calls["UpdateItem"] == 1
    assert (await texts(conversation, thread))[-2:] == ["r 0", "r 1"]
    # That other writer's flip (conditioned on version 1) can no longer succeed.
    other, _ = dynamo.stores()
    with pytest.raises(ConcurrentWriteError):
        await other.commit(thread, Commit(1, rows=rows("late", 1)))


async def test_interleaved_write_then_flip_writers_never_mix_rows(dynamo: DynamoEnv) -> None:
    """Two same-base writers staging over the same orders: the second meets the first's rows (row
    condition), fences it out and commits; the first can then neither overwrite rows nor flip the head."""
    thread = uid()
    store, _ = dynamo.stores()
    await seed(store, thread, 1)  # version 1, tail 1
    staged_once = asyncio.Event()
    release = asyncio.Event()
    seen = 0

    async def slow_transact(**kwargs: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen == 2:  # between the slow writer's first and second staging transaction
            staged_once.set()
            await release.wait()
        return await dynamo.client.transact_write_items(**kwargs)

    slow, _ = dynamo.stores(client=ClientProxy(dynamo.client, transact_write_items=slow_transact))
    slow_commit = asyncio.create_task(slow.commit(thread, Commit(1, rows=rows("slow", 300))))
    await staged_once.wait()
    fast = await store.commit(thread, Commit(1, rows=rows("fast", 120)))  # fences, then stages + flips
    release.set()
    with pytest.raises(ConcurrentWriteError):
        await slow_commit
    assert (fast.version, fast.tail) == (3, 121)
    assert await texts(store, thread) == ["seed0 0"] + [f"fast {i}" for i in range(120)]


class HoldsTransactions:
    """A DynamoDB client proxy whose first ``TransactWriteItems`` waits until ``go`` is set.

    Two writers that both read the head at the same version are raced deterministically: the held writer
    has already read the head when the other one commits. (Truly simultaneous requests are not usable on
    moto: a cancelled transaction restores a table snapshot, which can undo the other writer's commit —
    real DynamoDB isolates transactions.)"""

    def __init__(self, inner: Any, go: asyncio.Event) -> None:
        self._inner, self._go = inner, go

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def transact_write_items(self, **kwargs: Any) -> Any:
        await self._go.wait()
        return await self._inner.transact_write_items(**kwargs)


async def _racing_commit(
    store: Any, thread: str, version: int, prefix: str, size: int, go: asyncio.Event
) -> ThreadInfo | BaseException:
    try:
        return await store.commit(  # type: ignore[no-any-return]
            thread, Commit(version, rows=rows(prefix, size), processed_message_ids=[f"in-{prefix}"])
        )
    except ConcurrentWriteError as error:
        return error
    finally:
        go.set()  # the first writer is done (won or lost): release the held one


async def test_two_writers_at_the_same_version_exactly_one_wins(dynamo: DynamoEnv) -> None:
    for size_a, size_b, a_first in [
        (2, 3, True),
        (1, 1, False),
        (150, 2, True),
        (150, 2, False),
        (2, 150, True),
    ]:
        thread = uid()
        seeding, _ = dynamo.stores()
        base = await seed(seeding, thread, 2)
        go = asyncio.Event()
        held = dynamo.stores(client=HoldsTransactions(dynamo.client, go))[0]
        free = dynamo.stores()[0]
        a, b = (free, held) if a_first else (held, free)

        results = await asyncio.gather(
            _racing_commit(a, thread, base.version, "A", size_a, go),
            _racing_commit(b, thread, base.version, "B", size_b, go),
        )
        winners = [r for r in results if isinstance(r, ThreadInfo)]
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(winners) == 1 and len(losers) == 1, results
        assert isinstance(losers[0], ConcurrentWriteError)
        won_a = isinstance(results[0], ThreadInfo)
        assert won_a == a_first  # the writer that reached DynamoDB first wins; the held one must lose
        prefix, size = ("A", size_a) if won_a else ("B", size_b)
        history = await texts(seeding, thread)
        assert history == ["seed0 0", "seed0 1"] + [f"{prefix} {i}" for i in range(size)]
        _, state = dynamo.stores()
        assert await state.filter_processed(thread, ["in-A", "in-B"]) == {"in-A" if won_a else "in-B"}


# ---- cost ------------------------------------------------------------------------------------------------


def step_commit(version: int) -> Commit:
    call = ToolCall(id="call-x", name="search", arguments={"q": "weather"})
    return Commit(
        version,
        rows=[
            (user("what is the weather"), "msg-0001"),
            (ToolCallItem(call), "msg-0001"),
            (AssistantText("ok"), "x"),
        ],
        processed_message_ids=["msg-0001"],
        intents_added=[DispatchIntent("call-x", "search", {"q": "weather"})],
    )


async def test_commit_cost_does_not_grow_with_history_length(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    measured: list[StoreMetrics] = []
    for prior in (10, 1000):
        thread = f"cost-{prior:05d}-{uuid.uuid4().hex[:8]}"  # same id length for both threads
        info = await seed_raw(dynamo, thread, prior)
        assert await conversation.get_thread(thread) == info
        dynamo.metrics.reset()
        await conversation.commit(thread, step_commit(info.version))
        measured.append(dynamo.metrics.snapshot())
    short, long = measured
    assert short.calls == long.calls == {"GetItem": 1, "TransactWriteItems": 1}
    assert short.items_written == long.items_written == 6  # head + 3 rows + processed marker + intent
    assert short.bytes_written == long.bytes_written > 0


async def test_load_rows_pages_through_exactly_the_asked_range(dynamo: DynamoEnv) -> None:
    thread = uid()
    await seed_raw(dynamo, thread, 1000)
    metrics = StoreMetrics()
    conversation, _ = dynamo.stores(metrics=metrics, page_size=50)

    orders = [row.order async for row in conversation.load_rows(thread, after=100, up_to=300)]
    assert orders == list(range(101, 301))
    assert metrics.rows_read == 200
    assert 4 <= metrics.calls["Query"] <= 5  # 200 rows / 50; one empty page if the last one ended full
    assert metrics.calls["GetItem"] == 1  # the head, for the tail

    metrics.reset()
    rows_iter = conversation.load_rows(thread)
    first = await anext(rows_iter)
    assert first.order == 1 and metrics.calls["Query"] == 1  # lazy: one page fetched, not the history
    count = 1 + len([row async for row in rows_iter])
    assert count == 1000 and metrics.rows_read == 1000
    assert 20 <= metrics.calls["Query"] <= 21

    metrics.reset()
    assert [row.order async for row in conversation.load_rows(thread, after=998, up_to=5000)] == [999, 1000]
    assert metrics.calls == {"GetItem": 1, "Query": 1}


async def test_load_rows_refuses_a_gap_below_the_tail(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    thread = uid()
    await seed(conversation, thread, 3)
    await dynamo.client.delete_item(
        TableName=dynamo.conversation_table, Key={"pk": {"S": thread}, "sk": {"S": f"R#{2:012d}"}}
    )
    with pytest.raises(Exception, match="row 2 is missing"):
        await texts(conversation, thread)


# ---- state store batching --------------------------------------------------------------------------------


async def test_processed_markers_are_chunked_and_ttld(dynamo: DynamoEnv) -> None:
    _, state = dynamo.stores()
    thread = uid()
    ids = [f"m{i}" for i in range(260)]
    await state.mark_processed(thread, ids + ids[:5])  # duplicates in one call are fine
    assert dynamo.metrics.calls["BatchWriteItem"] == 11  # 260 / 25
    found = await state.filter_processed(thread, [*ids[:250], "unknown"])
    assert found == set(ids[:250])
    assert dynamo.metrics.calls["BatchGetItem"] == 3  # 251 / 100
    item = await dynamo.client.get_item(
        TableName=dynamo.state_table, Key={"pk": {"S": thread}, "sk": {"S": "P#m0"}}, ConsistentRead=True
    )
    expires = int(item["Item"][STATE_TTL_ATTRIBUTE]["N"])
    assert abs(expires - (time.time() + MARKER_TTL_S)) < 60


async def test_unprocessed_batch_items_and_keys_are_retried(dynamo: DynamoEnv) -> None:
    calls = {"write": 0, "get": 0}

    async def batch_write_item(RequestItems: dict[str, Any]) -> Any:
        calls["write"] += 1
        [(table, requests)] = RequestItems.items()
        if calls["write"] == 1:  # accept half, hand back the rest as unprocessed
            await dynamo.client.batch_write_item(RequestItems={table: requests[:10]})
            return {"UnprocessedItems": {table: requests[10:]}}
        return await dynamo.client.batch_write_item(RequestItems=RequestItems)

    async def batch_get_item(RequestItems: dict[str, Any]) -> Any:
        calls["get"] += 1
        [(table, spec)] = RequestItems.items()
        if calls["get"] == 1:
            first = await dynamo.client.batch_get_item(
                RequestItems={table: {**spec, "Keys": spec["Keys"][:3]}}
            )
            return {**first, "UnprocessedKeys": {table: {**spec, "Keys": spec["Keys"][3:]}}}
        return await dynamo.client.batch_get_item(RequestItems=RequestItems)

    flaky = ClientProxy(dynamo.client, batch_write_item=batch_write_item, batch_get_item=batch_get_item)
    _, state = dynamo.stores(client=flaky)
    thread = uid()
    ids = [f"m{i}" for i in range(20)]
    await state.mark_processed(thread, ids)
    assert await state.filter_processed(thread, ids) == set(ids)
    assert calls == {"write": 2, "get": 2}


async def test_a_transaction_is_tried_again_only_for_a_conflict_that_wrote_nothing(
    dynamo: DynamoEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dynamodb_io, "CONFLICT_BACKOFF", Backoff(attempts=3, base=0.0, cap=0.0))
    io = DynamoIo(dynamo.client, None, None, StoreMetrics())
    real = io.call
    cancellations: list[list[str]] = []
    tokens: list[str | None] = []

    async def flaky(op: str, table: str, **kwargs: Any) -> Any:
        if op == "TransactWriteItems":
            tokens.append(kwargs.get("ClientRequestToken"))
            if cancellations:
                raise TransactionCancelled(cancellations.pop(0))
        return await real(op, table, **kwargs)

    io.call = flaky  # type: ignore[method-assign]
    thread = uid()
    writes = [put(dynamo.state_table, item_key(thread, "A")), put(dynamo.state_table, item_key(thread, "B"))]

    # a conflict that wrote nothing: sent again (with a token of its own), then written and counted once
    cancellations[:] = [["None", "TransactionConflict"]]
    await io.transact(dynamo.state_table, writes, token="t" * 36)
    assert tokens == ["t" * 36, "t" * 32 + "-r2"]
    assert io.metrics.items_written == 2
    stored = await dynamo.client.get_item(TableName=dynamo.state_table, Key=item_key(thread, "B"))
    assert "Item" in stored

    # a failed condition beside the conflict: the caller's to judge, at once
    tokens.clear()
    cancellations[:] = [["ConditionalCheckFailed", "TransactionConflict"]]
    with pytest.raises(TransactionCancelled) as raised:
        await io.transact(dynamo.state_table, writes)
    assert raised.value.reasons == ["ConditionalCheckFailed", "TransactionConflict"] and tokens == [None]

    # conflicts that do not stop: the last one reaches the caller after CONFLICT_BACKOFF's attempts
    tokens.clear()
    cancellations[:] = [["TransactionConflict", "None"]] * 5
    with pytest.raises(TransactionCancelled):
        await io.transact(dynamo.state_table, writes)
    assert len(tokens) == 3 and io.metrics.items_written == 2

    # a caller's own rule: never again
    tokens.clear()
    cancellations[:] = [["None", "TransactionConflict"]]
    with pytest.raises(TransactionCancelled):
        await io.transact(dynamo.state_table, writes, retry_if=lambda _: False)
    assert len(tokens) == 1


async def test_a_watch_retries_throttled_head_reads_and_never_reports_them_as_absent(
    dynamo: DynamoEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dynamodb_io, "BATCH_BACKOFF", Backoff(attempts=8, base=0.0, cap=0.0))
    conversation, state = dynamo.stores()
    threads = [uid() for _ in range(60)]  # two requests: 50 threads (100 keys) a BatchGetItem
    for thread in threads:
        await conversation.commit(thread, Commit(0, rows=[(user("hi"), "m1")]))
    throttle = {"left": 1}

    async def batch_get_item(RequestItems: dict[str, Any]) -> Any:
        if throttle["left"] == 0:
            return await dynamo.client.batch_get_item(RequestItems=RequestItems)
        throttle["left"] -= 1  # DynamoDB read nothing of this request: every key comes back unprocessed
        return {"Responses": {}, "UnprocessedKeys": RequestItems}

    def reader() -> StoreReader:
        io = DynamoIo(ClientProxy(dynamo.client, batch_get_item=batch_get_item), None, None, StoreMetrics())
        return StoreReader(conversation, state, io)

    found = await reader().heads_and_live(threads)
    assert all(head is not None and int(head["version"]["N"]) == 1 for head, _ in found.values())
    assert sorted(found) == sorted(threads)

    throttle["left"] = 10_000  # throttled for good: an error naming the read, never "no such thread"
    with pytest.raises(StoreError, match=r"BatchGetItem.*unprocessed after retries"):
        await reader().heads_and_live(threads[:1])


# ---- errors and provisioning -----------------------------------------------------------------------------


async def test_aws_errors_become_store_errors_naming_table_and_operation(dynamo: DynamoEnv) -> None:
    missing = unique_name("missing")
    conversation = DynamoConversationStore(dynamo.client, conversation_table=missing, state_table=missing)
    state = DynamoStateStore(dynamo.client, state_table=missing)
    with pytest.raises(StoreError, match=f"GetItem on table {missing}.*ResourceNotFound"):
        await conversation.get_thread("t")
    with pytest.raises(StoreError, match=f"BatchGetItem on table {missing}"):
        await state.filter_processed("t", ["m"])


async def test_connection_failure_becomes_store_error() -> None:
    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)
    # a client on a port nobody listens on
    async with open_client(aws_session(), "dynamodb", "http://127.0.0.1:9", config) as client:
        conversation = DynamoConversationStore(client, conversation_table="c", state_table="s")
        with pytest.raises(StoreError, match="GetItem on table c failed"):
            await conversation.get_thread("t")


async def test_ensure_tables_is_idempotent_and_enables_ttl() -> None:
    conversation_table, state_table = unique_name("c"), unique_name("s")
    async with aws_client("dynamodb") as client:
        await ensure_tables(client, conversation_table, state_table)
        await ensure_tables(client, conversation_table, state_table)
        ttl = await client.describe_time_to_live(TableName=state_table)
        assert ttl["TimeToLiveDescription"]["AttributeName"] == STATE_TTL_ATTRIBUTE
        assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
        described = await client.describe_table(TableName=conversation_table)
        assert described["Table"]["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"

        wrong = unique_name("wrong")
        await client.create_table(
            TableName=wrong,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        with pytest.raises(ConfigurationError, match=wrong):
            await ensure_tables(client, wrong, state_table)


# ---- indexed calls and the compaction claim (newer port methods; the contract suite may cover them too) ---


async def test_indexed_calls_commit_atomically_and_read_back(dynamo: DynamoEnv) -> None:
    conversation, state = dynamo.stores()
    thread = uid()
    spawn = ToolCall(id="call-spawn", name="spawn_thread", arguments={"prompt": "go"})
    await conversation.commit(thread, Commit(0, rows=[(ToolCallItem(spawn), "m1")], indexed_calls=[spawn]))
    assert await state.indexed_call(thread, "call-spawn") == spawn
    assert await state.indexed_call(thread, "other") is None
    with pytest.raises(ConcurrentWriteError):  # a lost race indexes nothing
        await conversation.commit(
            thread, Commit(0, indexed_calls=[ToolCall(id="late", name="x", arguments={})])
        )
    assert await state.indexed_call(thread, "late") is None


async def test_compaction_claim_is_exclusive_until_its_lease_expires(dynamo: DynamoEnv) -> None:
    _, state = dynamo.stores()
    thread = uid()
    assert await state.claim_compaction(thread, "claim-a", now=1000.0, lease_seconds=60)
    assert await state.claim_compaction(thread, "claim-a", now=1010.0, lease_seconds=60)  # idempotent
    assert not await state.claim_compaction(thread, "claim-b", now=1069.0, lease_seconds=60)
    assert await state.claim_compaction(thread, "claim-b", now=1070.5, lease_seconds=60)  # a's lease ran out
    assert not await state.claim_compaction(thread, "claim-a", now=1071.0, lease_seconds=60)
    await state.release_compaction(thread)
    assert await state.claim_compaction(thread, "claim-c", now=1072.0, lease_seconds=60)
    await state.release_compaction(uid())  # releasing an unclaimed thread is a no-op


async def test_s3_client_without_bucket_means_no_blobs(dynamo: DynamoEnv) -> None:
    """Callers pass ``bucket=settings.blob_bucket`` which may be unset: blobs are then off, not an error."""
    conversation = DynamoConversationStore(
        dynamo.client,
        conversation_table=dynamo.conversation_table,
        state_table=dynamo.state_table,
        s3_client=dynamo.s3,
        bucket=None,
    )
    with pytest.raises(PayloadTooLargeError, match="STEPAGENT_BLOB_BUCKET"):
        await conversation.commit(uid(), Commit(0, rows=[(user("y" * (INLINE_LIMIT + 1)), "m1")]))


async def test_children_in_spawn_order_with_live_heads(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    parent = uid("parent")
    ids = [uid(f"child{i}") for i in range(3)]
    for index, child in enumerate(reversed(ids)):  # spawn order differs from id order
        await conversation.spawn_thread(
            parent, child_id=child, spawn_tool_call_id=f"c{index}", kind=ThreadKind.CHILD
        )
    await conversation.spawn_thread(
        parent, child_id=ids[0], spawn_tool_call_id="again", kind=ThreadKind.CHILD
    )
    await conversation.commit(ids[1], Commit(0, rows=rows("x", 2)))
    await conversation.close_thread(ids[2])
    children = await conversation.children(parent)
    assert [c.thread_id for c in children] == list(reversed(ids))
    assert [(c.tail, c.closed) for c in children] == [(0, True), (2, False), (0, False)]
    assert await conversation.children(ids[0]) == []


# ---- the journal: state changes over the transaction limits ---------------------------------------------


class CrashBeforeCall:
    """A client proxy that raises ``InjectedCrash`` instead of its ``crash_at``-th AWS call (1-based),
    counting every call, so a test can kill a store operation at each of its I/O points in turn."""

    def __init__(self, inner: Any, crash_at: int | None = None) -> None:
        self._inner, self.crash_at, self.calls = inner, crash_at, 0
        self.log: list[str] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target) or name.startswith("_"):
            return target

        async def call(**kwargs: Any) -> Any:
            self.calls += 1
            self.log.append(name)
            if self.calls == self.crash_at:
                raise InjectedCrash(f"crash before call {self.calls} ({name})")
            return await target(**kwargs)

        return call


def deferred(n: int) -> list[DeferredInput]:
    return [
        DeferredInput(
            f"ev-{i}",
            InputMessage.tool_result("t", ToolResult.text("sub-1", f"event {i}")),
        )
        for i in range(n)
    ]


def release_commit(version: int, n: int) -> Commit:
    """What releasing ``n`` held events commits: a row per event plus three state changes each."""
    return Commit(
        version,
        rows=[(user(f"event {i}"), f"ev-{i}") for i in range(n)],
        processed_message_ids=[f"ev-{i}" for i in range(n)],
        answered_tool_calls=[f"inv-{i}" for i in range(n)],
        deferred_removed=[f"ev-{i}" for i in range(n)],
    )


async def journal_entries(env: DynamoEnv, thread: str) -> list[str]:
    response = await env.client.query(
        TableName=env.state_table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :j)",
        ExpressionAttributeValues={":pk": {"S": thread}, ":j": {"S": "J#"}},
        ConsistentRead=True,
    )
    return [item["sk"]["S"] for item in response["Items"]]


async def test_state_changes_over_one_transaction_go_through_the_journal(dynamo: DynamoEnv) -> None:
    """1,000 held events: deferring them and releasing them both commit far more than 100 state items."""
    conversation, state = dynamo.stores()
    thread = uid()
    n = 1000
    info = await conversation.commit(thread, Commit(0, deferred_added=deferred(n)))
    assert [d.message_id for d in await state.deferred_inputs(thread)] == [f"ev-{i}" for i in range(n)]
    dynamo.metrics.reset()
    info = await conversation.commit(thread, release_commit(info.version, n))
    assert (info.version, info.tail) == (2, n)
    # 1,000 rows staged (11 transactions), 3,000 state changes in 31 journal entries (two batch puts),
    # the flip, 31 applications, the clear and the entries' deletion.
    assert dynamo.metrics.calls == {
        "GetItem": 1,
        "TransactWriteItems": 11 + 1 + 31,
        "BatchWriteItem": 2 + 2,
        "UpdateItem": 1,
    }
    fresh, fresh_state = dynamo.stores()
    head = await dynamo.client.get_item(
        TableName=dynamo.conversation_table, Key={"pk": {"S": thread}, "sk": {"S": "HEAD"}}
    )
    assert "journal" not in head["Item"] and await journal_entries(dynamo, thread) == []
    assert len(await texts(fresh, thread)) == n
    ids = [f"ev-{i}" for i in range(n)]
    assert await fresh_state.filter_processed(thread, ids) == set(ids)
    assert await fresh_state.filter_answered(thread, [f"inv-{i}" for i in range(n)]) == {
        f"inv-{i}" for i in range(n)
    }
    assert await fresh_state.deferred_inputs(thread) == []


async def test_a_crash_at_any_point_of_a_journaled_commit_shows_all_or_nothing(dynamo: DynamoEnv) -> None:
    n = 110  # 330 state changes: four journal entries
    probe = CrashBeforeCall(dynamo.client)
    thread = uid()
    store, _ = dynamo.stores(client=probe)
    base = await store.commit(thread, Commit(0, deferred_added=deferred(n)))
    probe.calls, probe.log = 0, []
    await store.commit(thread, release_commit(base.version, n))
    points = list(probe.log)
    assert points.count("transact_write_items") == 2 + 1 + 4  # staging, flip, applications
    ids = [f"ev-{i}" for i in range(n)]
    for crash_at in range(1, len(points) + 1):
        thread = uid()
        seeding, _ = dynamo.stores()
        base = await seeding.commit(thread, Commit(0, deferred_added=deferred(n)))
        crashing, _ = dynamo.stores(client=CrashBeforeCall(dynamo.client, crash_at))
        with pytest.raises(InjectedCrash):
            await crashing.commit(thread, release_commit(base.version, n))
        where = f"crash before call {crash_at} ({points[crash_at - 1]})"
        # A fresh reader (the redelivered step) sees exactly the old or exactly the new thread.
        fresh, fresh_state = dynamo.stores()
        info = await fresh.get_thread(thread)
        assert info is not None, where
        processed = await fresh_state.filter_processed(thread, ids)
        held = [d.message_id for d in await fresh_state.deferred_inputs(thread)]
        if info.version == 1:
            assert (info.tail, processed, held) == (0, set(), ids), where
            assert await texts(fresh, thread) == [], where
        else:
            assert (info.version, info.tail, processed, held) == (2, n, set(ids), []), where
            assert len(await texts(fresh, thread)) == n, where
        # And the thread goes on: the next commit from what the reader saw lands.
        after = await fresh.commit(thread, Commit(info.version, rows=rows("next", 1)))
        assert after.tail == info.tail + 1, where
        assert "journal" not in (await dynamodb_head(dynamo, thread)), where


async def dynamodb_head(env: DynamoEnv, thread: str) -> dict[str, Any]:
    found = await env.client.get_item(
        TableName=env.conversation_table, Key={"pk": {"S": thread}, "sk": {"S": "HEAD"}}, ConsistentRead=True
    )
    return dict(found["Item"])


async def test_a_slow_writer_cannot_apply_its_journal_after_a_reader_completed_it(dynamo: DynamoEnv) -> None:
    """The writer flips, then stalls; a reader completes the journal and the next commit removes what it
    added. The stalled writer's late application must not bring it back."""
    thread = uid()
    store, _ = dynamo.stores()
    base = await store.commit(thread, Commit(0, rows=rows("r", 1)))
    flipped, release = asyncio.Event(), asyncio.Event()
    transactions = 0

    async def stall_after_flip(**kwargs: Any) -> Any:
        nonlocal transactions
        transactions += 1
        if transactions == 3:  # staging (1), flip (2), then the first application
            flipped.set()
            await release.wait()
        return await dynamo.client.transact_write_items(**kwargs)

    slow, _ = dynamo.stores(client=ClientProxy(dynamo.client, transact_write_items=stall_after_flip))
    big = Commit(
        base.version,
        rows=rows("big", 2),
        processed_message_ids=[f"m-{i}" for i in range(150)],
        subscriptions_added=["sub-x"],
    )
    writer = asyncio.create_task(slow.commit(thread, big))
    waiting = asyncio.create_task(flipped.wait())
    await asyncio.wait({writer, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if writer.done():
        waiting.cancel()
        await writer  # raises what stopped it before it flipped
    assert flipped.is_set()
    reader, reader_state = dynamo.stores()
    info = await reader.get_thread(thread)  # rolls the journal forward
    assert info is not None and info.version == 2
    assert await reader_state.active_subscriptions(thread) == {"sub-x"}
    await reader.commit(thread, Commit(2, rows=rows("later", 1), subscriptions_removed=["sub-x"]))
    release.set()
    await writer  # its remaining applications find the journal completed and stop
    assert await reader_state.active_subscriptions(thread) == set()
    assert await reader_state.filter_processed(thread, ["m-0", "m-149"]) == {"m-0", "m-149"}
