"""Memory gates with traps: a warm worker retains nothing per step, and a step holds little beyond what is
in context. Measured on warm step-mode handling: the real worker handler, the scripted model, a function
tool, and a store outside the traced heap (``bench.sqlite_store``; see ``bench.memory`` for the method).

- **Retained growth.** ~1,100 worker invocations over 20 interleaved conversations that keep being
  replaced by new ones (~4 KB tool results every other step, a compaction every ~7 steps): after a
  warm-up that ends by convergence, six checkpoints over 850 warm steps must each stay within 1 MiB of the
  baseline, and the late fitted growth (Theil-Sen) must stay under 32 KiB. Three traps run the same
  workload and are judged by the *same* predicate; each must fail it: ``retaining`` (every loaded row
  kept in a module-level list), ``per-thread-cache`` (each thread's last loaded rows cached by thread id,
  never released) and ``creep`` (a unique 300-byte string leaked per step, which stays under the
  allowance at every checkpoint: only the trend estimator catches it).
  A fourth trap, ``unbounded-thread-cache``, gives the worker's own thread cache (which every run uses,
  full and evicting at ``bench.memory.CACHE_BYTES``) no bound and an entry per head version: it must fail
  too.
- **Per-step peak.** The traced peak of one step on a thread with 10,000 stored rows (~4 KB each;
  a compaction summary leaves 10, or 100, in context) stays within 8 MiB of the same step at 10 rows; a
  trap that reads and holds every stored row during the step exceeds the bound (by more than twice; it
  measures ~45 MB).

Each measurement runs in a fresh process (one heap per measurement); the memory processes run two at a
time. Readings are heap sizes and row counts, never time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.memory import ALLOWANCE, LATE_GROWTH, PEAK_BOUND, theil_sen, verdict
from bench.sqlite_store import sqlite_stores
from tests.reliability.scenarios import SCENARIOS, check_memory_world, rows_of, run_memory

PARALLEL = 2
#: The repository root: ``bench`` is a top-level development package there, not part of the wheel.
ROOT = Path(__file__).resolve().parents[2]


def measure(jobs: Sequence[Sequence[str]], module: str = "bench.memory") -> list[dict[str, Any]]:
    """Run ``python -m <module> <args> --out <file>`` for each job, ``PARALLEL`` at a time."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stepagent-memory-") as folder:
        outs = [os.path.join(folder, f"{n}.json") for n in range(len(jobs))]
        for start in range(0, len(jobs), PARALLEL):
            running = [
                subprocess.Popen(
                    [sys.executable, "-m", module, *jobs[n], "--out", outs[n]],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for n in range(start, min(start + PARALLEL, len(jobs)))
            ]
            for process in running:
                _, errors = process.communicate()
                assert process.returncode == 0, errors[-3000:]
        for out in outs:
            with open(out, encoding="utf-8") as handle:
                results.append(json.load(handle))
    return results


# ---- the predicate itself ---------------------------------------------------------------------------


def test_the_predicate_passes_flat_noise_and_one_outlier_and_fails_a_steady_creep() -> None:
    flat = [1000, -3000, 2000, -1000, 3000, 0]
    assert verdict(0, flat) == ([], pytest.approx(theil_sen(flat[2:]) * 3))
    assert verdict(0, [0, 500, 400_000, 0, 600, 0])[0] == []  # one outlier moves no median
    creep = [n * (LATE_GROWTH // 3 + 2000) for n in range(1, 7)]  # under the allowance everywhere
    failures, fitted = verdict(0, creep)
    assert all(c < ALLOWANCE for c in creep) and fitted >= LATE_GROWTH and len(failures) == 1
    assert verdict(0, [0, 0, 0, 0, 0, ALLOWANCE])[0][0] == f"checkpoint 6: +{ALLOWANCE} B >= {ALLOWANCE} B"


# ---- retained growth -----------------------------------------------------------------------------------


def test_retained_growth_stays_bounded_and_every_trap_fails_the_same_gate() -> None:
    variants = ["normal", "retaining", "per-thread-cache", "creep"]
    jobs = [["retained", "--variant", v] for v in variants]
    # The thread-cache trap leaks fast: a shorter measured window (still six checkpoints) is enough.
    jobs.append(["retained", "--variant", "unbounded-thread-cache", "--measured", "300"])
    normal, retaining, cache, creep, unbounded = measure(jobs)
    # Every run's worker has its thread cache; the normal run's is full (evicting) throughout.
    assert normal["cache_evictions"] > 0 and 0 < normal["cache_bytes"] <= normal["cache_bound"]
    assert unbounded["failures"] and unbounded["retained_by_trap"] > 100
    for run in (normal, retaining, cache, creep):
        # A real workload, not a vacuous pass: the measured window really ran, with tool results,
        # compactions and new threads throughout.
        assert run["steps"] - run["warmup_steps"] == 5 + 6 * run["interval"]
        assert run["compactions"] >= 80 and run["tool_results"] >= 250 and run["threads_seen"] >= 40

    deltas = [c - normal["baseline"] for c in normal["checkpoints"]]
    assert normal["failures"] == [], (deltas, normal["fitted_growth"])
    assert max(abs(d) for d in deltas) < ALLOWANCE

    assert retaining["failures"] and retaining["retained_by_trap"] > 1000
    assert any(f.startswith("checkpoint") for f in retaining["failures"])
    assert cache["failures"] and cache["retained_by_trap"] > 100
    # The creep stays under the allowance at every checkpoint: only the trend estimator rejects it.
    assert creep["failures"] and all(f.startswith("late fitted growth") for f in creep["failures"])
    assert creep["fitted_growth"] >= 2 * LATE_GROWTH > 2 * normal["fitted_growth"]


# ---- per-step peak -------------------------------------------------------------------------------------


def test_one_step_at_ten_thousand_rows_peaks_like_one_step_at_ten() -> None:
    small, big, wider, trap = measure(
        [
            ["peak", "--rows", "10", "--in-context", "10"],
            ["peak", "--rows", "10000", "--in-context", "10"],
            ["peak", "--rows", "10000", "--in-context", "100"],
            ["peak", "--rows", "10000", "--in-context", "10", "--variant", "holding"],
        ]
    )
    # Compaction bounds what a step loads: the rows after the latest summary, never the stored history.
    assert [small["rows_read"], big["rows_read"], wider["rows_read"]] == [10, 10, 100]
    assert big["peak"] - small["peak"] < PEAK_BOUND, (small, big)
    assert wider["peak"] - small["peak"] < PEAK_BOUND, (small, wider)
    assert trap["peak"] - small["peak"] > 2 * PEAK_BOUND, trap  # holding 10,000 rows of ~4 KB: ~45 MB


# ---- the benchmark store is a faithful store -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_the_sqlite_benchmark_store_keeps_every_invariant_and_the_same_history(name: str) -> None:
    """The memory gates rely on the SQLite store behaving like the real ones: every scenario passes every
    check on it and stores the same history as on the in-memory store."""
    on_memory = await run_memory(SCENARIOS[name])
    on_sqlite = await run_memory(SCENARIOS[name], stores=sqlite_stores)
    memory_snap, memory_problems = await check_memory_world(on_memory)
    sqlite_snap, sqlite_problems = await check_memory_world(on_sqlite)
    assert memory_problems == sqlite_problems == []
    assert rows_of(sqlite_snap) == rows_of(memory_snap)
    assert on_sqlite.plan.log == on_memory.plan.log  # the same I/O, call for call
