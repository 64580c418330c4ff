"""Store ports: ``ConversationStore`` (thread tree + ordered logs + summaries + the atomic commit) and
``StateStore`` (per-thread key/value state), plus the whole-history replacement helper.

Guarantees every implementation must give (the contract suite in ``tests/contract`` checks them):

- A thread's log is append-only with 1-based, gap-free orders; rows become visible only through a
  :class:`Commit`, which is atomic: rows, processed message ids, answered tool calls, dispatch intents,
  subscription and deferral changes and the step's :class:`UsageRecord` all land, or none do; the
  record's tokens and cost are added to the root's :class:`Spend` in the same commit, so a conversation's
  spend counts every committed step exactly once.
- A commit is conditioned on the thread's head ``version``; if another writer committed first it raises
  :class:`~stepagent.errors.ConcurrentWriteError` and changes nothing.
- The head carries the last commit's :attr:`Commit.turn_complete` (``ThreadInfo.turn_complete``), so a
  reader can tell a thread whose turn is over from one that is still working, with one strongly
  consistent read and no access to the queues.
- Dedup reads touch only the ids asked for (``filter_processed``), never a thread-sized set.
- Compaction summaries are keyed by the order they cover; rows are never deleted by compaction. A
  summary's call-id filter is stored and read back with it (``tests/contract/test_store_contract_call_ids.py``).
- :func:`load_snapshot` (what a step reads first) returns exactly what the separate port reads would:
  the head, the own latest summary and the rows after it (or only the rows after a :class:`KnownRows`
  the caller still holds, when the head proves those unchanged), the root's metadata and the asked dedup
  ids — a store that implements :class:`SnapshotReader` does it in fewer requests, and may also say that
  a thread has no open intents, deferred inputs or pending choices so the step need not ask.
- History changes other than appends (``tests/contract/test_store_contract_replace.py``): a
  :class:`Rewind` is one conditional head update (it also moves the thread to a new epoch, and rows carry
  the epoch they were committed in, so content at a reused order is never mistaken for the old); a whole-history replacement is staged under a new
  generation (:meth:`ConversationStore.stage_history`) and made visible by one conditional head flip, so
  every reader sees exactly the old or the new history; abandoned generations are invisible and removed by
  :meth:`ConversationStore.sweep_generations`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from stepagent.history_items import HistoryItem, Summary
from stepagent.messages import InputMessage, ToolCall, UserChoiceRequired


class ThreadKind(StrEnum):
    """Why a thread exists: a root conversation, a spawned child, an event child or a compaction child."""

    ROOT = "root"
    CHILD = "child"
    SUBSCRIPTION_EVENT = "subscription_event"
    COMPACTION = "compaction"


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A thread-tree record joined with its head (commit version and last committed order)."""

    thread_id: str
    root_id: str
    parent_id: str | None = None
    spawn_order: int | None = None
    spawn_tool_call_id: str | None = None
    kind: ThreadKind = ThreadKind.ROOT
    closed: bool = False
    version: int = 0
    tail: int = 0
    #: The history epoch: 0 for a history that was only ever appended to, + 1 on every rewind and whole
    #: history replacement. Orders are reused after those; (order, epoch) never is.
    epoch: int = 0
    #: What the thread's last commit said about its turn (:attr:`Commit.turn_complete`); ``None`` when no
    #: commit has recorded it (a spawned child before its first step, an imported or older thread). A
    #: liveness flag, not part of the record: equality ignores it.
    turn_complete: bool | None = field(default=None, compare=False)
    #: Model calls of this thread since its last user text, as of the last commit that said
    #: (:attr:`Commit.turn_model_calls`); what the per-turn model-call limit counts.
    turn_model_calls: int = field(default=0, compare=False)
    #: When the thread's last turn ended (the step clock's seconds; ``None``: not recorded), and how long
    #: its person took to write after the turn before (``None``: not measured yet): what the prompt cache's
    #: ``auto`` TTL predicts the next wait for a person from (``core/cache_ttl.py``). Hints, not records.
    turn_ended_at: float | None = field(default=None, compare=False)
    person_gap: float | None = field(default=None, compare=False)
    #: The provider's input tokens per estimated token on the thread's last request (``None``: not measured):
    #: what the window accounting scales its estimate by (``ModelRequest.estimate_scale``). A hint.
    estimate_scale: float | None = field(default=None, compare=False)


