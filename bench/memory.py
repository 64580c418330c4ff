"""Memory gates: a warm worker retains nothing per step, and a step holds little beyond its context.

Two gates: retained growth over many warm worker steps, judged by a trend estimator, and the peak of one
step at 10 versus 10,000 stored rows — each with deliberately leaking variants ("traps") that the *same*
predicate must reject.

Measurement (Python heap, ``tracemalloc``): a *settled reading* is ``gc.collect()`` three times, then the
traced current size. The stores are :mod:`~bench.sqlite_store` (SQLite's pages are outside the
traced heap, as DynamoDB would be), so the heap holds only the runtime and what a step reads back.

Retained growth, :func:`retained`: the :mod:`~bench.workload` runs; warm-up lasts at least
``warmup_min`` steps and ends when the Theil-Sen slope of the last six readings (one every 25 steps) is
under :data:`CONVERGED_PER_50` bytes per 50 steps. Then a baseline and :data:`CHECKPOINTS` checkpoints
``interval`` steps apart, each the median of the settled readings after each of the last five steps
before it (settled heap alternates between GC generations from step to step). The predicate,
:func:`verdict`: every checkpoint - baseline < :data:`ALLOWANCE` (1 MiB), and the fitted growth over the
late checkpoints (Theil-Sen slope of checkpoints 3..6 x their span) < :data:`LATE_GROWTH`.

Traps (``VARIANTS``; negative controls, never constructed by the runtime): ``retaining`` keeps every row
any step loads in a module-level list; ``per-thread-cache`` keeps each thread's last loaded history in a
dict keyed by thread id and never releases it (threads close and new ones keep arriving); ``creep`` leaks
a unique :data:`CREEP_BYTES`-byte string per step; ``unbounded-thread-cache`` runs the worker's own thread
cache (``core/thread_cache.py``, which every run uses at :data:`CACHE_BYTES`, full and evicting) with no
bound, keeping every version of every thread it is given (a cache keyed by head version that never lets go).

Per-step peak, :func:`step_peak`: one warm step (user text → model → commit → outputs) on a thread
with ``rows`` stored rows of ~4 KB, of which ``in_context`` follow the latest compaction summary; the peak
is the traced peak during the step minus the traced size before it. The ``holding`` trap reads every
stored row of the thread during the step (what a non-streaming, compaction-ignoring load would do).

Run as ``python -m bench.memory retained --variant normal --out r.json`` or
``python -m bench.memory peak --rows 10000 --in-context 10 --out p.json``: one measurement per
fresh process, so measurements never share a heap.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import hashlib
import json
import logging
import os
import resource
import statistics
import tempfile
import tracemalloc
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.sqlite_store import SqliteBackend, SqliteConversationStore, SqliteStateStore
from bench.workload import Workload
from stepagent.core.thread_cache import CachedThread, ThreadCache
from stepagent.history_items import AssistantText, HistoryItem, Summary, UserItem
from stepagent.messages import InputMessage, TextContent
from stepagent.stores.base import Commit, StoredRow

ALLOWANCE = 1 << 20
#: Late fitted growth bound. It started at 256 KiB, to be tightened once calibrated; the normal run
#: measures about -5 KB here (docs/benchmarks.json), so 32 KiB leaves a wide margin and still rejects a leak
#: of a few hundred bytes per step over the ~430 late steps.
LATE_GROWTH = 32 << 10
CONVERGED_PER_50 = 16 << 10
CHECKPOINTS = 6
READING_EVERY = 25
WINDOW = 5
CREEP_BYTES = 300
PEAK_BOUND = 8 << 20

VARIANTS = ("normal", "retaining", "per-thread-cache", "creep", "unbounded-thread-cache")
#: The warm worker's thread cache bound in the retained-growth runs: small enough that the cache is full
#: (at its bound, evicting) well before warm-up ends, so the gate judges a worker whose cache is at its
#: bound. The ``unbounded-thread-cache`` trap is the same cache without a bound, keeping
#: an entry per (thread, head version) it is given (:class:`EveryVersionCache`).
CACHE_BYTES = 24 << 10
PEAK_VARIANTS = ("normal", "holding")


class EveryVersionCache(ThreadCache):
    """Trap: the worker's thread cache with no bound that also keeps every version of every thread it is
    given (keyed by thread and head version, never evicted)."""

    def __init__(self) -> None:
        super().__init__(max_bytes=1 << 62)
        self.kept: dict[tuple[str, int], CachedThread] = {}

    def put(self, thread_id: str, entry: CachedThread) -> None:
        self.kept[(thread_id, entry.known.version)] = entry
        super().put(thread_id, entry)


def settled() -> int:
    """Traced heap after full collections (the reading every gate uses)."""
    for _ in range(3):
        gc.collect()
    return tracemalloc.get_traced_memory()[0]


def theil_sen(ys: Sequence[float]) -> float:
    """Median of all pairwise slopes of equally spaced readings (one outlier cannot move it much)."""
    slopes = [(ys[j] - ys[i]) / (j - i) for i in range(len(ys)) for j in range(i + 1, len(ys))]
    return statistics.median(slopes)


def verdict(
    baseline: float, checkpoints: Sequence[float], allowance: int = ALLOWANCE, late_growth: int = LATE_GROWTH
) -> tuple[list[str], float]:
    """``([], fitted growth)`` when the series passes the gate, else the reasons it fails."""
    failures = [
        f"checkpoint {k + 1}: {c - baseline:+.0f} B >= {allowance} B"
        for k, c in enumerate(checkpoints)
        if c - baseline >= allowance
    ]
    late = list(checkpoints[2:])
    fitted = theil_sen(late) * (len(late) - 1) if len(late) > 1 else 0.0
    if fitted >= late_growth:
        failures.append(f"late fitted growth {fitted:.0f} B >= {late_growth} B")
    return failures, fitted


# ---- traps ------------------------------------------------------------------------------------------------

_KEPT: list[Any] = []  # the retaining and creep traps' module-level leaks


class RetainingStore(SqliteConversationStore):
    """Trap: every row any step loads is kept forever."""

    async def load_rows(
        self, thread_id: str, after: int = 0, up_to: int | None = None
    ) -> AsyncIterator[StoredRow]:
        async for row in super().load_rows(thread_id, after, up_to):
            _KEPT.append(row)
            yield row


class PerThreadCacheStore(SqliteConversationStore):
    """Trap: each thread's last loaded history, cached by thread id and never released."""

    def __init__(self, backend: SqliteBackend) -> None:
        super().__init__(backend)
        self.cache: dict[str, list[StoredRow]] = {}

    async def load_rows(
        self, thread_id: str, after: int = 0, up_to: int | None = None
    ) -> AsyncIterator[StoredRow]:
        loaded: list[StoredRow] = []
        self.cache[thread_id] = loaded
        async for row in super().load_rows(thread_id, after, up_to):
            loaded.append(row)
            yield row


