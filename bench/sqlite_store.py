"""A conversation store and a state store on SQLite (standard library), for benchmarks and memory gates.

Why it exists: the in-memory stores keep every row as a Python object, so the Python heap grows with the
conversation and a retained-memory measurement (``tracemalloc``) would see the store, not the runtime.
SQLite keeps its pages in its own allocator, which ``tracemalloc`` does not trace — as if the store were
out of process, the way DynamoDB is in production. Only what the runtime reads back (fresh, short-lived
objects per step) is on the measured heap.

Guarantees (the in-memory store's semantics for everything a step uses): a commit is conditioned on the
head version and applied in one SQLite transaction (rows, processed ids, answered calls, intents,
subscriptions, deferrals, indexed calls, metadata — all or nothing); rows past the tail are overwritten;
``load_rows`` reads in pages of :data:`PAGE_ROWS` (no cursor stays open across an ``await``);
ordered sets keep first-insertion order. History replacement (``rewind``, ``stage_history``,
``sweep_generations``) is not implemented: benchmarks never use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import Summary, decode_item, encode_item
from stepagent.messages import InputMessage, ToolCall, UserChoiceRequired
from stepagent.stores.base import (
    Commit,
    DeferredInput,
    DispatchIntent,
    HistoryStaging,
    Rewind,
    Spend,
    StoredRow,
    ThreadInfo,
    ThreadKind,
    UsageRecord,
    with_pace,
)

#: Rows per ``load_rows`` query (like a DynamoDB Query page).
PAGE_ROWS = 100

_SCHEMA = """
CREATE TABLE threads (thread_id TEXT PRIMARY KEY, root_id TEXT, parent_id TEXT, spawn_order INTEGER,
    spawn_tool_call_id TEXT, kind TEXT, closed INTEGER, version INTEGER, tail INTEGER, seq INTEGER,
    turn INTEGER, hints TEXT);
CREATE TABLE rows (thread_id TEXT, ord INTEGER, message_id TEXT, data TEXT, PRIMARY KEY (thread_id, ord));
CREATE TABLE summaries (thread_id TEXT, up_to INTEGER, text TEXT, PRIMARY KEY (thread_id, up_to));
CREATE TABLE marks (thread_id TEXT, kind TEXT, id TEXT, PRIMARY KEY (thread_id, kind, id));
CREATE TABLE entries (thread_id TEXT, kind TEXT, id TEXT, seq INTEGER, data TEXT,
    PRIMARY KEY (thread_id, kind, id));