def with_pace(info: ThreadInfo, commit: Commit) -> ThreadInfo:
    """``info`` with the pace and measure hints ``commit`` records (each kept when the commit leaves it ``None``)."""
    if commit.turn_ended_at is not None:
        info = dataclasses.replace(info, turn_ended_at=commit.turn_ended_at)
    if commit.person_gap is not None:
        info = dataclasses.replace(info, person_gap=commit.person_gap)
    if commit.estimate_scale is not None:
        info = dataclasses.replace(info, estimate_scale=commit.estimate_scale)
    return info


@dataclass(frozen=True, slots=True)
class Spend:
    """What a conversation (a root thread and every thread under it) has spent on model calls: tokens
    (input, output and prompt-cache tokens) and dollars (of the calls whose model has known prices)."""

    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One committed history row: its 1-based order, the input id that produced it, the item, its epoch."""

    order: int
    message_id: str
    item: HistoryItem
    #: The thread's epoch when the row was committed (see :attr:`ThreadInfo.epoch`).
    epoch: int = 0
    #: UTF-8 bytes of the row's stored encoding (:func:`~stepagent.history_items.encode_item`), when the
    #: store read it: the thread cache counts items by it, so a loaded row is not encoded again to size it.
    encoded_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DispatchIntent:
    """A committed promise to dispatch one asynchronous tool call (the outbox).

    The tool call id is the idempotency key: every (re-)dispatch of this intent uses it."""

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    call_id: str | None = None
    #: A call resumed with the user's answer to the tool's question: what the resumed request carries.
    resume: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class DeferredInput:
    """An event held back while a non-passive tool call is pending; delivered after its result."""

    message_id: str
    message: InputMessage


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """The model usage of one step, committed with the step's rows (at most one per commit).

    ``step_id`` is the logical id of the input the model answered (the id its completion rows carry);
    ``model`` the model's ``<provider>:<model id>`` name; ``completions`` the model calls that finished;
    ``turn_complete`` whether the step left the thread with nothing pending (no open call, no held
    input). ``version`` is the head version of the commit that stored it — assigned by the store, so it
    is unique and increasing per thread (0 on a record not stored yet)."""

    step_id: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    completions: int = 0
    turn_complete: bool = False
    version: int = 0
    #: The dollars the step's calls cost at the prices known when it ran (``None``: prices unknown).
    cost_usd: float | None = None
    #: The validated structured output of the turn (JSON text), when an output schema is configured.
    output: str | None = None
    #: What the step refused or gave up on, kept with the thread (JSON text: a list of objects, each an
    #: output notice's own fields plus the ``source_id`` of the input it answers; ``None``: nothing).
    #: A step that only refused inputs stores a record with no model (``model`` empty) just for these.
    notices: str | None = None

    #: The thread's last order after that commit (assigned by the store; ``None`` on records stored before
    #: it was kept): where the step's ``turn_complete`` falls among the rows, for readers replaying events.
    tail: int | None = field(default=None, compare=False)

    @property
    def ran_model(self) -> bool:
        """Whether the record is a model-running step's (not one kept only for its notices)."""
        return bool(self.model)

    @property
    def tokens(self) -> int:
        """Every token of the step: input, output, cache reads and writes (what the token limit counts)."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


@dataclass(slots=True)
class Commit:
    """Everything one step persists, applied atomically and only if the head is still at
    ``expected_version``. ``rows`` get orders ``tail+1, tail+2, ...``."""

    expected_version: int
    rows: Sequence[tuple[HistoryItem, str]] = ()
    processed_message_ids: Sequence[str] = ()
    answered_tool_calls: Sequence[str] = ()
    intents_added: Sequence[DispatchIntent] = ()
    subscriptions_added: Sequence[str] = ()
    subscriptions_removed: Sequence[str] = ()
    deferred_added: Sequence[DeferredInput] = ()
    deferred_removed: Sequence[str] = ()
    metadata: tuple[str, Any] | None = None  # (root thread id, new value)
    #: Calls that later inputs refer to (spawn and subscription calls), kept findable after compaction.
    indexed_calls: Sequence[ToolCall] = ()
    #: The step's model usage, stored under this commit's new head version (never by a replacement flip).
    #: Its tokens and cost are added to the root's :class:`Spend` in the same commit.
    usage: UsageRecord | None = None
    #: The thread's model calls since its last user text, recorded on the head (``None``: unchanged).
    turn_model_calls: int | None = None
    #: Recorded on the head when not ``None`` (see :attr:`ThreadInfo.turn_ended_at`, ``person_gap``).
    turn_ended_at: float | None = None
    person_gap: float | None = None
    #: Recorded on the head when not ``None`` (see :attr:`ThreadInfo.estimate_scale`).
    estimate_scale: float | None = None
    #: The step that makes this commit leaves the thread with nothing pending (no open call, no held input,
    #: no compaction about to start). Recorded on the head (``ThreadInfo.turn_complete``); every commit
    #: writes it, so a mid-step commit marks the turn as still running. Not a change by itself.
    turn_complete: bool = False

    def is_empty(self) -> bool:
        return not (
            self.usage is not None
            or self.indexed_calls
            or self.rows
            or self.processed_message_ids
            or self.answered_tool_calls
            or self.intents_added
            or self.subscriptions_added
            or self.subscriptions_removed
            or self.deferred_added
            or self.deferred_removed
            or self.metadata is not None
        )


@dataclass(frozen=True, slots=True)
class StateCleanup:
    """State a rewind or a history replacement removes, by id (absent entries are ignored).

    ``answered`` and ``processed`` markers are removed *before* the head moves (dropping a marker early
    is harmless: a visible result row still answers its call); everything else moves with the head."""

    intents: Sequence[str] = ()
    subscriptions: Sequence[str] = ()
    deferred: Sequence[str] = ()
    choices: Sequence[str] = ()
    indexed_calls: Sequence[str] = ()
    answered: Sequence[str] = ()
    processed: Sequence[str] = ()
    close_threads: Sequence[str] = ()
    release_compaction: bool = False


@dataclass(frozen=True, slots=True)
class Rewind:
    """A suffix cut: the thread's tail becomes ``to_order`` (rows past it turn invisible and are
    overwritten by later commits), summaries covering orders past it are dropped, and ``cleanup`` is
    applied — all conditioned on the head still being at ``expected_version``."""

    expected_version: int
    to_order: int
    summaries_removed: Sequence[int] = ()
    cleanup: StateCleanup = StateCleanup()


#: What a staged history is made of: rows ``(item, message_id)`` (orders 1, 2, ... in the order given) and
#: compaction summaries.
HistoryEntry = tuple[HistoryItem, str] | Summary


@dataclass(slots=True)
class Replacement:
    """What lands together with the head flip of a staged history.

    ``record`` sets the thread-tree fields (root, parent, spawn order and call, kind, closed) — required
    to create a child; ``None`` keeps the existing record (or creates a root). ``state`` adds state as a
    commit would (its ``rows`` and ``expected_version`` are ignored); it is read when the flip is built,
    so a caller may still fill it while the entries stream."""

    record: ThreadInfo | None = None
    state: Commit | None = None
    cleanup: StateCleanup = StateCleanup()


class HistoryStaging(Protocol):
    """One replacement of a thread's whole history, written under a fresh generation that no reader
    looks at until :meth:`flip` moves the head to it in one conditional write."""

    thread_id: str
    generation: str

    async def add(self, entries: AsyncIterable[HistoryEntry] | Iterable[HistoryEntry]) -> None:
        """Stage more rows (orders continue) and summaries. Bounded memory: rows are written in batches."""
        ...

    async def flip(self, replacement: Replacement) -> ThreadInfo:
        """Make the staged history the thread's history (version + 1, tail = rows staged), atomically and
        only if nobody changed the thread since staging began (else ``ConcurrentWriteError``)."""
        ...

    async def abandon(self) -> None:
        """Best effort: release the pending mark and delete what was staged (a sweep does it otherwise)."""
        ...


@dataclass(frozen=True, slots=True)
class KnownRows:
    """What a caller already holds of a thread's own history: the summary covering ``summary_order``
    (``None``: none) and every row after it up to ``tail``, read at head ``version`` and ``epoch``."""

    version: int
    epoch: int
    tail: int
    summary_order: int | None


@dataclass(slots=True)
class ThreadSnapshot:
    """A thread as one step first needs it (see :func:`load_snapshot`).

    ``summary`` is the own latest summary and ``rows`` the own rows after it, up to the tail — or, when
    ``incremental``, only the rows after ``known.tail`` (the caller's :class:`KnownRows` still hold: same
    epoch and summary, nothing below ``known.tail`` changed). ``summary_order`` is the order the latest
    summary covers (``None``: none). ``metadata`` is the root's (the root is ``info.root_id``, or the thread for a
    thread that does not exist). ``processed`` / ``answered`` are the subsets of the asked ids already
    recorded. ``open_intents``, ``deferred`` and ``choices`` are ``False`` when the store knows the thread
    has none (the step skips those reads), ``None`` when it must ask the state store."""

    info: ThreadInfo | None
    summary: Summary | None = None
    summary_order: int | None = None
    rows: list[StoredRow] = field(default_factory=list)
    incremental: bool = False
    metadata: Any = None
    processed: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    open_intents: bool | None = None
    deferred: bool | None = None
    choices: bool | None = None
    #: The conversation's spend so far (kept with the root; read with its metadata).
    spend: Spend = field(default_factory=Spend)


class ConversationStore(Protocol):
    """Thread tree, per-thread ordered logs, compaction summaries and the atomic step commit."""

    async def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """The thread record with its head, or ``None`` for a thread that was never created."""
        ...

    async def spawn_thread(
        self,
        parent_id: str,
        *,
        child_id: str,
        spawn_tool_call_id: str,
        kind: ThreadKind,
        spawn_order: int | None = None,
    ) -> ThreadInfo:
        """Create a child record (idempotent by ``child_id``). ``spawn_order`` defaults to the parent's tail.
        The parent's record is created as a root first if it has none."""
        ...

    def load_rows(self, thread_id: str, after: int = 0, up_to: int | None = None) -> AsyncIterator[StoredRow]:
        """Committed rows with ``after < order <= min(up_to, tail)``, ascending, streamed page by page."""
        ...

    async def commit(self, thread_id: str, commit: Commit) -> ThreadInfo:
        """Apply ``commit`` atomically (creating a root record on a first commit); return the new head."""
        ...

    async def close_thread(self, thread_id: str) -> None: ...

    def usage_records(self, thread_id: str, after_version: int = 0) -> AsyncIterator[UsageRecord]:
        """The usage records committed in the thread with ``version > after_version``, ascending by
        version, streamed page by page. Rewinds and compaction never remove them (the tokens were spent)."""
        ...

    async def children(self, thread_id: str) -> list[ThreadInfo]:
        """The thread's direct children, in the order they were spawned; none while the thread itself does
        not exist (an import creates its children before the root)."""
        ...

    async def save_summary(self, thread_id: str, summary: Summary) -> None:
        """Store a compaction summary keyed by ``summary.up_to_order`` (a second save with the same
        order replaces the first), its call-id filter (``summary.call_ids``) with it: every reader of
        the summary gets the filter back, or ``None`` when it was saved without one."""
        ...

    async def latest_summary(self, thread_id: str, up_to: int | None = None) -> Summary | None:
        """The summary with the highest ``up_to_order`` that is ``<= up_to`` (any when ``None``)."""
        ...

    async def rewind(self, thread_id: str, rewind: Rewind) -> ThreadInfo:
        """Apply ``rewind`` (one conditional head update plus its cleanup); return the new head."""
        ...

    async def stage_history(self, thread_id: str, expected_version: int) -> HistoryStaging:
        """Begin replacing the thread's history (``expected_version`` 0 for a thread that does not exist).
        Marks the head as pending (no version change) so a sweep leaves the staged generation alone."""
        ...

    async def sweep_generations(self, thread_id: str, *, now: float, lease_seconds: float) -> int:
        """Delete rows of generations the head does not point at, except a pending one younger than
        ``lease_seconds`` at ``now`` (an older pending mark is cleared first, which dooms its flip).
        Returns how many stored rows were deleted."""
        ...