class HoldingStore(SqliteConversationStore):
    """Trap for the peak probe: a load reads and holds every stored row of the thread."""

    async def load_rows(
        self, thread_id: str, after: int = 0, up_to: int | None = None
    ) -> AsyncIterator[StoredRow]:
        everything = [row async for row in super().load_rows(thread_id)]
        for row in everything:
            if row.order > after and (up_to is None or row.order <= up_to):
                yield row


class CountingStore(SqliteConversationStore):
    """Counts the rows ``load_rows`` yields (work, not memory)."""

    rows_read = 0

    async def load_rows(
        self, thread_id: str, after: int = 0, up_to: int | None = None
    ) -> AsyncIterator[StoredRow]:
        async for row in super().load_rows(thread_id, after, up_to):
            self.rows_read += 1
            yield row


def _conversation_for(variant: str, backend: SqliteBackend) -> SqliteConversationStore:
    kinds: dict[str, type[SqliteConversationStore]] = {
        "retaining": RetainingStore,
        "per-thread-cache": PerThreadCacheStore,
        "holding": HoldingStore,
    }
    return kinds.get(variant, CountingStore)(backend)


# ---- retained growth ----------------------------------------------------------------------------------


@dataclass
class RetainedRun:
    variant: str
    warmup_steps: int
    interval: int
    baseline: float
    checkpoints: list[float]
    readings: list[list[int]]
    warmup_readings: list[int]
    steps: int
    user_messages: int
    compactions: int
    tool_results: int
    threads_seen: int
    retained_by_trap: int
    cache_bound: int = 0
    cache_bytes_at_warmup: int = 0
    cache_bytes: int = 0
    cache_threads: int = 0
    cache_evictions: int = 0
    fitted_growth: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def deltas(self) -> list[float]:
        return [c - self.baseline for c in self.checkpoints]


