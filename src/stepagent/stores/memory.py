"""In-memory conversation and state stores (local mode and tests).

Both stores share one :class:`MemoryBackend`, so a :class:`Commit` — which spans history and state — is
applied atomically: every method runs without awaiting in between, so no other task can observe or
interleave with a half-applied commit. Rows are stored encoded, as a real store would, so what is read
back is exactly what was persisted.

A whole-history replacement has the DynamoDB store's write boundaries — pending mark, one write per batch
of :data:`STAGING_BATCH` staged rows, the flip — with ``MemoryBackend.fault_hook`` called around each, so
crash-injection tests exercise the same protocol; staged and retired generations stay in ``staged`` until
``sweep_generations``, and the visible history is only ever swapped whole by the flip.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stepagent.call_id_filter import CallIdFilter
from stepagent.errors import ConcurrentWriteError, InvalidRewindError
from stepagent.history_items import Summary, decode_item, encode_item
from stepagent.messages import ToolCall, UserChoiceRequired
from stepagent.stores.base import (
    Commit,
    DeferredInput,
    DispatchIntent,
    HistoryEntry,
    Replacement,
    Rewind,
    Spend,
    StateCleanup,
    StoredRow,
    ThreadInfo,
    ThreadKind,
    UsageRecord,
    iterate_entries,
    with_pace,
)

#: Rows per staged write of a history replacement (as DynamoDB's BatchWriteItem), so a replacement has the
#: same write boundaries here as there and crash injection exercises the same protocol.
STAGING_BATCH = 25


@dataclass(slots=True)
class _ThreadState:
    processed: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    subscriptions: set[str] = field(default_factory=set)
    choices: dict[str, UserChoiceRequired] = field(default_factory=dict)
    intents: dict[str, DispatchIntent] = field(default_factory=dict)
    deferred: dict[str, DeferredInput] = field(default_factory=dict)
    calls: dict[str, ToolCall] = field(default_factory=dict)
    compaction: tuple[str, float] | None = None  # (claim id, expires at)


@dataclass(slots=True)
class _Staged:
    """A staged (not yet visible) generation of one thread's history."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    summaries: dict[int, str] = field(default_factory=dict)
    summary_filters: dict[int, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class MemoryBackend:
    """The in-memory tables both memory stores share: threads, rows, summaries, state."""

    threads: dict[str, ThreadInfo] = field(default_factory=dict)
    rows: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)  # [(message_id, json, epoch)]
    summaries: dict[str, dict[int, str]] = field(default_factory=dict)
    #: The encoded call-id filter of a summary (``Summary.call_ids``), by thread and order; absent: none.
    summary_filters: dict[str, dict[int, bytes]] = field(default_factory=dict)
    state: dict[str, _ThreadState] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (value, expires at)
    usage: dict[str, list[UsageRecord]] = field(default_factory=dict)  # thread -> records, by version
    spend: dict[str, Spend] = field(default_factory=dict)  # root -> the conversation's spend

    # History replacement: staged and retired generations by (thread, generation), each thread's current
    # generation, and pending marks (generation, began at); the visible history is always ``rows``.
    staged: dict[tuple[str, str], _Staged] = field(default_factory=dict)
    generation: dict[str, str] = field(default_factory=dict)
    pending: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Called with a boundary name before and after every write of a replacement; a test raises from it to
    #: simulate the process dying there.
    fault_hook: Callable[[str], None] | None = None

    def thread_state(self, thread_id: str) -> _ThreadState:
        return self.state.setdefault(thread_id, _ThreadState())

    def boundary(self, name: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(name)

    def apply_state(self, thread_id: str, commit: Commit) -> None:
        """Every non-row field of ``commit`` (shared by commits and replacement flips)."""
        state = self.thread_state(thread_id)
        state.processed.update(commit.processed_message_ids)
        state.answered.update(commit.answered_tool_calls)
        for intent in commit.intents_added:
            state.intents[intent.tool_call_id] = intent
        state.subscriptions.update(commit.subscriptions_added)
        state.subscriptions.difference_update(commit.subscriptions_removed)
        for deferred in commit.deferred_added:
            state.deferred[deferred.message_id] = deferred
        for message_id in commit.deferred_removed:
            state.deferred.pop(message_id, None)
        for call in commit.indexed_calls:
            state.calls[call.id] = call
        if commit.metadata is not None:
            root_id, value = commit.metadata
            self.metadata[root_id] = copy.deepcopy(value)

    def apply_cleanup(self, thread_id: str, cleanup: StateCleanup) -> None:
        state = self.thread_state(thread_id)
        for tool_call_id in cleanup.intents:
            state.intents.pop(tool_call_id, None)
        state.subscriptions.difference_update(cleanup.subscriptions)
        for message_id in cleanup.deferred:
            state.deferred.pop(message_id, None)
        for choice_id in cleanup.choices:
            state.choices.pop(choice_id, None)
        for tool_call_id in cleanup.indexed_calls:
            state.calls.pop(tool_call_id, None)
        state.answered.difference_update(cleanup.answered)
        state.processed.difference_update(cleanup.processed)
        for closing in cleanup.close_threads:
            if (info := self.threads.get(closing)) is not None:
                self.threads[closing] = replace(info, closed=True)
        if cleanup.release_compaction:
            state.compaction = None


class InMemoryConversationStore:
    """``ConversationStore`` over a :class:`MemoryBackend`."""

    def __init__(self, backend: MemoryBackend | None = None) -> None:
        self.backend = backend or MemoryBackend()

    async def get_thread(self, thread_id: str) -> ThreadInfo | None:
        return self.backend.threads.get(thread_id)

    async def spawn_thread(
        self,
        parent_id: str,
        *,
        child_id: str,
        spawn_tool_call_id: str,
        kind: ThreadKind,
        spawn_order: int | None = None,
    ) -> ThreadInfo:
        threads = self.backend.threads
        existing = threads.get(child_id)
        if existing is not None:
            return existing
        parent = threads.get(parent_id)
        if parent is None:
            parent = threads[parent_id] = ThreadInfo(thread_id=parent_id, root_id=parent_id)
        child = ThreadInfo(
            thread_id=child_id,
            root_id=parent.root_id,
            parent_id=parent_id,
            spawn_order=parent.tail if spawn_order is None else spawn_order,
            spawn_tool_call_id=spawn_tool_call_id,
            kind=kind,
        )
        threads[child_id] = child
        return child

    async def load_rows(
        self, thread_id: str, after: int = 0, up_to: int | None = None
    ) -> AsyncIterator[StoredRow]:
        info = self.backend.threads.get(thread_id)
        if info is None:
            return
        last = info.tail if up_to is None else min(up_to, info.tail)
        rows = self.backend.rows.get(thread_id, [])
        for order in range(after + 1, last + 1):
            message_id, data, epoch = rows[order - 1]
            yield StoredRow(
                order=order,
                message_id=message_id,
                item=decode_item(data),
                epoch=epoch,
                encoded_bytes=len(data.encode()),
            )

    async def commit(self, thread_id: str, commit: Commit) -> ThreadInfo:
        backend = self.backend
        info = backend.threads.get(thread_id) or ThreadInfo(thread_id=thread_id, root_id=thread_id)
        if info.version != commit.expected_version:
            raise ConcurrentWriteError(
                f"thread {thread_id} is at version {info.version}, commit expected {commit.expected_version}"
            )
        encoded = [(message_id, encode_item(item)) for item, message_id in commit.rows]
        log = backend.rows.setdefault(thread_id, [])
        del log[info.tail :]  # rows past the tail are invisible leftovers; a commit overwrites them
        log.extend((message_id, data, info.epoch) for message_id, data in encoded)
        backend.apply_state(thread_id, commit)
        new = replace(
            info,
            version=info.version + 1,
            tail=info.tail + len(encoded),
            turn_complete=commit.turn_complete,
        )
        if commit.turn_model_calls is not None:
            new = replace(new, turn_model_calls=commit.turn_model_calls)
        new = with_pace(new, commit)
        if commit.usage is not None:
            backend.usage.setdefault(thread_id, []).append(
                replace(commit.usage, version=new.version, tail=new.tail)
            )
            spent = backend.spend.get(info.root_id, Spend())
            backend.spend[info.root_id] = Spend(
                spent.tokens + commit.usage.tokens, spent.cost_usd + (commit.usage.cost_usd or 0.0)
            )
        backend.threads[thread_id] = new
        return new

    async def usage_records(self, thread_id: str, after_version: int = 0) -> AsyncIterator[UsageRecord]:
        for record in list(self.backend.usage.get(thread_id, [])):
            if record.version > after_version:
                yield record

    async def close_thread(self, thread_id: str) -> None:
        info = self.backend.threads.get(thread_id)
        if info is not None:
            self.backend.threads[thread_id] = replace(info, closed=True)

    async def children(self, thread_id: str) -> list[ThreadInfo]:
        if thread_id not in self.backend.threads:
            return []  # a thread that does not exist has no children (an import's root flips last)
        return [info for info in self.backend.threads.values() if info.parent_id == thread_id]

    async def save_summary(self, thread_id: str, summary: Summary) -> None:
        self.backend.summaries.setdefault(thread_id, {})[summary.up_to_order] = summary.text
        filters = self.backend.summary_filters.setdefault(thread_id, {})
        if summary.call_ids is not None:
            filters[summary.up_to_order] = summary.call_ids.encode()
        else:
            filters.pop(summary.up_to_order, None)

    async def latest_summary(self, thread_id: str, up_to: int | None = None) -> Summary | None:
        candidates = [
            order for order in self.backend.summaries.get(thread_id, {}) if up_to is None or order <= up_to
        ]
        if not candidates:
            return None
        best = max(candidates)
        encoded = self.backend.summary_filters.get(thread_id, {}).get(best)
        call_ids = CallIdFilter.decode(encoded) if encoded is not None else None
        return Summary(text=self.backend.summaries[thread_id][best], up_to_order=best, call_ids=call_ids)

    # ---- rewind and whole-history replacement ----------------------------------------------------------

    async def rewind(self, thread_id: str, rewind: Rewind) -> ThreadInfo:
        backend = self.backend
        info = backend.threads.get(thread_id)
        if info is None or info.version != rewind.expected_version:
            raise ConcurrentWriteError(f"thread {thread_id} is not at version {rewind.expected_version}")
        if not 0 <= rewind.to_order <= info.tail:
            raise InvalidRewindError(
                f"thread {thread_id}: cannot rewind to {rewind.to_order} (tail {info.tail})"
            )
        summaries = backend.summaries.get(thread_id, {})
        filters = backend.summary_filters.get(thread_id, {})
        for order in rewind.summaries_removed:
            summaries.pop(order, None)
            filters.pop(order, None)
        backend.apply_cleanup(thread_id, rewind.cleanup)
        # Rows past the new tail stay as invisible leftovers; the next commit overwrites them.
        new = replace(info, version=info.version + 1, tail=rewind.to_order, epoch=info.epoch + 1)
        backend.threads[thread_id] = new
        return new

    async def stage_history(self, thread_id: str, expected_version: int) -> _MemoryStaging:
        info = self.backend.threads.get(thread_id)
        current = info.version if info is not None else 0
        if current != expected_version:
            raise ConcurrentWriteError(f"thread {thread_id} is at version {current}, not {expected_version}")
        staging = _MemoryStaging(self.backend, thread_id, uuid.uuid4().hex[:16], expected_version, info)
        self.backend.boundary("begin:before")
        if info is not None:  # a head that does not exist yet is created by the flip, not marked
            self.backend.pending[thread_id] = (staging.generation, time.time())
        self.backend.boundary("begin:after")
        return staging

    async def sweep_generations(self, thread_id: str, *, now: float, lease_seconds: float) -> int:
        backend = self.backend
        live: str | None = None
        if (pending := backend.pending.get(thread_id)) is not None:
            if pending[1] + lease_seconds > now:
                live = pending[0]
            else:
                del backend.pending[thread_id]  # the stalled flip can no longer succeed
        current = backend.generation.get(thread_id, "")
        doomed = [key for key in backend.staged if key[0] == thread_id and key[1] not in (live, current)]
        return sum(len(backend.staged.pop(key).rows) for key in doomed)


class _MemoryStaging:
    """``HistoryStaging`` in memory: rows are encoded into a staged generation in batches, and the flip
    swaps it in with the head, the state and the cleanup in one uninterrupted step."""

    def __init__(
        self, backend: MemoryBackend, thread_id: str, generation: str, expected: int, info: ThreadInfo | None
    ) -> None:
        self.thread_id = thread_id
        self.generation = generation
        self._backend = backend
        self._expected = expected
        self._marked = info is not None
        self._flipped = False

    async def add(self, entries: AsyncIterable[HistoryEntry] | Iterable[HistoryEntry]) -> None:
        batch: list[HistoryEntry] = []
        async for entry in iterate_entries(entries):
            batch.append(entry)
            if len(batch) >= STAGING_BATCH:
                self._write(batch)
                batch = []
        if batch:
            self._write(batch)

    def _write(self, batch: list[HistoryEntry]) -> None:
        self._backend.boundary("rows:before")
        staged = self._backend.staged.setdefault((self.thread_id, self.generation), _Staged())
        for entry in batch:
            if isinstance(entry, Summary):
                staged.summaries[entry.up_to_order] = entry.text
                if entry.call_ids is not None:
                    staged.summary_filters[entry.up_to_order] = entry.call_ids.encode()
                else:
                    staged.summary_filters.pop(entry.up_to_order, None)
            else:
                item, message_id = entry
                staged.rows.append((message_id, encode_item(item)))
        self._backend.boundary("rows:after")

    async def flip(self, replacement: Replacement) -> ThreadInfo:
        backend, thread_id = self._backend, self.thread_id
        backend.boundary("flip:before")
        info = backend.threads.get(thread_id)
        if self._marked:
            ours = backend.pending.get(thread_id, ("", 0.0))[0] == self.generation
            current = info is not None and info.version == self._expected and ours
        else:
            current = info is None
        if not current:
            raise ConcurrentWriteError(f"thread {thread_id} changed while its history was being replaced")
        staged = backend.staged.pop((thread_id, self.generation), _Staged())
        base = replacement.record or info or ThreadInfo(thread_id=thread_id, root_id=thread_id)
        epoch = info.epoch + 1 if info is not None else 0
        new = replace(
            base, thread_id=thread_id, version=self._expected + 1, tail=len(staged.rows), epoch=epoch
        )
        # The old generation's rows are retired, not dropped: a sweep deletes them, as on DynamoDB.
        retired = _Staged(rows=[(m, d) for m, d, _ in backend.rows.get(thread_id, [])])
        backend.staged[(thread_id, backend.generation.get(thread_id, ""))] = retired
        backend.rows[thread_id] = [(m, d, epoch) for m, d in staged.rows]
        backend.summaries[thread_id] = staged.summaries
        backend.summary_filters[thread_id] = staged.summary_filters
        backend.generation[thread_id] = self.generation
        backend.pending.pop(thread_id, None)
        backend.apply_cleanup(thread_id, replacement.cleanup)
        if replacement.state is not None:
            backend.apply_state(thread_id, replacement.state)
        backend.threads[thread_id] = new
        self._flipped = True
        backend.boundary("flip:after")
        return new

    async def abandon(self) -> None:
        if self._flipped:
            return
        backend = self._backend
        if backend.pending.get(self.thread_id, ("", 0.0))[0] == self.generation:
            del backend.pending[self.thread_id]
        backend.staged.pop((self.thread_id, self.generation), None)


class InMemoryStateStore:
    """``StateStore`` over a :class:`MemoryBackend`."""

    def __init__(self, backend: MemoryBackend | None = None) -> None:
        self.backend = backend or MemoryBackend()

    def _state(self, thread_id: str) -> _ThreadState:
        return self.backend.thread_state(thread_id)

    async def filter_processed(self, thread_id: str, message_ids: Sequence[str]) -> set[str]:
        return set(message_ids) & self._state(thread_id).processed

    async def filter_answered(self, thread_id: str, tool_call_ids: Sequence[str]) -> set[str]:
        return set(tool_call_ids) & self._state(thread_id).answered

    async def mark_processed(self, thread_id: str, message_ids: Sequence[str]) -> None:
        self._state(thread_id).processed.update(message_ids)

    async def get_metadata(self, root_id: str) -> Any:
        return copy.deepcopy(self.backend.metadata.get(root_id))

    async def set_metadata(self, root_id: str, metadata: Any) -> None:
        self.backend.metadata[root_id] = copy.deepcopy(metadata)

    async def spend(self, root_id: str) -> Spend:
        return self.backend.spend.get(root_id, Spend())

    async def active_subscriptions(self, thread_id: str) -> set[str]:
        return set(self._state(thread_id).subscriptions)

    async def add_subscription(self, thread_id: str, tool_call_id: str) -> None:
        self._state(thread_id).subscriptions.add(tool_call_id)

    async def remove_subscription(self, thread_id: str, tool_call_id: str) -> None:
        self._state(thread_id).subscriptions.discard(tool_call_id)

    async def pending_choices(self, thread_id: str) -> list[UserChoiceRequired]:
        return list(self._state(thread_id).choices.values())

    async def add_pending_choice(self, thread_id: str, choice: UserChoiceRequired) -> None:
        self._state(thread_id).choices[choice.id] = choice

    async def remove_pending_choice(self, thread_id: str, choice_id: str) -> None:
        self._state(thread_id).choices.pop(choice_id, None)

    async def open_intents(self, thread_id: str) -> list[DispatchIntent]:
        return list(self._state(thread_id).intents.values())

    async def mark_intent_done(self, thread_id: str, tool_call_id: str) -> None:
        self._state(thread_id).intents.pop(tool_call_id, None)

    async def deferred_inputs(self, thread_id: str) -> list[DeferredInput]:
        return list(self._state(thread_id).deferred.values())

    async def indexed_call(self, thread_id: str, tool_call_id: str) -> ToolCall | None:
        return self._state(thread_id).calls.get(tool_call_id)

    async def claim_compaction(self, thread_id: str, claim_id: str, now: float, lease_seconds: float) -> bool:
        state = self._state(thread_id)
        held = state.compaction
        if held is not None and held[0] != claim_id and held[1] > now:
            return False
        state.compaction = (claim_id, now + lease_seconds)
        return True

    async def release_compaction(self, thread_id: str) -> None:
        self._state(thread_id).compaction = None

    async def cache_get(self, key: str) -> str | None:
        entry = self.backend.cache.get(key)
        if entry is None or entry[1] <= time.time():
            return None
        return entry[0]

    async def cache_put(self, key: str, value: str, expires_at: float) -> None:
        self.backend.cache[key] = (value, expires_at)


def memory_stores() -> tuple[InMemoryConversationStore, InMemoryStateStore]:
    """A conversation store and a state store sharing one backend (so commits are atomic across both)."""
    backend = MemoryBackend()
    return InMemoryConversationStore(backend), InMemoryStateStore(backend)