class StateStore(Protocol):
    """Per-thread state that is not history: dedup markers, metadata, subscriptions, choices, outbox,
    deferred events."""

    async def filter_processed(self, thread_id: str, message_ids: Sequence[str]) -> set[str]:
        """The subset of ``message_ids`` already folded into the thread."""
        ...

    async def filter_answered(self, thread_id: str, tool_call_ids: Sequence[str]) -> set[str]:
        """The subset of ``tool_call_ids`` already answered in the thread."""
        ...

    async def mark_processed(self, thread_id: str, message_ids: Sequence[str]) -> None:
        """Record ids outside a commit (absorbed duplicates, whose history effect is nothing)."""
        ...

    async def get_metadata(self, root_id: str) -> Any: ...

    async def set_metadata(self, root_id: str, metadata: Any) -> None: ...

    async def spend(self, root_id: str) -> Spend:
        """The conversation's spend: the sum of every committed usage record of the tree (never lowered
        by rewinds, compaction or closing threads — the tokens were spent)."""
        ...

    async def active_subscriptions(self, thread_id: str) -> set[str]: ...

    async def add_subscription(self, thread_id: str, tool_call_id: str) -> None: ...

    async def remove_subscription(self, thread_id: str, tool_call_id: str) -> None: ...

    async def pending_choices(self, thread_id: str) -> list[UserChoiceRequired]: ...

    async def add_pending_choice(self, thread_id: str, choice: UserChoiceRequired) -> None:
        """Insert, or replace the choice with the same id."""
        ...

    async def remove_pending_choice(self, thread_id: str, choice_id: str) -> None: ...

    async def open_intents(self, thread_id: str) -> list[DispatchIntent]:
        """Committed dispatch intents not yet marked done, in commit order."""
        ...

    async def mark_intent_done(self, thread_id: str, tool_call_id: str) -> None: ...

    async def deferred_inputs(self, thread_id: str) -> list[DeferredInput]:
        """Deferred events in the order they were deferred."""
        ...

    async def indexed_call(self, thread_id: str, tool_call_id: str) -> ToolCall | None:
        """A call committed through ``Commit.indexed_calls`` (one point read)."""
        ...

    async def claim_compaction(self, thread_id: str, claim_id: str, now: float, lease_seconds: float) -> bool:
        """Atomically mark a compaction of ``thread_id`` as in progress. ``False`` if another claim holds
        (unexpired at ``now``); re-claiming with the same ``claim_id`` succeeds (idempotent)."""
        ...

    async def release_compaction(self, thread_id: str) -> None:
        """Clear the in-progress mark (the summary landed, or the compaction was abandoned)."""
        ...

    async def cache_get(self, key: str) -> str | None:
        """A value stored by :meth:`cache_put`, or ``None`` when absent or past its ``expires_at``."""
        ...

    async def cache_put(self, key: str, value: str, expires_at: float) -> None:
        """Store ``value`` under ``key`` (replacing any) until ``expires_at`` (epoch seconds). A small
        key/value cache for derived data (RAP manifests, which server owns a call); never history."""
        ...