async def retained(
    variant: str = "normal",
    *,
    warmup_min: int = 250,
    warmup_max: int = 600,
    measured: int = 850,
    path: str | None = None,
) -> RetainedRun:
    """Run the workload and judge its retained growth (tracemalloc must be tracing)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    backend = SqliteBackend(path or ":memory:")
    conversation = _conversation_for(variant, backend)
    cache = EveryVersionCache() if variant == "unbounded-thread-cache" else ThreadCache(CACHE_BYTES)
    workload = Workload.build(
        conversation, SqliteStateStore(backend), compact_after_tokens=3000, thread_cache=cache
    )
    creep: Callable[[int], None] = (
        (lambda step: _KEPT.append(f"{step:010d}" * (CREEP_BYTES // 10)))
        if (variant == "creep")
        else (lambda step: None)
    )

    async def step() -> None:
        await workload.step()
        creep(workload.steps)

    warmup: list[int] = []
    while workload.steps < warmup_max:
        for _ in range(READING_EVERY):
            await step()
        warmup.append(settled())
        converged = len(warmup) >= 6 and theil_sen(warmup[-6:]) * (50 / READING_EVERY) < CONVERGED_PER_50
        if converged and workload.steps >= warmup_min:
            break
    warmup_steps = workload.steps
    cache_at_warmup = cache.size
    interval = measured // CHECKPOINTS

    async def reading_window() -> list[int]:
        values = []
        for _ in range(WINDOW):
            await step()
            values.append(settled())
        return values

    readings = [await reading_window()]
    for _ in range(CHECKPOINTS):
        for _ in range(interval - WINDOW):
            await step()
        readings.append(await reading_window())
    medians = [statistics.median(r) for r in readings]
    run = RetainedRun(
        variant=variant,
        warmup_steps=warmup_steps,
        interval=interval,
        baseline=medians[0],
        checkpoints=medians[1:],
        readings=readings,
        warmup_readings=warmup,
        steps=workload.steps,
        user_messages=workload.user_messages,
        compactions=workload.compactions_applied,
        tool_results=workload.tool_results,
        threads_seen=workload.threads_seen,
        retained_by_trap=len(_KEPT)
        + sum(len(v) for v in getattr(conversation, "cache", {}).values())
        + len(getattr(cache, "kept", {})),
        cache_bound=cache.max_bytes,
        cache_bytes_at_warmup=cache_at_warmup,
        cache_bytes=cache.size,
        cache_threads=len(cache),
        cache_evictions=cache.evictions,
    )
    run.failures, run.fitted_growth = verdict(run.baseline, run.checkpoints)
    return run


# ---- per-step peak -------------------------------------------------------------------------------------


@dataclass
class PeakRun:
    variant: str
    rows: int
    in_context: int
    peak: int
    maxrss_growth_kb: int
    rows_read: int
    tail_after: int


def _seed_item(order: int) -> HistoryItem:
    text = f"row {order}: " + (hashlib.sha256(f"row/{order}".encode()).hexdigest() * 63)[:4000]
    return UserItem(content=TextContent(text=text)) if order % 2 else AssistantText(text)


async def seed(conversation: SqliteConversationStore, thread_id: str, rows: int, in_context: int) -> None:
    """``rows`` stored rows of ~4 KB; a compaction summary covers all but the last ``in_context``."""
    version, order = 0, 0
    while order < rows:
        batch: list[tuple[HistoryItem, str]] = []
        for _ in range(min(500, rows - order)):
            order += 1
            batch.append((_seed_item(order), f"seed-{order}"))
        info = await conversation.commit(thread_id, Commit(expected_version=version, rows=batch))
        version = info.version
    if in_context < rows:
        await conversation.save_summary(thread_id, Summary("SUMMARY of the earlier rows", rows - in_context))


async def step_peak(rows: int, in_context: int, variant: str = "normal") -> PeakRun:
    """The traced peak of one warm step on a thread with ``rows`` stored rows (tracemalloc must trace)."""
    if variant not in PEAK_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {PEAK_VARIANTS}")
    with tempfile.TemporaryDirectory(prefix="stepagent-peak-") as folder:
        backend = SqliteBackend(os.path.join(folder, "store.sqlite"))
        conversation = _conversation_for(variant, backend)
        # A window no history reaches: the probe is exactly one step (no compaction request follows it).
        workload = Workload.build(conversation, SqliteStateStore(backend), compact_after_tokens=10**10)
        await seed(conversation, "warm", min(rows, 10), min(in_context, 10))
        await seed(conversation, "probe", rows, in_context)
        # Warm-up: the same kind of step on another thread (imports, validators, caches).
        await workload.queue.send(InputMessage.user_text("warm", "hello there", id="warm-1"), "warm-1")
        await workload.step()
        before_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        base = settled()
        tracemalloc.reset_peak()
        rows_read_before = getattr(conversation, "rows_read", 0)
        await workload.queue.send(InputMessage.user_text("probe", "hello there", id="probe-1"), "probe-1")
        await workload.step()
        peak = tracemalloc.get_traced_memory()[1] - base
        info = await conversation.get_thread("probe")
        if workload.queue.pending or info is None or info.tail != rows + 2:
            raise AssertionError(f"the probe step did not run as one plain step: {info}")
        return PeakRun(
            variant=variant,
            rows=rows,
            in_context=in_context,
            peak=peak,
            maxrss_growth_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_rss,
            rows_read=getattr(conversation, "rows_read", 0) - rows_read_before,
            tail_after=info.tail if info is not None else 0,
        )


# ---- command line (one measurement per process) ------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("retained", help="retained growth over many warm steps")
    one.add_argument("--variant", choices=VARIANTS, default="normal")
    one.add_argument("--measured", type=int, default=850)
    one.add_argument("--out", required=True)
    two = sub.add_parser("peak", help="the peak of one step")
    two.add_argument("--rows", type=int, required=True)
    two.add_argument("--in-context", type=int, required=True)
    two.add_argument("--variant", choices=PEAK_VARIANTS, default="normal")
    two.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    logging.getLogger("stepagent").setLevel(logging.WARNING)  # the worker logs every step at INFO
    tracemalloc.start()
    result: RetainedRun | PeakRun
    if args.command == "retained":
        result = asyncio.run(retained(args.variant, measured=args.measured))
    else:
        result = asyncio.run(step_peak(args.rows, args.in_context, args.variant))
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(dataclasses.asdict(result), out)


if __name__ == "__main__":
    main()
