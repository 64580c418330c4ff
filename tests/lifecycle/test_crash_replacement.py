"""Crash injection at every write boundary of a whole-history replacement and of an import.

Whatever write the process dies before or after — the pending mark, any batch of staged rows, the head
flip — a fresh reader sees exactly the old history or exactly the new one (a crash after the flip: the new
one), a sweep then removes every leftover without changing what readers see, and the thread keeps
working. 1,000 randomized runs on the in-memory store (which has the same write boundaries as DynamoDB);
an exhaustive enumeration plus randomized runs on DynamoDB (moto), where the crash is injected into the
AWS client itself. Imports: the tree is invisible until its root flips, and re-running completes it.
"""

from __future__ import annotations

import contextlib
import math
import random
from pathlib import Path
from typing import Any

import pytest

from stepagent.history_items import HistoryItem, Summary, encode_item
from stepagent.ids import derived_id
from stepagent.lifecycle import export_lines, import_tree
from stepagent.stores.base import Commit, ConversationStore, HistoryEntry, replace_history
from stepagent.stores.memory import STAGING_BATCH, InMemoryConversationStore, memory_stores
from tests.conftest import DynamoEnv
from tests.lifecycle import build_tree, call, export_to, rename, result, transcript, user

LATER = 10**10  # a sweep "now" after every lease
Snapshot = tuple[int | None, list[tuple[int, str, str]], list[tuple[int, str]]]


class InjectedCrash(BaseException):
    """The process dying: a BaseException, so no ``except Exception`` cleanup in the code under test runs."""


def random_entries(rng: random.Random, tag: str, max_rows: int) -> list[HistoryEntry]:
    entries: list[HistoryEntry] = []
    rows = 0
    while rows < rng.randint(0, max_rows):
        if rng.random() < 0.3:
            call_id = f"{tag}-c{rows}"
            entries += [(call(call_id), f"{tag}-x{rows}"), (result(call_id, f"r{rows}"), call_id)]
            rows += 2
        else:
            entries.append((user(f"{tag} {rows}" + "y" * rng.randint(0, 300)), f"{tag}-m{rows}"))
            rows += 1
    for up_to in rng.sample(range(rows + 1), k=min(rng.randint(0, 2), rows + 1)):
        entries.insert(rng.randint(0, len(entries)), Summary(f"{tag} summary {up_to}", up_to))
    return entries


def expected(entries: list[HistoryEntry]) -> Snapshot:
    rows = [e for e in entries if not isinstance(e, Summary)]
    summaries = sorted((e.up_to_order, e.text) for e in entries if isinstance(e, Summary))
    encoded = [
        (order, message_id, encode_item(item)) for order, (item, message_id) in enumerate(rows, start=1)
    ]
    return len(rows), encoded, summaries


async def snapshot(conv: ConversationStore, thread: str) -> Snapshot:
    info = await conv.get_thread(thread)
    rows = [(r.order, r.message_id, encode_item(r.item)) async for r in conv.load_rows(thread)]
    summaries: list[tuple[int, str]] = []
    bound: int | None = None
    while (summary := await conv.latest_summary(thread, bound)) is not None:
        summaries.insert(0, (summary.up_to_order, summary.text))
        if summary.up_to_order == 0:
            break
        bound = summary.up_to_order - 1
    return (info.tail if info else None), rows, summaries


async def seed(conv: ConversationStore, rng: random.Random, thread: str) -> list[HistoryEntry]:
    """An old history: by plain commits (the original generation) or by an earlier replacement."""
    old = random_entries(rng, "old", 40)
    if rng.random() < 0.5:
        await replace_history(conv, thread, 0, old)
        return old
    rows: list[tuple[HistoryItem, str]] = [e for e in old if not isinstance(e, Summary)]
    await conv.commit(thread, Commit(expected_version=0, rows=rows))
    for summary in (e for e in old if isinstance(e, Summary)):
        await conv.save_summary(thread, summary)
    return old


# ---- in memory: 1,000 randomized runs --------------------------------------------------------------------


