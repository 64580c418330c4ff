"""``HistoryManager``: one thread's in-memory history and everything its next commit will persist.

What it guarantees:

- **Buffer discipline.** Streamed assistant content lives in :attr:`turn` (``core/turn_buffer.py``) and
  reaches history only through :meth:`flush_turn`; appending to history or syncing while the buffer
  holds content raises :class:`~stepagent.errors.InvariantViolation`.
- **Tail matching.** A tool result is accepted only as the answer to the trailing, unanswered tool call.
  Anything else appended after an unanswered call first injects ``Tool call interrupted by user``.
- **Dedup.** An input whose logical message id was already folded in is ignored; a result for an
  already-answered call is absorbed (its id recorded so a redelivery is cheap). That is only sound
  because call ids are unique in a thread: :meth:`tool_call_id_taken` lets the completion rename a
  model's call whose id is empty or reused — without a store read unless a summary hides calls and its
  call-id filter cannot rule the id out (:meth:`inherited_call_ids` is what a compaction child's
  summary carries).
- **Atomic sync.** :meth:`sync` persists new rows and what the phases added to :attr:`pending`
  (``core/pending.py``: processed ids, answered calls, dispatch intents, subscription, deferral and
  metadata changes, the step's usage record) as one :class:`~stepagent.stores.base.Commit`,
  conditioned on the head version the manager loaded (a concurrent writer makes it fail, never
  interleave). The commit carries :attr:`turn_complete` as set by the step, then it is reset to ``False``.
  Within a step only the seam (``core/effects.py``) calls it; every other method writes nothing.
- **One read to start.** :meth:`load` reads the thread through
  :func:`~stepagent.stores.base.load_snapshot` (head, latest summary and rows, root metadata and the
  batch's dedup ids together) and, given a :class:`~stepagent.core.thread_cache.ThreadCache`, offers the
  store what the cache holds so a warm step reads only rows after it; every successful sync puts the
  manager's own history back under the new head version (a failed one drops the entry). Children whose
  history starts in an ancestor are loaded through the ancestors, as before, and never cached.
- **Order bookkeeping.** Every item carries its own-log order (``None`` for inherited items), so spawn
  points and compaction splits are computed from orders, not index arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from stepagent.call_id_filter import CallIdFilter
from stepagent.core.ancestors import ancestor_chain, load_history_with_ancestors
from stepagent.core.pending import PendingCommit
from stepagent.core.thread_cache import CachedThread, ThreadCache, item_bytes
from stepagent.core.turn_buffer import TurnBuffer
from stepagent.errors import InvariantViolation
from stepagent.events import InputRejected, kept_notice
from stepagent.history_items import (
    ApprovalItem,
    EventItem,
    HistoryItem,
    Summary,
    ToolCallItem,
    ToolResultItem,
    answered_call_id,
    hidden_call_ids,
    waiting_for_approval,
)
from stepagent.messages import ToolResult
from stepagent.providers.window import unanswered_start
from stepagent.stores.base import (
    ConversationStore,
    KnownRows,
    Spend,
    StateStore,
    StoredRow,
    ThreadInfo,
    ThreadSnapshot,
    load_snapshot,
)

INTERRUPTED_TEXT = "Tool call interrupted by user"


def _own_history(
    snapshot: ThreadSnapshot, cached: CachedThread | None, *, counting: bool
) -> tuple[list[HistoryItem], list[int | None], int]:
    """A thread's own history from its snapshot: the cached items when the snapshot read only rows after
    them, else its summary (if any), then the rows read; with their orders and (``counting``) encoded size."""
    items: list[HistoryItem] = []
    orders: list[int | None] = []
    size = 0
    if snapshot.incremental and cached is not None:
        items, orders, size = list(cached.items), list(cached.orders), cached.size
    elif snapshot.summary is not None:
        items, orders = [snapshot.summary], [snapshot.summary.up_to_order]
        size = item_bytes(snapshot.summary)
    for row in snapshot.rows:
        items.append(row.item)
        orders.append(row.order)
        if counting:
            size += row.encoded_bytes if row.encoded_bytes is not None else item_bytes(row.item)
    return items, orders, size


class HistoryManager:
    """The history of one thread for one step (step mode) or one driver lifetime (local mode)."""

    def __init__(
        self,
        conversation: ConversationStore,
        state: StateStore,
        thread_id: str,
        *,
        info: ThreadInfo | None,
        ancestors: list[str],
        items: list[HistoryItem],
        orders: list[int | None],
        compacted_up_to: int | None,
        ancestor_prefix_len: int,
        metadata: Any,
    ) -> None:
        self.conversation = conversation
        self.state = state
        self.thread_id = thread_id
        self.info = info
        self.ancestors = ancestors
        self.root_thread_id = ancestors[0] if ancestors else thread_id
        #: Root first, ending with this thread.
        self.thread_stack = [*ancestors, thread_id]
        self.history = items
        self._orders = orders
        self.compacted_up_to = compacted_up_to
        self.ancestor_prefix_len = ancestor_prefix_len
        #: The root thread's metadata (what the agent profile is chosen from).
        self.metadata: Any = metadata
        self.version = info.version if info else 0
        self._next_order = (info.tail if info else 0) + 1
        #: What the next sync persists besides the rows (``core/pending.py``): the phases add to it.
        self.pending = PendingCommit()
        #: The streamed assistant output of the current model call (``core/turn_buffer.py``).
        self.turn = TurnBuffer()
        self._interrupted: list[str] = []
        self._processed: dict[str, bool] = {}
        self._answered: set[str] = {cid for item in items if (cid := answered_call_id(item)) is not None}
        self._answer_checked: set[str] = set()  # call ids whose answered status was read from the store
        self.rows_read = 0
        #: What the load read (its state flags tell the step which state reads it can skip).
        self.snapshot = ThreadSnapshot(info)
        self._cache: ThreadCache | None = None
        self._cache_size = 0
        #: Rows made durable by this manager's syncs, in order (what observers and outputs report).
        self.committed_rows: list[StoredRow] = []
        #: What the next sync records as ``Commit.turn_complete``; the step sets it before its last sync,
        #: and every sync resets it, so a mid-step commit always says the turn is still running.
        self.turn_complete = False
        #: Model calls of this thread since its last user text: as the head recorded them, plus this
        #: step's. Every sync records a changed count on the head with the rows that made it change.
        self.turn_model_calls = info.turn_model_calls if info else 0
        self._recorded_model_calls = self.turn_model_calls
        #: The step's clock: a sync that ends the turn records when on the head (``None``: not recorded).
        self.clock: Callable[[], float] | None = None
        #: How long the person took to write after the last turn, measured by this step: recorded on the
        #: head with the next sync (``core/cache_ttl.py`` predicts from it).
        self.person_gap: float | None = None
        #: The provider's tokens per estimated token on this step's last request (recorded on the head with
        #: the next sync; ``providers/window.py`` scales its estimate by it).
        self.estimate_scale: float | None = None

    # ---- construction ---------------------------------------------------------------------------------

    @classmethod
    async def load(
        cls,
        conversation: ConversationStore,
        state: StateStore,
        thread_id: str,
        *,
        message_ids: Sequence[str] = (),
        tool_call_ids: Sequence[str] = (),
        cache: ThreadCache | None = None,
    ) -> HistoryManager:
        """Rebuild the thread from the stores. An unknown thread loads empty and creates no record.
        ``message_ids`` / ``tool_call_ids``: the batch's dedup questions, answered by the same read."""
        cached = cache.get(thread_id) if cache is not None else None
        snapshot = await load_snapshot(
            conversation,
            state,
            thread_id,
            message_ids=message_ids,
            tool_call_ids=tool_call_ids,
            known=cached.known if cached is not None else None,
        )
        info = snapshot.info
        chain = await ancestor_chain(conversation, thread_id) if info and info.parent_id else []
        own = not chain or snapshot.summary_order is not None or snapshot.incremental
        if own:
            items, orders, size = _own_history(snapshot, cached, counting=cache is not None)
            compacted = snapshot.summary_order
            prefix, rows_read = 0, len(snapshot.rows)
        else:
            loaded = await load_history_with_ancestors(conversation, thread_id, chain)
            items, orders, compacted = loaded.items, loaded.orders, loaded.compacted_up_to
            prefix, rows_read, size = loaded.ancestor_prefix_len, loaded.rows_read, 0
        manager = cls(
            conversation,
            state,
            thread_id,
            info=info,
            ancestors=[link.thread_id for link in chain],
            items=items,
            orders=orders,
            compacted_up_to=compacted,
            ancestor_prefix_len=prefix,
            metadata=snapshot.metadata,
        )
        manager.rows_read = rows_read
        manager.snapshot = snapshot
        manager._processed.update({m: m in snapshot.processed for m in message_ids})
        manager._answered.update(snapshot.answered)
        manager._answer_checked.update(tool_call_ids)
        manager._cache = cache if own and not chain else None
        manager._cache_size = size
        manager._cache_put()
        return manager

    def _cache_put(self) -> None:
        """Offer the own history, as committed at the current head, to the cache."""
        cache, info = self._cache, self.info
        if cache is None or info is None:
            return
        if not self.turn.is_empty or not self.pending.is_empty():
            return  # not the committed history: keep what the cache has
        known = KnownRows(info.version, info.epoch, info.tail, self.compacted_up_to)
        orders = tuple(order or 0 for order in self._orders)
        cache.put(self.thread_id, CachedThread(known, tuple(self.history), orders, self._cache_size))

    # ---- dedup lookups ----------------------------------------------------------------------------------

    async def prefetch(self, message_ids: Iterable[str] = (), tool_call_ids: Iterable[str] = ()) -> None:
        """Resolve dedup questions for a whole batch in at most two store reads."""
        wanted = [m for m in dict.fromkeys(message_ids) if m not in self._processed]
        if wanted:
            done = await self.state.filter_processed(self.thread_id, wanted)
            self._processed.update({m: m in done for m in wanted})
        calls = list(tool_call_ids)
        tail = self.pending_tool_call()
        if tail is not None:
            calls.append(tail.call.id)
        calls = [c for c in dict.fromkeys(calls) if c not in self._answered and c not in self._answer_checked]
        if calls:
            self._answered.update(await self.state.filter_answered(self.thread_id, calls))
            self._answer_checked.update(calls)

    async def is_processed(self, message_id: str) -> bool:
        if message_id not in self._processed:
            await self.prefetch([message_id])
        return self._processed[message_id]

    def is_answered(self, tool_call_id: str) -> bool:
        return tool_call_id in self._answered

    async def tool_call_id_taken(self, tool_call_id: str) -> bool:
        """Whether a call of this thread (or of the prefix it inherited) already has ``tool_call_id``.

        The visible history holds every call unless a summary hides some. Then the summary's call-id
        filter (:attr:`Summary.call_ids`, which never misses an id it hides) settles the common case — an
        id it certainly does not hold is free, with no store read; when it says "maybe", or the summary
        has no filter, the durable answered markers are asked (every call that was ever answered has
        one), exactly as without a filter."""
        if not tool_call_id or tool_call_id in self._answered:
            return True
        if self.find_tool_call(tool_call_id) is not None:
            return True
        if any(
            isinstance(item, EventItem) and item.invocation is not None and item.invocation.id == tool_call_id
            for item in self.history
        ):
            return True
        if self.compacted_up_to is None:
            return False
        summary = self.history[0] if self.history else None
        if (
            isinstance(summary, Summary)
            and summary.up_to_order == self.compacted_up_to
            and summary.call_ids is not None
            and not summary.call_ids.might_contain(tool_call_id)
        ):
            return False
        await self.prefetch(tool_call_ids=[tool_call_id])
        return tool_call_id in self._answered

    # ---- folding inputs ---------------------------------------------------------------------------------

    async def handle_content(self, item: HistoryItem, message_id: str) -> bool:
        """Fold one input-derived item into history; ``False`` when it was a duplicate or did not apply.

        Results for an answered call are absorbed (their message id recorded as processed). A result
        that does not answer the trailing call is ignored without being recorded, so a later redelivery
        is evaluated afresh."""
        if await self.is_processed(message_id):
            return False
        if isinstance(item, ToolResultItem) or (isinstance(item, EventItem) and item.invocation is None):
            result_id = item.result.id
            if result_id not in self._answered:
                await self.prefetch(tool_call_ids=[result_id])
            if result_id in self._answered:
                self.record_processed(message_id)
                return False
            tail = self.pending_tool_call()
            if tail is None or tail.call.id != result_id:
                return False
        else:
            self._interrupt_pending_tool_call()
        self.append_generated(item, message_id)
        self.record_processed(message_id)
        return True

    def record_processed(self, message_id: str) -> None:
        """Mark an input as folded in: it will be committed with the next sync."""
        if not self._processed.get(message_id):
            self._processed[message_id] = True
            self.pending.processed.append(message_id)

    def pending_tool_call(self) -> ToolCallItem | None:
        """The trailing tool call if it is still unanswered (a person's decision on it, which follows it
        until its result arrives, does not count as an answer)."""
        index = len(self.history) - 1
        while index >= 0 and isinstance(self.history[index], ApprovalItem):
            index -= 1
        last = self.history[index] if index >= 0 else None
        if isinstance(last, ToolCallItem) and last.call.id not in self._answered:
            return last
        return None

    def waiting_for_approval(self) -> ToolCallItem | None:
        """The trailing call if it waits for a person's decision (committed, not dispatched)."""
        waiting = waiting_for_approval(self.history)
        return waiting if waiting is not None and waiting.call.id not in self._answered else None

    def _interrupt_pending_tool_call(self) -> None:
        pending = self.pending_tool_call()
        if pending is None:
            return
        call = pending.call
        self._interrupted.append(call.id)
        result = ToolResult.text(call.id, INTERRUPTED_TEXT, call_id=call.call_id)
        self.append_generated(ToolResultItem(result=result), f"{call.id}-interrupted")

    def append_generated(self, item: HistoryItem, message_id: str) -> None:
        """Append an item the runtime made (an input's, a flushed turn's, a sync-tool or unknown-tool
        result, an interruption); refused while the turn buffer holds content."""
        if not self.turn.is_empty:
            raise InvariantViolation("bug: history append while the turn buffer holds un-flushed content")
        self.history.append(item)
        self._orders.append(self._next_order)
        self._next_order += 1
        self.pending.rows.append((item, message_id))
        if self._cache is not None:
            self._cache_size += item_bytes(item)
        answered = answered_call_id(item)
        if answered is not None:
            self._answered.add(answered)
            self.pending.answered.append(answered)

    # ---- the turn buffer --------------------------------------------------------------------------------

    def flush_turn(self, *, trim_reasoning: bool = False) -> None:
        """Append the buffered turn to history (minus trailing reasoning and blank text if asked: a
        committed turn never ends on them)."""
        for item, message_id in self.turn.take(trim_reasoning=trim_reasoning):
            self.append_generated(item, message_id)

    def current_turn_view(self) -> list[HistoryItem]:
        """Committed history followed by the buffered partial turn (for replay to a client mid-stream)."""
        return [*self.history, *self.turn.items()]

    # ---- other pending changes ---------------------------------------------------------------------------

    def refuse(self, refusal: InputRejected) -> None:
        """Record a refused input: processed (a redelivery is refused again cheaply) and its ``error``
        kept with the thread by the step's commit (``UsageRecord.notices``), so every surface tells it."""
        self.record_processed(refusal.message_id)
        self.pending.keep_notice(kept_notice(refusal, refusal.message_id))

    def update_metadata(self, metadata: Any) -> None:
        self.metadata = metadata
        self.pending.metadata = (self.root_thread_id, metadata)

    # ---- commit -----------------------------------------------------------------------------------------

    async def sync(self) -> bool:
        """Commit everything pending in one atomic, version-checked write. ``False`` if nothing was pending."""
        if not self.turn.is_empty:
            raise InvariantViolation("bug: sync() called with un-flushed turn buffer content")
        commit = self.pending.to_commit(self.version, self.turn_complete)
        if commit.is_empty():
            return False
        if self.turn_model_calls != self._recorded_model_calls:
            commit.turn_model_calls = self.turn_model_calls
        if commit.turn_complete and self.clock is not None:
            commit.turn_ended_at = self.clock()
        commit.person_gap, self.person_gap = self.person_gap, None
        commit.estimate_scale, self.estimate_scale = self.estimate_scale, None
        self.turn_complete = False
        try:
            self.info = await self.conversation.commit(self.thread_id, commit)
        except BaseException:
            if self._cache is not None:
                self._cache.drop(self.thread_id)
            raise
        self.version = self.info.version
        self._recorded_model_calls = self.turn_model_calls
        if commit.usage is not None:
            spent = self.snapshot.spend
            self.snapshot.spend = Spend(
                spent.tokens + commit.usage.tokens, spent.cost_usd + (commit.usage.cost_usd or 0.0)
            )
        first_order = self.info.tail - len(commit.rows) + 1
        self.committed_rows.extend(
            StoredRow(order=first_order + index, message_id=message_id, item=item, epoch=self.info.epoch)
            for index, (item, message_id) in enumerate(commit.rows)
        )
        self.pending = PendingCommit()
        self._cache_put()
        return True

    # ---- thread tree and compaction -------------------------------------------------------------------------

    def take_interrupted_tool_calls(self) -> list[str]:
        interrupted, self._interrupted = self._interrupted, []
        return interrupted

    def safe_spawn_point(self) -> int:
        """The own-log order a child may inherit up to: everything except a trailing run of unanswered
        tool calls. Inherited items count as 0; an own summary counts as the order it covers."""
        for item, order in zip(reversed(self.history), reversed(self._orders), strict=True):
            if isinstance(item, ToolCallItem) and item.call.id not in self._answered:
                continue
            if isinstance(item, ApprovalItem) and item.tool_call_id not in self._answered:
                continue  # the decision on a call still running belongs with the call
            return order or 0
        return 0

    def compaction_point(self) -> int:
        """The own-log order a compaction summary may cover: :meth:`safe_spawn_point`, but never the
        inputs the model has not answered yet (:func:`~stepagent.providers.window.unanswered_start`) —
        they stay verbatim after the summary, so the turn that triggered a compaction is answered
        seeing itself."""
        point = self.safe_spawn_point()
        start = unanswered_start(self.history)
        for order in reversed(self._orders[:start]):
            if order is not None:
                return min(point, order)
        return 0 if start < len(self.history) else point

    async def apply_compaction(self) -> bool:
        """Replace what the latest own summary covers by the summary. ``False`` if there is none or it
        covers rows this manager has not seen."""
        summary = await self.conversation.latest_summary(self.thread_id)
        if summary is None:
            return False
        known = max((o for o in self._orders if o is not None), default=0)
        if summary.up_to_order > max(known, self.compacted_up_to or 0):
            return False
        kept = [
            (item, order)
            for item, order in zip(self.history, self._orders, strict=True)
            if order is not None and order > summary.up_to_order and not isinstance(item, Summary)
        ]
        self.history = [summary, *(item for item, _ in kept)]
        self._orders = [summary.up_to_order, *(order for _, order in kept)]
        self.compacted_up_to = summary.up_to_order
        self.ancestor_prefix_len = 0
        if self._cache is not None:
            self._cache_size = sum(map(item_bytes, self.history))
        return True

    def inherited_call_ids(self, parent_id: str, up_to_order: int) -> CallIdFilter | None:
        """The call-id filter for a summary of ``parent_id`` covering ``up_to_order``, when what that
        summary hides is exactly the prefix this thread inherited — a compaction child summarising its
        parent: the parent's model-facing history up to the spawn order (its own earlier summary or an
        ancestor's, then the rows after it, ancestors' included). ``None`` (unknown) otherwise, or when
        the prefix starts at a summary without a filter."""
        info = self.info
        if (
            info is None
            or info.parent_id != parent_id
            or info.spawn_order != up_to_order
            or self.compacted_up_to is not None
        ):
            return None
        return hidden_call_ids(self.history[: self.ancestor_prefix_len])

    def find_tool_call(self, tool_call_id: str) -> ToolCallItem | None:
        """The first tool call with this id in the visible history (inherited prefix included)."""
        for item in self.history:
            if isinstance(item, ToolCallItem) and item.call.id == tool_call_id:
                return item
        return None

    def own_items(self) -> Sequence[tuple[int | None, HistoryItem]]:
        return list(zip(self._orders, self.history, strict=True))
