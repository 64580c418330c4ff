"""Token usage of a thread tree, summed from the usage record every model-running step committed.

``await thread_usage(conversation, "conv-1")`` is what ``stepagent usage THREAD`` prints and what a client
calls: the thread and all its descendants (children, subscription-event and compaction threads).

Guarantees:

- Exact: each step's record is committed atomically with the step (``stores.base.UsageRecord``), so a
  total counts every committed step once — never a retried or redelivered one twice, never a step whose
  commit failed.
- What was spent: rewinds, compaction and closing threads never lower a total.
- ``input_tokens`` is the providers' uncached input; prompt-cache reads and writes are counted apart
  (``cache_read_tokens``, ``cache_write_tokens``). ``completions`` counts model calls, ``steps`` the
  steps that ran the model.
- ``cost_usd``: each step's dollars as computed when it ran (the prices then), else at ``prices`` now;
  absent when no model of the tree has known prices (:mod:`stepagent.providers.prices`).
- Reads are streamed: one usage-records read per thread of the tree (a paginated Query on DynamoDB) and
  the tree walk, never the history rows. ``None`` for a thread that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from stepagent.history_items import UserItem
from stepagent.output_schema import OUTPUT_CHECK_ID
from stepagent.providers.base import Usage
from stepagent.providers.prices import CATALOG_PRICES, PriceTable
from stepagent.stores.base import ConversationStore, UsageRecord, tree_threads


@dataclass(frozen=True, slots=True)
class TokenTotals:
    """Summed usage records: tokens (cache reads and writes apart from ``input_tokens``), model calls and
    steps."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    completions: int = 0
    steps: int = 0
    #: Dollars, summed over the records whose model has known prices (``None``: none has).
    cost_usd: float | None = None

    def plus(self, record: UsageRecord, cost: float | None = None) -> TokenTotals:
        """These totals plus one record (``cost``: its dollars, when known)."""
        return TokenTotals(
            self.input_tokens + record.input_tokens,
            self.output_tokens + record.output_tokens,
            self.cache_read_tokens + record.cache_read_tokens,
            self.cache_write_tokens + record.cache_write_tokens,
            self.completions + record.completions,
            self.steps + 1,
            _add_cost(self.cost_usd, cost),
        )

    def __add__(self, other: TokenTotals) -> TokenTotals:
        return TokenTotals(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.completions + other.completions,
            self.steps + other.steps,
            _add_cost(self.cost_usd, other.cost_usd),
        )

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.cost_usd is None:
            del out["cost_usd"]
        else:
            out["cost_usd"] = round(self.cost_usd, 6)
        return out


def _add_cost(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else a + b


def record_cost(record: UsageRecord, prices: PriceTable = CATALOG_PRICES) -> float | None:
    """The dollars one step's record cost: as stored when the step ran, else at ``prices`` now."""
    if record.cost_usd is not None:
        return record.cost_usd
    usage = Usage(
        record.input_tokens, record.output_tokens, record.cache_read_tokens, record.cache_write_tokens
    )
    return prices.cost(record.model, usage)


@dataclass(frozen=True, slots=True)
class UsageReport:
    """A thread tree's usage: in total, per model (``<provider>:<model id>``) and per thread (tree order,
    the asked thread first)."""

    thread_id: str
    total: TokenTotals = TokenTotals()
    models: dict[str, TokenTotals] = field(default_factory=dict)
    threads: dict[str, TokenTotals] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The ``stepagent usage --json`` shape."""
        return {
            "thread_id": self.thread_id,
            "total": self.total.as_dict(),
            "models": {model: totals.as_dict() for model, totals in self.models.items()},
            "threads": [{"thread_id": thread, **totals.as_dict()} for thread, totals in self.threads.items()],
        }

    def lines(self) -> list[str]:
        """Human-readable lines."""
        total = self.total
        out = [
            f"thread {self.thread_id} ({len(self.threads)} thread{'s' if len(self.threads) != 1 else ''}): "
            f"{total.input_tokens:,} input tokens, {total.output_tokens:,} output tokens, "
            f"{total.completions:,} model call{'s' if total.completions != 1 else ''} "
            f"in {total.steps:,} step{'s' if total.steps != 1 else ''}"
            + (f", ${total.cost_usd:,.4f}" if total.cost_usd is not None else "")
        ]
        if total.cost_usd is None and total.completions:
            out.append("  cost: unknown (no prices for these models; set STEPAGENT_PRICES)")
        if total.cache_read_tokens or total.cache_write_tokens:
            out.append(
                f"  prompt cache: {total.cache_read_tokens:,} tokens read, {total.cache_write_tokens:,} written"
            )
        if self.models:
            out.append("  by model:")
            out += [f"    {model}: {_short(t)}" for model, t in self.models.items()]
        if len(self.threads) > 1:
            out.append("  by thread:")
            out += [
                f"    {thread}{' (root)' if thread == self.thread_id else ''}: {_short(t)}"
                for thread, t in self.threads.items()
            ]
        return out


def _short(totals: TokenTotals) -> str:
    return (
        f"{totals.input_tokens:,} in, {totals.output_tokens:,} out, {totals.completions:,} "
        f"call{'s' if totals.completions != 1 else ''}"
        + (f", ${totals.cost_usd:,.4f}" if totals.cost_usd is not None else "")
    )


def summarize(
    thread_id: str, records: Iterable[tuple[str, UsageRecord]], prices: PriceTable = CATALOG_PRICES
) -> UsageReport:
    """A report from ``(thread id, record)`` pairs (threads keep their first-seen order)."""
    total = TokenTotals()
    models: dict[str, TokenTotals] = {}
    threads: dict[str, TokenTotals] = {}
    for thread, record in records:
        cost = record_cost(record, prices)
        total = total.plus(record, cost)
        models[record.model] = models.get(record.model, TokenTotals()).plus(record, cost)
        threads[thread] = threads.get(thread, TokenTotals()).plus(record, cost)
    return UsageReport(thread_id, total, models, threads)


async def thread_usage(
    conversation: ConversationStore, thread_id: str, prices: PriceTable = CATALOG_PRICES
) -> UsageReport | None:
    """The usage of ``thread_id`` and every descendant (see the module docstring)."""
    if await conversation.get_thread(thread_id) is None:
        return None
    pairs: list[tuple[str, UsageRecord]] = []
    threads: list[str] = []
    async for current in tree_threads(conversation, thread_id):
        threads.append(current)
        async for record in conversation.usage_records(current):
            if record.ran_model:  # a record kept only for a step's notices counts nothing
                pairs.append((current, record))
    report = summarize(thread_id, pairs, prices)
    # Threads that never ran the model still belong to the tree (with zero usage).
    ordered = {thread: report.threads.get(thread, TokenTotals()) for thread in threads}
    return UsageReport(thread_id, report.total, report.models, ordered)


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What one turn of a conversation spent: a turn starts with a user message on the root thread and
    lasts until the next one, with the usage of the threads the root started meanwhile (children and
    compaction threads, and theirs). ``complete``: the root has finished it (the last turn may still be
    running); ``text``: the user message that started it (``None``: steps before any user message)."""

    turn: int
    totals: TokenTotals
    complete: bool
    text: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "complete": self.complete, "text": self.text, **self.totals.as_dict()}

    def line(self) -> str:
        state = "" if self.complete else " (in progress)"
        said = "" if self.text is None else f" {_quote(self.text)}"
        return f"turn {self.turn}{said}{state}: {_short(self.totals)}"