async def memory_run(run: int) -> str:
    rng = random.Random(run)
    conv, _ = memory_stores()
    thread = f"thread-{run}"
    old = await seed(conv, rng, thread)
    before = await snapshot(conv, thread)
    assert before == expected(old)
    new = random_entries(rng, "new", 90)
    batches = math.ceil(len(new) / STAGING_BATCH)
    boundaries = ["begin:before", "begin:after", *["rows:before", "rows:after"] * batches]
    boundaries += ["flip:before", "flip:after"]
    crash_at = rng.randint(0, len(boundaries))  # 0: no crash
    seen: list[str] = []

    def hook(name: str) -> None:
        seen.append(name)
        if len(seen) == crash_at:
            raise InjectedCrash(name)

    conv.backend.fault_hook = hook
    info = await conv.get_thread(thread)
    with contextlib.suppress(InjectedCrash):
        await replace_history(conv, thread, info.version if info else 0, new)
    conv.backend.fault_hook = None
    assert seen == boundaries[: crash_at or None]
    fresh = InMemoryConversationStore(conv.backend)  # another process
    flipped = crash_at in (0, len(boundaries))
    assert await snapshot(fresh, thread) == (expected(new) if flipped else before)

    await fresh.sweep_generations(thread, now=LATER, lease_seconds=600)
    assert [key for key in conv.backend.staged if key[0] == thread] == []
    visible = await snapshot(fresh, thread)
    assert visible == (expected(new) if flipped else before)
    info = await fresh.get_thread(thread)
    assert info is not None
    await fresh.commit(thread, Commit(expected_version=info.version, rows=[(user("after"), "after")]))
    assert (await snapshot(fresh, thread))[1][-1][1] == "after"
    return seen[-1] if crash_at else "none"


async def test_a_thousand_randomized_crashes_in_memory() -> None:
    crashed_at = [await memory_run(run) for run in range(1000)]
    # Every kind of boundary was hit, so the runs really covered the protocol.
    assert set(crashed_at) == {
        "none",
        "begin:before",
        "begin:after",
        "rows:before",
        "rows:after",
        "flip:before",
        "flip:after",
    }


# ---- DynamoDB: crash inside the AWS client ------------------------------------------------------------------

_WRITES = {"put_item", "update_item", "delete_item", "batch_write_item", "transact_write_items", "put_object"}


class CrashingClient:
    """Forwards to a real client; write call number ``crash_at`` dies before or after it runs."""

    def __init__(self, inner: Any, crash_at: int, after: bool) -> None:
        self._inner, self.crash_at, self.after = inner, crash_at, after
        self.writes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if name not in _WRITES:
            return method

        async def write(**kwargs: Any) -> Any:
            self.writes.append(name)
            if len(self.writes) == self.crash_at and not self.after:
                raise InjectedCrash(f"before {name}")
            response = await method(**kwargs)
            if len(self.writes) == self.crash_at:
                raise InjectedCrash(f"after {name}")
            return response

        return write


async def dynamo_run(
    env: DynamoEnv,
    rng: random.Random,
    thread: str,
    crash_at: int,
    after: bool,
    new: list[HistoryEntry] | None = None,
) -> list[str]:
    conv, _ = env.stores()
    old = await seed(conv, rng, thread)
    before = await snapshot(conv, thread)
    if new is None:
        new = random_entries(rng, "new", 70)
        if rng.random() < 0.2:  # now and then a row for the blob bucket
            new.append((user("z" * 400_000), "big"))
    dynamo = CrashingClient(env.client, crash_at, after)
    s3 = CrashingClient(env.s3, crash_at, after)
    s3.writes = dynamo.writes  # one count across both services
    crashing, _ = env.stores(client=dynamo)
    crashing._io.s3 = s3  # the store's own claim-check path, crash-injected
    assert crashing._io.blobs is not None
    crashing._io.blobs.s3 = s3  # and its shared texts' (a big JSON row's text goes there)
    info = await conv.get_thread(thread)
    with contextlib.suppress(InjectedCrash):
        await replace_history(crashing, thread, info.version if info else 0, new)
    # The flip is the replacement's one TransactWriteItems (its last write): it counts if it completed.
    flip = (
        dynamo.writes.index("transact_write_items") + 1 if "transact_write_items" in dynamo.writes else None
    )
    flipped = flip is not None and (crash_at == 0 or crash_at > flip or (crash_at == flip and after))
    fresh, _ = env.stores()
    assert await snapshot(fresh, thread) == (expected(new) if flipped else before), (
        old,
        crash_at,
        after,
        dynamo.writes,
    )

    await fresh.sweep_generations(thread, now=LATER, lease_seconds=600)
    head = await env.client.get_item(
        TableName=env.conversation_table, Key={"pk": {"S": thread}, "sk": {"S": "HEAD"}}, ConsistentRead=True
    )
    generation = head["Item"].get("gen", {}).get("S", "")
    assert "pending_gen" not in head["Item"]
    rows = await env.client.query(
        TableName=env.conversation_table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :r)",
        ExpressionAttributeValues={":pk": {"S": thread}, ":r": {"S": "R#"}},
        ConsistentRead=True,
    )
    prefix = f"R#g{generation}#" if generation else "R#0"
    assert all(item["sk"]["S"].startswith(prefix) for item in rows["Items"])  # only the live generation
    assert await snapshot(fresh, thread) == (expected(new) if flipped else before)
    info = await fresh.get_thread(thread)
    assert info is not None
    await fresh.commit(thread, Commit(expected_version=info.version, rows=[(user("after"), "after")]))
    assert (await snapshot(fresh, thread))[1][-1][1] == "after"
    return dynamo.writes if flipped else ["(old history kept)", *dynamo.writes]


