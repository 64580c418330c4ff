"""Rewind a thread: drop everything after a committed order, as one conditional write.

Guarantees:

- **Never inside a pair.** A cut that would keep a tool call while dropping its answer (a tool result, or
  an event that answers it) or a person's decision on it moves back to just before that call, repeatedly, until no kept call has a
  dropped answer; the effective order is reported. A child whose first rows answer the call it inherited
  cannot be cut before them (there is no earlier start to move to): that is refused with a clear error.
- **One atomic change.** The head's tail moves to the cut (version + 1, conditioned on the version this
  plan was computed from) together with the cleanup of what started past the cut: compaction summaries
  covering dropped orders, open outbox intents and pending choices of dropped calls, subscriptions and
  call-index entries they started, deferred events that refer to them or to children being closed, and the
  children spawned past the cut (closed, with their descendants; an abandoned compaction's claim is
  released). Answered markers of dropped calls are removed too, so a model that issues the same call id
  again gets it dispatched and answered.
- **Inputs stay processed.** Processed markers are kept: redelivering an input whose turns were dropped
  does not bring them back. The one exception is an asynchronous tool result (its message id is its call
  id): its call is gone, so its redelivery would be ignored anyway, and keeping the marker would swallow the
  answer to a re-issued call with the same id.
- **Races.** A step committing between planning and writing makes the write fail on the head version; the
  rewind is then re-planned from the new head (``attempts`` times) or, with ``expected_version`` given,
  fails at once with :class:`~stepagent.errors.ConcurrentWriteError`.
- **No-op.** Rewinding to the current tail writes nothing.

Planning reads the thread's rows once per candidate cut (one row at a time), so memory stays bounded by
the ids of the calls involved, not by the history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepagent.errors import ConcurrentWriteError, TransactionConflictError
from stepagent.history_items import ApprovalItem, EventItem, ToolCallItem, ToolResultItem, answered_call_id
from stepagent.lifecycle.export import LifecycleError
from stepagent.messages import ThreadReport
from stepagent.stores.base import ConversationStore, Rewind, StateCleanup, StateStore, ThreadInfo, ThreadKind


@dataclass(frozen=True, slots=True)
class RewindResult:
    """What a rewind did: the order asked for and the one the thread now ends at, what it dropped and closed,
    and the head's new version."""

    thread_id: str
    requested: int
    effective: int  # the order the thread now ends at (requested, or moved back to a pair's start)
    dropped_rows: int
    version: int
    closed_threads: list[str] = field(default_factory=list)
    cleanup: StateCleanup = field(default_factory=StateCleanup)
    summaries_removed: list[int] = field(default_factory=list)


async def rewind_thread(
    conversation: ConversationStore,
    state: StateStore,
    thread_id: str,
    to_order: int,
    *,
    expected_version: int | None = None,
    attempts: int = 3,
) -> RewindResult:
    """Drop the rows of ``thread_id`` after ``to_order`` (see the module docstring)."""
    for attempt in range(1, attempts + 1):
        info = await conversation.get_thread(thread_id)
        if info is None:
            raise LifecycleError(f"no thread {thread_id!r} to rewind")
        if expected_version is not None and info.version != expected_version:
            raise ConcurrentWriteError(
                f"thread {thread_id} is at version {info.version}, not {expected_version}: it changed"
            )
        if not 0 <= to_order <= info.tail:
            raise LifecycleError(f"thread {thread_id} has orders 1..{info.tail}; cannot rewind to {to_order}")
        try:
            return await _rewind_once(conversation, state, info, to_order)
        except TransactionConflictError:
            if attempt == attempts:
                raise  # not a change of the thread: the caller may simply try again (retry_transient)
        except ConcurrentWriteError:
            if expected_version is not None or attempt == attempts:
                raise ConcurrentWriteError(
                    f"thread {thread_id} kept changing while it was being rewound ({attempt} attempt(s)); "
                    "try again when it is idle"
                ) from None
    raise AssertionError("unreachable")  # the loop returns or raises