def _quote(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return "«" + (text if len(text) <= limit else text[: limit - 1] + "…") + "»"


async def turn_usage(
    conversation: ConversationStore, root_id: str, prices: PriceTable = CATALOG_PRICES
) -> list[TurnUsage] | None:
    """Per turn of ``root_id``'s conversation, what it spent (``None``: no such thread). A step counts in
    the turn its commit ended in (by the root's order after it); a thread under the root counts whole in
    the turn during which its root-level ancestor was spawned (a child that lives on across turns is
    counted in the turn that started it). Reads the root's rows once and each thread's usage records."""
    info = await conversation.get_thread(root_id)
    if info is None:
        return None
    starts: list[tuple[int, str | None]] = []  # (order of the user message, its text)
    async for row in conversation.load_rows(root_id):
        if isinstance(row.item, UserItem) and not is_output_check(row.message_id):
            starts.append(
                (row.order, row.item.text if row.item.text is not None else f"[{row.item.content.type}]")
            )
    if not starts or starts[0][0] > 1:
        starts.insert(0, (0, None))  # steps before the first user message (an imported or seeded root)
    totals = [TokenTotals() for _ in starts]
    index = 0
    async for record in conversation.usage_records(root_id):
        index = _turn_at(starts, record.tail) if record.tail is not None else index
        totals[index] = totals[index].plus(record, record_cost(record, prices))
    spawned_at: dict[str, int | None] = {}  # thread -> the spawn order of its root-level ancestor
    async for thread in tree_threads(conversation, root_id):
        child = None if thread == root_id else await conversation.get_thread(thread)
        if child is None:
            continue
        order = child.spawn_order if child.parent_id == root_id else spawned_at.get(child.parent_id or "")
        spawned_at[thread] = order
        at = _turn_at(starts, order)
        async for record in conversation.usage_records(thread):
            totals[at] = totals[at].plus(record, record_cost(record, prices))
    turns = [
        TurnUsage(n, spent, True, text)
        for n, ((_, text), spent) in enumerate(zip(starts, totals, strict=True), 1)
    ]
    if turns and starts[0][1] is None and not turns[0].totals.steps:
        turns = [TurnUsage(t.turn - 1, t.totals, t.complete, t.text) for t in turns[1:]]
    if turns and info.turn_complete is False:
        last = turns[-1]
        turns[-1] = TurnUsage(last.turn, last.totals, False, last.text)
    return turns


def is_output_check(message_id: str) -> bool:
    """Whether a user row with this id is the runtime's feedback on an answer that did not match the
    output schema (it continues the turn; nobody typed it)."""
    return OUTPUT_CHECK_ID in message_id


def _turn_at(starts: list[tuple[int, str | None]], order: int | None) -> int:
    """The turn whose root rows include ``order`` (the last turn when it cannot be told)."""
    if order is None:
        return len(starts) - 1
    found = 0
    for index, (start, _) in enumerate(starts):
        if start <= order:
            found = index
    return found