async def test_every_write_boundary_on_dynamodb(dynamo: DynamoEnv) -> None:
    """One replacement of 60 rows over a committed history: mark, 3 batches, flip; before and after each."""

    new: list[HistoryEntry] = [(user(f"new {i}"), f"n{i}") for i in range(60)]
    new.insert(30, Summary("new summary", 30))

    async def run(crash_at: int, after: bool) -> list[str]:
        rng = random.Random(7)
        thread = f"fixed-{crash_at}-{after}-{random.random()}"
        return await dynamo_run(dynamo, rng, thread, crash_at, after, new)

    writes = await run(0, False)
    assert writes == ["update_item"] + ["batch_write_item"] * 3 + ["transact_write_items"]
    outcomes = [
        await run(crash_at, after) for crash_at in range(1, len(writes) + 1) for after in (False, True)
    ]
    kept_old = [outcome[0] == "(old history kept)" for outcome in outcomes]
    assert kept_old == [True] * 9 + [False]  # only a crash after the flip shows the new history


async def test_randomized_crashes_on_dynamodb(dynamo: DynamoEnv) -> None:
    kept_old = []
    for run in range(30):
        rng = random.Random(10_000 + run)
        thread = f"random-{run}-{rng.random()}"
        writes = await dynamo_run(dynamo, rng, thread, rng.randint(0, 6), rng.random() < 0.5)
        kept_old.append(writes[0] == "(old history kept)")
    assert 5 <= sum(kept_old) <= 25  # both outcomes were exercised


# ---- imports -------------------------------------------------------------------------------------------------


async def test_a_crashed_import_is_invisible_and_a_rerun_completes_it(tmp_path: Path) -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")
    original = await transcript(conv, ids["root"])
    boundaries: list[str] = []
    conv.backend.fault_hook = boundaries.append
    await import_tree(conv, state, path, new_root="dry-run")
    conv.backend.fault_hook = None
    assert boundaries.count("flip:after") == 4

    for crash_at in range(1, len(boundaries) + 1):
        new_root = f"copy-{crash_at}"
        seen: list[str] = []

        def hook(name: str, crash_at: int = crash_at, seen: list[str] = seen) -> None:
            seen.append(name)
            if len(seen) == crash_at:
                raise InjectedCrash(name)

        conv.backend.fault_hook = hook
        with pytest.raises(InjectedCrash):
            await import_tree(conv, state, path, new_root=new_root)
        conv.backend.fault_hook = None
        ids_map = {ids["root"]: new_root} | {
            v: derived_id("import", new_root, v) for k, v in ids.items() if k != "root"
        }
        if crash_at < len(boundaries):  # the root's flip is the last write
            assert await conv.get_thread(new_root) is None
            assert await transcript(conv, new_root) == []
            with pytest.raises(Exception, match="no thread"):
                [line async for line in export_lines(conv, state, new_root)]
            await import_tree(conv, state, path, new_root=new_root)  # re-run: overwrites the leftovers
        assert await transcript(conv, new_root) == rename(original, ids_map)


async def test_a_crashed_import_on_dynamodb_is_invisible_and_a_rerun_completes_it(
    dynamo: DynamoEnv, tmp_path: Path
) -> None:
    conv, state = dynamo.stores()
    ids = await build_tree(conv, state)
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")
    original = await transcript(conv, ids["root"])
    rng = random.Random(3)
    for attempt in range(6):
        new_root = f"copy-{attempt}-{rng.random()}"
        crashing = CrashingClient(dynamo.client, rng.randint(1, 14), rng.random() < 0.5)
        crash_conv, crash_state = dynamo.stores(client=crashing)
        with contextlib.suppress(InjectedCrash):
            await import_tree(crash_conv, crash_state, path, new_root=new_root)
        ids_map = {ids["root"]: new_root} | {
            v: derived_id("import", new_root, v) for k, v in ids.items() if k != "root"
        }
        if await conv.get_thread(new_root) is None:
            assert await transcript(conv, new_root) == []
            await import_tree(conv, state, path, new_root=new_root)
        assert await transcript(conv, new_root) == rename(original, ids_map)
