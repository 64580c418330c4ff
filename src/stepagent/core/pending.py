"""``PendingCommit``: everything one thread's next commit will persist besides its history rows' order.

What it guarantees:

- **Nothing is written here.** It only collects: new rows, processed message ids, answered calls, dispatch
  intents, subscription and deferral changes, a metadata change, calls to keep findable by id, the step's
  usage record and the notices kept with it. :meth:`~stepagent.core.history.HistoryManager.sync` turns it
  into one :class:`~stepagent.stores.base.Commit` and starts a fresh one, so what a step decided reaches
  the stores atomically or not at all.
- **Idempotent ids.** Processed message ids and answered call ids are committed once each, in first-seen
  order, however often they were recorded.
- **One usage record per commit.** A later :meth:`record_usage` replaces an earlier one not yet committed;
  kept notices travel in that record (or, in a step that ran no model, in a record of no model just for
  them), so every surface can tell them after the step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from stepagent.history_items import HistoryItem, ToolCallItem
from stepagent.messages import ToolCall
from stepagent.stores.base import Commit, DeferredInput, DispatchIntent, UsageRecord


@dataclass(slots=True)
class PendingCommit:
    """The changes a thread's next commit carries (see the module docstring)."""

    rows: list[tuple[HistoryItem, str]] = field(default_factory=list)
    processed: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    intents: list[DispatchIntent] = field(default_factory=list)
    subscriptions_added: list[str] = field(default_factory=list)
    subscriptions_removed: list[str] = field(default_factory=list)
    deferred_added: list[DeferredInput] = field(default_factory=list)
    deferred_removed: list[str] = field(default_factory=list)
    metadata: tuple[str, Any] | None = None
    indexed_calls: list[ToolCall] = field(default_factory=list)
    usage: UsageRecord | None = None
    notices: list[dict[str, Any]] = field(default_factory=list)

    # ---- what the phases of a step add ----------------------------------------------------------------

    def add_intent(self, intent: DispatchIntent) -> None:
        """Dispatch ``intent`` after the commit (the outbox: it stays open until it was dispatched)."""
        self.intents.append(intent)

    def subscribe(self, tool_call_id: str, found: ToolCallItem | None = None) -> None:
        """Record the subscription ``tool_call_id`` started; its call (``found`` in history) stays findable."""
        self.subscriptions_added.append(tool_call_id)
        if found is not None:
            self.index_call(found.call)

    def unsubscribe(self, tool_call_id: str) -> None:
        """Record that the subscription ``tool_call_id`` ended."""
        self.subscriptions_removed.append(tool_call_id)

    def index_call(self, call: ToolCall) -> None:
        """Keep ``call`` findable by id after compaction hides it (events and reports refer to it)."""
        self.indexed_calls.append(call)

    def defer(self, deferred: DeferredInput) -> None:
        """Hold an input until the pending call is answered (stored durably by the commit)."""
        self.deferred_added.append(deferred)

    def undefer(self, message_id: str) -> None:
        """Release a held input: the commit that folds it in removes it from the held ones."""
        self.deferred_removed.append(message_id)

    def keep_notice(self, notice: dict[str, Any]) -> None:
        """Keep an output notice (:func:`~stepagent.events.kept_notice`) with the commit's usage record."""
        self.notices.append(notice)

    def record_usage(self, usage: UsageRecord) -> None:
        """Store the step's model usage with the commit (a later record replaces this one)."""
        self.usage = usage

    # ---- what the commit reads ---------------------------------------------------------------------------

    def is_empty(self) -> bool:
        """Whether the commit would write nothing."""
        return self.to_commit(0).is_empty()

    def to_commit(self, expected_version: int, turn_complete: bool = False) -> Commit:
        """The commit of everything collected, conditioned on ``expected_version``."""
        return Commit(
            expected_version=expected_version,
            turn_complete=turn_complete,
            rows=list(self.rows),
            processed_message_ids=list(dict.fromkeys(self.processed)),
            answered_tool_calls=list(dict.fromkeys(self.answered)),
            intents_added=list(self.intents),
            subscriptions_added=list(self.subscriptions_added),
            subscriptions_removed=list(self.subscriptions_removed),
            deferred_added=list(self.deferred_added),
            deferred_removed=list(self.deferred_removed),
            metadata=self.metadata,
            indexed_calls=list(self.indexed_calls),
            usage=self._usage_with_notices(),
        )

    def _usage_with_notices(self) -> UsageRecord | None:
        """The step's usage record carrying its notices; a step that ran no model but refused an input
        stores a record with no model just for them."""
        if not self.notices:
            return self.usage
        notices = json.dumps(self.notices, ensure_ascii=False, separators=(",", ":"))
        if self.usage is None:
            return UsageRecord(step_id=str(self.notices[-1]["source_id"]), model="", notices=notices)
        return replace(self.usage, notices=notices)