async def _rewind_once(
    conversation: ConversationStore, state: StateStore, info: ThreadInfo, to_order: int
) -> RewindResult:
    thread_id = info.thread_id
    cut = await effective_cut(conversation, info, to_order)
    if cut == info.tail:
        return RewindResult(thread_id, to_order, cut, 0, info.version)
    dropped_calls: set[str] = set()
    answered: set[str] = set()
    processed: list[str] = []
    async for row in conversation.load_rows(thread_id, after=cut, up_to=info.tail):
        item = row.item
        if isinstance(item, ToolCallItem):
            dropped_calls.add(item.call.id)
        if (answer := answered_call_id(item)) is not None:
            answered.add(answer)
        if isinstance(item, ToolResultItem) and row.message_id == item.result.id:
            processed.append(row.message_id)  # an async tool result (see the module docstring)
    closing, compaction = await _children_to_close(conversation, info, cut, dropped_calls)
    spawn_calls = {child.spawn_tool_call_id or "" for child in closing if child.parent_id == thread_id}
    subscriptions = sorted(await state.active_subscriptions(thread_id) & dropped_calls)
    closed_ids = {child.thread_id for child in closing}
    deferred = [
        d.message_id
        for d in await state.deferred_inputs(thread_id)
        if (synthetic := d.message.synthetic) is not None
        and (
            getattr(synthetic, "tool_call_id", None) in dropped_calls
            or (isinstance(synthetic, ThreadReport) and synthetic.child_thread_id in closed_ids)
        )
    ]
    cleanup = StateCleanup(
        intents=[
            i.tool_call_id for i in await state.open_intents(thread_id) if i.tool_call_id in dropped_calls
        ],
        subscriptions=subscriptions,
        deferred=deferred,
        choices=[c.id for c in await state.pending_choices(thread_id) if c.id in dropped_calls],
        # Only spawn and subscription calls are indexed; those are what events could still refer to.
        indexed_calls=sorted(spawn_calls | set(subscriptions)),
        answered=sorted(answered),
        processed=processed,
        close_threads=[child.thread_id for child in closing],
        release_compaction=compaction,
    )
    summaries = await _summaries_after(conversation, thread_id, cut)
    rewind = Rewind(expected_version=info.version, to_order=cut, summaries_removed=summaries, cleanup=cleanup)
    new = await conversation.rewind(thread_id, rewind)
    closed = [child.thread_id for child in closing]
    return RewindResult(thread_id, to_order, cut, info.tail - cut, new.version, closed, cleanup, summaries)


async def effective_cut(conversation: ConversationStore, info: ThreadInfo, to_order: int) -> int:
    """``to_order``, moved back until no call at or before it is answered after it."""
    cut = to_order
    while cut < info.tail:
        open_calls: dict[str, int] = {}  # calls at or before the cut, not answered by then
        own_calls: set[str] = set()
        earliest: int | None = None
        async for row in conversation.load_rows(info.thread_id, up_to=info.tail):
            item = row.item
            answer = answered_call_id(item)
            if isinstance(item, EventItem) and item.invocation is not None:
                answer = None  # a self-contained event pair: its own call and result in one row
            if isinstance(item, ToolCallItem):
                own_calls.add(item.call.id)
                if row.order <= cut:
                    open_calls[item.call.id] = row.order
            elif isinstance(item, ApprovalItem):
                if row.order > cut and item.tool_call_id in open_calls:
                    # A kept call without its decision would wait for a person again after it ran.
                    start = open_calls[item.tool_call_id]
                    earliest = start if earliest is None else min(earliest, start)
            elif answer is not None and row.order <= cut:
                open_calls.pop(answer, None)
            elif answer in open_calls:
                start = open_calls[answer]
                earliest = start if earliest is None else min(earliest, start)
            elif answer is not None and answer not in own_calls and info.parent_id is not None:
                raise LifecycleError(
                    f"thread {info.thread_id}: row {row.order} answers tool call {answer!r}, which it "
                    f"inherited from its parent; the earliest order it can be rewound to is {row.order}"
                )
        if earliest is None:
            return cut
        cut = earliest - 1
    return cut


async def _children_to_close(
    conversation: ConversationStore, info: ThreadInfo, cut: int, dropped_calls: set[str]
) -> tuple[list[ThreadInfo], bool]:
    """Open children spawned past the cut (by a dropped call, or inheriting dropped rows), with their open
    descendants; and whether one of them was a running compaction (its claim must be released)."""
    closing: list[ThreadInfo] = []
    compaction = False
    for child in await conversation.children(info.thread_id):
        spawned_after = child.spawn_tool_call_id in dropped_calls or (child.spawn_order or 0) > cut
        if not spawned_after:
            continue
        compaction = compaction or (child.kind == ThreadKind.COMPACTION and not child.closed)
        pending = [child]
        while pending:
            thread = pending.pop(0)
            if not thread.closed:
                closing.append(thread)
            pending.extend(await conversation.children(thread.thread_id))
    return closing, compaction


async def _summaries_after(conversation: ConversationStore, thread_id: str, cut: int) -> list[int]:
    found: list[int] = []
    bound: int | None = None
    while (summary := await conversation.latest_summary(thread_id, bound)) is not None:
        if summary.up_to_order <= cut:
            break
        found.append(summary.up_to_order)
        bound = summary.up_to_order - 1
    return found
