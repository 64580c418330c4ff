"""Exporting holds one row at a time: the tracemalloc peak of exporting a 10,000-row thread stays within a
few MiB of exporting a 10-row thread (peaks are measured, never time), and a trap that keeps every line —
what a non-streaming export would do — fails the same gate.

The in-memory store is used so the store's own data lives outside the measured window (the rows are
stored before measuring; reading one yields a fresh, short-lived object). moto's server runs inside the
test process and would pollute the heap we measure.
"""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from stepagent.history_items import Summary
from stepagent.lifecycle import export_lines
from stepagent.stores.base import Commit, ConversationStore, StateStore
from stepagent.stores.memory import memory_stores
from tests.lifecycle import call, result, user

GATE = 3 * 1024 * 1024  # "a few MiB": far below the ~12 MB that holding 10,000 rows takes


async def seeded(rows: int) -> tuple[ConversationStore, StateStore, str]:
    conv, state = memory_stores()
    thread = f"t{rows}"
    version, order = 0, 0
    while order < rows:
        batch = []
        for _ in range(min(1000, rows - order)):
            order += 1
            text = f"row {order:06d} " + f"{order:06d}" * 170  # ~1 KB, unique per row (no shared objects)
            if order % 10 == 9:
                batch.append((call(f"c{order}", q=text[:50]), f"x{order}"))
            elif order % 10 == 0:
                batch.append((result(f"c{order - 1}", text), f"c{order - 1}"))
            else:
                batch.append((user(text), f"m{order}"))
        info = await conv.commit(thread, Commit(expected_version=version, rows=batch))
        version = info.version
    for up_to in range(rows // 4, rows, max(rows // 4, 1)):
        await conv.save_summary(thread, Summary(f"summary up to {up_to}", up_to))
    return conv, state, thread


async def export_peak(
    conv: ConversationStore, state: StateStore, thread: str, sink: Callable[[str], None]
) -> int:
    """Peak traced bytes above the starting point while exporting ``thread`` into ``sink``."""
    gc.collect()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    async for line in export_lines(conv, state, thread):
        sink(line)
    return tracemalloc.get_traced_memory()[1] - base


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


async def test_exporting_ten_thousand_rows_peaks_like_exporting_ten(traced: None) -> None:
    small, big = await seeded(10), await seeded(10_000)
    digest = hashlib.sha256()
    lines = 0

    def consume(line: str) -> None:  # what writing to stdout does: nothing is kept
        nonlocal lines
        digest.update(line.encode())
        lines += 1

    await export_peak(*small, consume)  # warm-up: imports, caches, pydantic validators
    small_peak = await export_peak(*small, consume)
    lines = 0
    big_peak = await export_peak(*big, consume)
    assert lines == 10_000 + 3 + 3  # rows, header + thread + end, summaries: the export really ran
    assert big_peak - small_peak < GATE, (small_peak, big_peak)

    # The trap: the same export, but the sink keeps every line. It must fail the gate.
    kept: list[str] = []
    trap_peak = await export_peak(*big, kept.append)
    assert len(kept) == lines
    assert trap_peak - small_peak > 3 * GATE, (small_peak, trap_peak)