@runtime_checkable
class SnapshotReader(Protocol):
    """A conversation store that reads a :class:`ThreadSnapshot` in fewer requests than the port's
    separate reads (the DynamoDB store: one ``BatchGetItem`` and at most one ``Query`` page per MB)."""

    async def open_thread(
        self,
        thread_id: str,
        *,
        message_ids: Sequence[str] = (),
        tool_call_ids: Sequence[str] = (),
        known: KnownRows | None = None,
    ) -> ThreadSnapshot: ...


async def tree_threads(store: ConversationStore, root: str) -> AsyncIterator[str]:
    """``root`` and each of its descendants, depth first, children in spawn order. A thread's children are
    read when the walk goes on past it, so a caller that stops early reads no more than it used."""
    pending = [root]
    while pending:
        current = pending.pop(0)
        yield current
        pending[0:0] = [child.thread_id for child in await store.children(current)]


async def load_snapshot(
    conversation: ConversationStore,
    state: StateStore,
    thread_id: str,
    *,
    message_ids: Sequence[str] = (),
    tool_call_ids: Sequence[str] = (),
    known: KnownRows | None = None,
) -> ThreadSnapshot:
    """The thread's :class:`ThreadSnapshot`: from the store's :class:`SnapshotReader` when it has one,
    else composed from the port's reads (head, latest summary, rows, metadata, dedup filters)."""
    if isinstance(conversation, SnapshotReader):
        return await conversation.open_thread(
            thread_id, message_ids=message_ids, tool_call_ids=tool_call_ids, known=known
        )
    return await compose_snapshot(
        conversation, state, thread_id, message_ids=message_ids, tool_call_ids=tool_call_ids, known=known
    )