CREATE TABLE metadata (root_id TEXT PRIMARY KEY, data TEXT);
CREATE TABLE compaction (thread_id TEXT PRIMARY KEY, claim_id TEXT, expires REAL);
CREATE TABLE cache (key TEXT PRIMARY KEY, value TEXT, expires REAL);
CREATE TABLE usage (thread_id TEXT, version INTEGER, data TEXT, PRIMARY KEY (thread_id, version));
CREATE TABLE spend (root_id TEXT PRIMARY KEY, tokens INTEGER, cost REAL);
"""

_PROCESSED, _ANSWERED, _SUBSCRIPTION = "processed", "answered", "subscription"
_INTENT, _DEFERRED, _CHOICE, _CALL = "intent", "deferred", "choice", "call"


class SqliteBackend:
    """One SQLite database shared by both stores (so a commit spans history and state atomically)."""

    def __init__(self, path: str = ":memory:") -> None:
        self.db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit
        # The stores are dropped, not closed, by the runs that use them: close the database with its backend
        # (Python 3.13 warns about a connection left to the garbage collector).
        weakref.finalize(self, self.db.close)
        self.db.executescript(_SCHEMA)
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def thread(self, thread_id: str) -> ThreadInfo | None:
        found = self.db.execute(
            "SELECT thread_id, root_id, parent_id, spawn_order, spawn_tool_call_id, kind, closed, version, "
            "tail, turn, hints FROM threads WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()
        return _info(found) if found is not None else None

    def put_thread(self, info: ThreadInfo) -> None:
        self.db.execute(
            "INSERT INTO threads VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET "
            "closed = excluded.closed, version = excluded.version, tail = excluded.tail, turn = excluded.turn, "
            "hints = excluded.hints",
            (
                info.thread_id,
                info.root_id,
                info.parent_id,
                info.spawn_order,
                info.spawn_tool_call_id,
                info.kind.value,
                int(info.closed),
                info.version,
                info.tail,
                self.next_seq(),
                None if info.turn_complete is None else int(info.turn_complete),
                json.dumps({name: getattr(info, name) for name in _HINTS}),
            ),
        )

    def apply_state(self, thread_id: str, commit: Commit) -> None:
        db = self.db
        db.executemany(
            "INSERT OR IGNORE INTO marks VALUES (?, ?, ?)",
            [(thread_id, _PROCESSED, m) for m in commit.processed_message_ids]
            + [(thread_id, _ANSWERED, c) for c in commit.answered_tool_calls]
            + [(thread_id, _SUBSCRIPTION, s) for s in commit.subscriptions_added],
        )
        db.executemany(
            "DELETE FROM marks WHERE thread_id = ? AND kind = ? AND id = ?",
            [(thread_id, _SUBSCRIPTION, s) for s in commit.subscriptions_removed],
        )
        for intent in commit.intents_added:
            self.put_entry(thread_id, _INTENT, intent.tool_call_id, _intent_json(intent))
        for deferred in commit.deferred_added:
            data = json.dumps(
                {"message_id": deferred.message_id, "message": deferred.message.model_dump(mode="json")}
            )
            self.put_entry(thread_id, _DEFERRED, deferred.message_id, data)
        for message_id in commit.deferred_removed:
            self.delete_entry(thread_id, _DEFERRED, message_id)
        for call in commit.indexed_calls:
            self.put_entry(thread_id, _CALL, call.id, call.model_dump_json())
        if commit.metadata is not None:
            root_id, value = commit.metadata
            db.execute("INSERT OR REPLACE INTO metadata VALUES (?, ?)", (root_id, json.dumps(value)))

    def put_entry(self, thread_id: str, kind: str, entry_id: str, data: str) -> None:
        # Replacing keeps the first insertion's position, as a dict does.
        self.db.execute(
            "INSERT INTO entries VALUES (?, ?, ?, ?, ?) ON CONFLICT (thread_id, kind, id) DO UPDATE SET "
            "data = excluded.data",
            (thread_id, kind, entry_id, self.next_seq(), data),
        )

    def delete_entry(self, thread_id: str, kind: str, entry_id: str) -> None:
        self.db.execute(
            "DELETE FROM entries WHERE thread_id = ? AND kind = ? AND id = ?", (thread_id, kind, entry_id)
        )

    def entries(self, thread_id: str, kind: str) -> list[str]:
        found = self.db.execute(
            "SELECT data FROM entries WHERE thread_id = ? AND kind = ? ORDER BY seq", (thread_id, kind)
        ).fetchall()
        return [str(row[0]) for row in found]

    def marked(self, thread_id: str, kind: str, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        holes = ",".join("?" * len(ids))
        found = self.db.execute(
            f"SELECT id FROM marks WHERE thread_id = ? AND kind = ? AND id IN ({holes})",
            (thread_id, kind, *ids),
        ).fetchall()
        return {str(row[0]) for row in found}


#: The head's hints (what the engine's step reads back from the head besides its record).
_HINTS = ("turn_model_calls", "turn_ended_at", "person_gap", "estimate_scale")


def _info(row: Sequence[Any]) -> ThreadInfo:
    hints = json.loads(row[10]) if row[10] else {}
    return ThreadInfo(
        thread_id=row[0],
        root_id=row[1],
        parent_id=row[2],
        spawn_order=row[3],
        spawn_tool_call_id=row[4],
        kind=ThreadKind(row[5]),
        closed=bool(row[6]),
        version=row[7],
        tail=row[8],
        turn_complete=None if row[9] is None else bool(row[9]),
        **hints,
    )


def _intent_json(intent: DispatchIntent) -> str:
    return json.dumps(
        {
            "tool_call_id": intent.tool_call_id,
            "tool_name": intent.tool_name,
            "arguments": intent.arguments,
            "call_id": intent.call_id,
        }
    )


class SqliteConversationStore:
    """``ConversationStore`` over a :class:`SqliteBackend`."""

    def __init__(self, backend: SqliteBackend) -> None:
        self.backend = backend

    async def get_thread(self, thread_id: str) -> ThreadInfo | None:
        return self.backend.thread(thread_id)

    async def spawn_thread(
        self,
        parent_id: str,
        *,
        child_id: str,
        spawn_tool_call_id: str,
        kind: ThreadKind,
        spawn_order: int | None = None,
    ) -> ThreadInfo:
        backend = self.backend
        existing = backend.thread(child_id)
        if existing is not None:
            return existing
        with backend.transaction():
            parent = backend.thread(parent_id)
            if parent is None:
                parent = ThreadInfo(thread_id=parent_id, root_id=parent_id)
                backend.put_thread(parent)
            child = ThreadInfo(
                thread_id=child_id,
                root_id=parent.root_id,
                parent_id=parent_id,
                spawn_order=parent.tail if spawn_order is None else spawn_order,
                spawn_tool_call_id=spawn_tool_call_id,
                kind=kind,
            )
            backend.put_thread(child)
        return child

    async def load_rows(
        self, thread_id: str, after: int = 0, up_to: int | None = None
    ) -> AsyncIterator[StoredRow]:
        info = self.backend.thread(thread_id)
        if info is None:
            return
        last = info.tail if up_to is None else min(up_to, info.tail)
        position = after
        while position < last:
            page = self.backend.db.execute(
                "SELECT ord, message_id, data FROM rows WHERE thread_id = ? AND ord > ? AND ord <= ? "
                "ORDER BY ord LIMIT ?",
                (thread_id, position, last, PAGE_ROWS),
            ).fetchall()
            if not page:
                return
            for order, message_id, data in page:
                position = order
                yield StoredRow(order=order, message_id=message_id, item=decode_item(data))

    async def commit(self, thread_id: str, commit: Commit) -> ThreadInfo:
        backend = self.backend
        info = backend.thread(thread_id) or ThreadInfo(thread_id=thread_id, root_id=thread_id)
        if info.version != commit.expected_version:
            raise ConcurrentWriteError(
                f"thread {thread_id} is at version {info.version}, commit expected {commit.expected_version}"
            )
        encoded = [
            (thread_id, info.tail + index, message_id, encode_item(item))
            for index, (item, message_id) in enumerate(commit.rows, start=1)
        ]
        with backend.transaction() as db:
            db.execute("DELETE FROM rows WHERE thread_id = ? AND ord > ?", (thread_id, info.tail))
            db.executemany("INSERT INTO rows VALUES (?, ?, ?, ?)", encoded)
            backend.apply_state(thread_id, commit)
            new = ThreadInfo(
                thread_id=info.thread_id,
                root_id=info.root_id,
                parent_id=info.parent_id,
                spawn_order=info.spawn_order,
                spawn_tool_call_id=info.spawn_tool_call_id,
                kind=info.kind,
                closed=info.closed,
                version=info.version + 1,
                tail=info.tail + len(encoded),
                turn_complete=commit.turn_complete,
                turn_model_calls=info.turn_model_calls
                if commit.turn_model_calls is None
                else commit.turn_model_calls,
                turn_ended_at=info.turn_ended_at,
                person_gap=info.person_gap,
                estimate_scale=info.estimate_scale,
            )
            new = with_pace(new, commit)
            backend.put_thread(new)
            if commit.usage is not None:
                stored = dataclasses.replace(commit.usage, version=new.version)
                db.execute(
                    "INSERT OR REPLACE INTO usage VALUES (?, ?, ?)",
                    (thread_id, new.version, json.dumps(dataclasses.asdict(stored))),
                )
                db.execute(
                    "INSERT INTO spend VALUES (?, ?, ?) ON CONFLICT(root_id) DO UPDATE SET "
                    "tokens = tokens + excluded.tokens, cost = cost + excluded.cost",
                    (info.root_id, stored.tokens, stored.cost_usd or 0.0),
                )
        return new

    async def usage_records(self, thread_id: str, after_version: int = 0) -> AsyncIterator[UsageRecord]:
        found = self.backend.db.execute(
            "SELECT data FROM usage WHERE thread_id = ? AND version > ? ORDER BY version",
            (thread_id, after_version),
        ).fetchall()
        for (data,) in found:
            yield UsageRecord(**json.loads(data))

    async def close_thread(self, thread_id: str) -> None:
        self.backend.db.execute("UPDATE threads SET closed = 1 WHERE thread_id = ?", (thread_id,))

    async def children(self, thread_id: str) -> list[ThreadInfo]:
        if self.backend.thread(thread_id) is None:
            return []
        found = self.backend.db.execute(
            "SELECT thread_id, root_id, parent_id, spawn_order, spawn_tool_call_id, kind, closed, version, "
            "tail, turn, hints FROM threads WHERE parent_id = ? ORDER BY seq",
            (thread_id,),
        ).fetchall()
        return [_info(row) for row in found]

    async def save_summary(self, thread_id: str, summary: Summary) -> None:
        self.backend.db.execute(
            "INSERT OR REPLACE INTO summaries VALUES (?, ?, ?)",
            (thread_id, summary.up_to_order, summary.text),
        )

    async def latest_summary(self, thread_id: str, up_to: int | None = None) -> Summary | None:
        found = self.backend.db.execute(
            "SELECT up_to, text FROM summaries WHERE thread_id = ? AND up_to <= ? ORDER BY up_to DESC LIMIT 1",
            (thread_id, up_to if up_to is not None else 2**62),
        ).fetchone()
        return Summary(text=found[1], up_to_order=found[0]) if found is not None else None

    async def rewind(self, thread_id: str, rewind: Rewind) -> ThreadInfo:
        raise NotImplementedError("the benchmark store does not rewind")

    async def stage_history(self, thread_id: str, expected_version: int) -> HistoryStaging:
        raise NotImplementedError("the benchmark store does not replace histories")

    async def sweep_generations(self, thread_id: str, *, now: float, lease_seconds: float) -> int:
        return 0


class SqliteStateStore:
    """``StateStore`` over a :class:`SqliteBackend`."""

    def __init__(self, backend: SqliteBackend) -> None:
        self.backend = backend

    async def filter_processed(self, thread_id: str, message_ids: Sequence[str]) -> set[str]:
        return self.backend.marked(thread_id, _PROCESSED, list(dict.fromkeys(message_ids)))

    async def filter_answered(self, thread_id: str, tool_call_ids: Sequence[str]) -> set[str]:
        return self.backend.marked(thread_id, _ANSWERED, list(dict.fromkeys(tool_call_ids)))

    async def mark_processed(self, thread_id: str, message_ids: Sequence[str]) -> None:
        self.backend.db.executemany(
            "INSERT OR IGNORE INTO marks VALUES (?, ?, ?)", [(thread_id, _PROCESSED, m) for m in message_ids]
        )

    async def get_metadata(self, root_id: str) -> Any:
        found = self.backend.db.execute("SELECT data FROM metadata WHERE root_id = ?", (root_id,)).fetchone()
        return json.loads(found[0]) if found is not None else None

    async def spend(self, root_id: str) -> Spend:
        found = self.backend.db.execute(
            "SELECT tokens, cost FROM spend WHERE root_id = ?", (root_id,)
        ).fetchone()
        return Spend(int(found[0]), float(found[1])) if found else Spend()

    async def set_metadata(self, root_id: str, metadata: Any) -> None:
        self.backend.db.execute(
            "INSERT OR REPLACE INTO metadata VALUES (?, ?)", (root_id, json.dumps(metadata))
        )

    async def active_subscriptions(self, thread_id: str) -> set[str]:
        found = self.backend.db.execute(
            "SELECT id FROM marks WHERE thread_id = ? AND kind = ?", (thread_id, _SUBSCRIPTION)
        ).fetchall()
        return {str(row[0]) for row in found}

    async def add_subscription(self, thread_id: str, tool_call_id: str) -> None:
        self.backend.db.execute(
            "INSERT OR IGNORE INTO marks VALUES (?, ?, ?)", (thread_id, _SUBSCRIPTION, tool_call_id)
        )

    async def remove_subscription(self, thread_id: str, tool_call_id: str) -> None:
        self.backend.db.execute(
            "DELETE FROM marks WHERE thread_id = ? AND kind = ? AND id = ?",
            (thread_id, _SUBSCRIPTION, tool_call_id),
        )

    async def pending_choices(self, thread_id: str) -> list[UserChoiceRequired]:
        return [UserChoiceRequired.model_validate_json(d) for d in self.backend.entries(thread_id, _CHOICE)]

    async def add_pending_choice(self, thread_id: str, choice: UserChoiceRequired) -> None:
        self.backend.put_entry(thread_id, _CHOICE, choice.id, choice.model_dump_json())

    async def remove_pending_choice(self, thread_id: str, choice_id: str) -> None:
        self.backend.delete_entry(thread_id, _CHOICE, choice_id)

    async def open_intents(self, thread_id: str) -> list[DispatchIntent]:
        intents = []
        for data in self.backend.entries(thread_id, _INTENT):
            raw = json.loads(data)
            intents.append(
                DispatchIntent(raw["tool_call_id"], raw["tool_name"], raw["arguments"], raw["call_id"])
            )
        return intents

    async def mark_intent_done(self, thread_id: str, tool_call_id: str) -> None:
        self.backend.delete_entry(thread_id, _INTENT, tool_call_id)

    async def deferred_inputs(self, thread_id: str) -> list[DeferredInput]:
        deferred = []
        for data in self.backend.entries(thread_id, _DEFERRED):
            raw = json.loads(data)
            deferred.append(DeferredInput(raw["message_id"], InputMessage.model_validate(raw["message"])))
        return deferred

    async def indexed_call(self, thread_id: str, tool_call_id: str) -> ToolCall | None:
        found = self.backend.db.execute(
            "SELECT data FROM entries WHERE thread_id = ? AND kind = ? AND id = ?",
            (thread_id, _CALL, tool_call_id),
        ).fetchone()
        return ToolCall.model_validate_json(found[0]) if found is not None else None

    async def claim_compaction(self, thread_id: str, claim_id: str, now: float, lease_seconds: float) -> bool:
        db = self.backend.db
        held = db.execute(
            "SELECT claim_id, expires FROM compaction WHERE thread_id = ?", (thread_id,)
        ).fetchone()
        if held is not None and held[0] != claim_id and held[1] > now:
            return False
        db.execute(
            "INSERT OR REPLACE INTO compaction VALUES (?, ?, ?)", (thread_id, claim_id, now + lease_seconds)
        )
        return True

    async def release_compaction(self, thread_id: str) -> None:
        self.backend.db.execute("DELETE FROM compaction WHERE thread_id = ?", (thread_id,))

    async def cache_get(self, key: str) -> str | None:
        found = self.backend.db.execute("SELECT value, expires FROM cache WHERE key = ?", (key,)).fetchone()
        if found is None or found[1] <= time.time():
            return None
        return str(found[0])

    async def cache_put(self, key: str, value: str, expires_at: float) -> None:
        self.backend.db.execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?)", (key, value, expires_at))


def sqlite_stores(path: str = ":memory:") -> tuple[SqliteConversationStore, SqliteStateStore]:
    """A store pair over one SQLite database (``path`` a file, or ``":memory:"``)."""
    backend = SqliteBackend(path)
    return SqliteConversationStore(backend), SqliteStateStore(backend)
