"""In-memory conversation and state stores (local mode and tests).

Both stores share one :class:`MemoryBackend`, so a :class:`Commit` — which spans history and state — is
applied atomically: every method runs without awaiting in between, so no other task can observe or
interleave with a half-applied commit. Rows are stored encoded, as a real store would, so what is read
back is exactly what was persisted.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import Summary, decode_item, encode_item
from stepagent.messages import ToolCall, UserChoiceRequired
from stepagent.stores.base import Commit, DeferredInput, DispatchIntent, StoredRow, ThreadInfo, ThreadKind


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
class MemoryBackend:
    threads: dict[str, ThreadInfo] = field(default_factory=dict)
    rows: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # thread -> [(message_id, json)]
    summaries: dict[str, dict[int, str]] = field(default_factory=dict)
    state: dict[str, _ThreadState] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def thread_state(self, thread_id: str) -> _ThreadState:
        return self.state.setdefault(thread_id, _ThreadState())


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
            message_id, data = rows[order - 1]
            yield StoredRow(order=order, message_id=message_id, item=decode_item(data))

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
        log.extend(encoded)
        state = backend.thread_state(thread_id)
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
            backend.metadata[root_id] = copy.deepcopy(value)
        new = replace(info, version=info.version + 1, tail=info.tail + len(encoded))
        backend.threads[thread_id] = new
        return new

    async def close_thread(self, thread_id: str) -> None:
        info = self.backend.threads.get(thread_id)
        if info is not None:
            self.backend.threads[thread_id] = replace(info, closed=True)

    async def children(self, thread_id: str) -> list[ThreadInfo]:
        return [info for info in self.backend.threads.values() if info.parent_id == thread_id]

    async def save_summary(self, thread_id: str, summary: Summary) -> None:
        self.backend.summaries.setdefault(thread_id, {})[summary.up_to_order] = summary.text

    async def latest_summary(self, thread_id: str, up_to: int | None = None) -> Summary | None:
        candidates = [
            order for order in self.backend.summaries.get(thread_id, {}) if up_to is None or order <= up_to
        ]
        if not candidates:
            return None
        best = max(candidates)
        return Summary(text=self.backend.summaries[thread_id][best], up_to_order=best)


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


def memory_stores() -> tuple[InMemoryConversationStore, InMemoryStateStore]:
    """A conversation store and a state store sharing one backend (so commits are atomic across both)."""
    backend = MemoryBackend()
    return InMemoryConversationStore(backend), InMemoryStateStore(backend)