async def compose_snapshot(
    conversation: ConversationStore,
    state: StateStore,
    thread_id: str,
    *,
    message_ids: Sequence[str] = (),
    tool_call_ids: Sequence[str] = (),
    known: KnownRows | None = None,
) -> ThreadSnapshot:
    """The :class:`ThreadSnapshot` composed from the port's separate reads (what every store must agree
    with; the state flags stay unknown)."""
    info = await conversation.get_thread(thread_id)
    snapshot = ThreadSnapshot(info)
    if info is not None:
        summary = await conversation.latest_summary(thread_id)
        order = summary.up_to_order if summary is not None else None
        snapshot.summary_order = order
        if known is not None and known_still_hold(known, info, order):
            snapshot.incremental = True
            after = known.tail
        else:
            snapshot.summary = summary
            after = order if order is not None else 0
        snapshot.rows = [row async for row in conversation.load_rows(thread_id, after=after)]
    root = info.root_id if info is not None else thread_id
    snapshot.metadata = await state.get_metadata(root)
    snapshot.spend = await state.spend(root)
    if message_ids:
        snapshot.processed = await state.filter_processed(thread_id, message_ids)
    if tool_call_ids:
        snapshot.answered = await state.filter_answered(thread_id, tool_call_ids)
    return snapshot


def known_still_hold(known: KnownRows, info: ThreadInfo, summary_order: int | None) -> bool:
    """Whether rows a caller read at ``known`` are still the thread's rows up to ``known.tail``: the same
    epoch (no rewind or replacement since: those move it) and summary, and the tail did not go back."""
    return (
        info.epoch == known.epoch
        and summary_order == known.summary_order
        and info.tail >= known.tail
        and info.version >= known.version
    )


async def iterate_entries(
    entries: AsyncIterable[HistoryEntry] | Iterable[HistoryEntry],
) -> AsyncIterator[HistoryEntry]:
    """``entries`` as an async iterator, whichever kind of iterable it is."""
    if isinstance(entries, AsyncIterable):
        async for entry in entries:
            yield entry
    else:
        for entry in entries:
            yield entry


async def replace_history(
    store: ConversationStore,
    thread_id: str,
    expected_version: int,
    entries: AsyncIterable[HistoryEntry] | Iterable[HistoryEntry],
    replacement: Replacement | None = None,
) -> ThreadInfo:
    """Replace the thread's whole history (rows and summaries) with ``entries``: staged under a new
    generation, then one conditional head flip. Readers see exactly the old or the new history; a failure
    before the flip abandons the staged generation (best effort; ``sweep_generations`` cleans the rest)."""
    staging = await store.stage_history(thread_id, expected_version)
    try:
        await staging.add(entries)
        return await staging.flip(replacement or Replacement())
    except Exception:
        await staging.abandon()
        raise
