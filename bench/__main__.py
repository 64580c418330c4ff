"""``make bench`` (``python -m bench``): run every benchmark, write ``docs/benchmarks.json`` and
the charts ``docs/bench-*.png``.

Sections of the JSON (each with its own method notes):

- ``cold_import``: the worker handler's cold import in fresh interpreters, against the 300 ms target, with
  the ``-X importtime`` attribution;
- ``cold_start``: the worker Lambda's cold start against the peer in one run (:mod:`bench.cold_start`):
  the handler's import as Lambda does it (built layer, template environment) next to ``import strands`` in
  the peer's venv (ratio, target 0.8), and the first invocation's CPU over a warm one's (target 300 ms)
  with the template's default model (Bedrock, answered by a loopback stand-in; the scripted model beside
  it), with the AWS clients each opens; needs moto (skipped by ``--skip-moto``) and builds the layer (a few
  minutes; ``STEPAGENT_BENCH_LAYER`` reuses one);
- ``step_overhead``: one worker step excluding the model, at 10 → 10,000 stored rows, all in context or
  compacted to 10, on the in-memory, SQLite and DynamoDB-on-moto stores, with AWS calls per step;
- ``step_costs``: DynamoDB requests, items and bytes read and written per worker step in the peer
  workload (user text → tool call → tool result → answer, ~1 KB messages) at turn 10 and turn 500 with
  compaction, cold and warm, each figure next to its target (:mod:`bench.step_costs`); the figures from
  before the step got cheaper are kept in ``docs/step-costs-before.json``;
- ``live_text``: what the live partial text costs per step (requests, bytes) with it on and off, for
  streams of 0, 2 and 5 seconds, and what one client poll of an idle thread tree costs
  (:mod:`bench.live_text`);
- ``api_stream``: DynamoDB requests a second of a client connected to the HTTP API's event stream, idle
  (per conversation, 1 and 10 streams) and while the model writes, against their targets
  (:mod:`bench.api_stream`);
- ``large_payload``: a 500 KB tool result through the worker and tool runner on moto: S3 ``PutObject``
  calls for it, ``GetObject`` calls per step (first turn, a warm and a cold later turn) and the bytes
  stored, each next to its target (:mod:`bench.large_payload`);
- ``peer_cpu``: framework CPU per turn of the peer workload, stepagent's real handlers (cold and
  warm) against LangGraph + ``DynamoDBSaver`` run from the bench-only ``.venv-peer`` on the same moto
  server, interleaved, at turn 10 and turn 500 with compaction, each ratio next to its target
  (:mod:`bench.peer_cpu`);
- ``telemetry``: per-step CPU of the peer workload with OpenTelemetry off and on (spans recorded and
  encoded as the OTLP request), and the tracer's one-time import; with ``STEPAGENT_BENCH_BASELINE`` (a
  checkout before a change) also the handler import and step CPU with it off against that tree
  (:mod:`bench.telemetry`);
- ``local_mode``: local-mode steps per second;
- ``prompt_cache``: the model-input bill of a 40-turn tool-using conversation under the project's own model
  of Anthropic's prompt cache, against the physical limit: no compaction, compaction in a 16k window at
  3.5 and 4 bytes a token, spawned children, 7-minute gaps with each cache TTL setting, each next to its
  target (:mod:`bench.prompt_cache`);
- ``memory``: the retained-growth gate (normal run and traps) and per-step peaks (see
  :mod:`bench.memory`), and the peak of one step against its model request body at 10 → 10,000 rows in
  context with its trap (``request_peaks``, :mod:`bench.request_peak`), each measured in a fresh process.

Options: ``--quick`` (a smoke run with tiny counts; its numbers mean nothing), ``--skip-moto``,
``--skip-memory``, ``--out-dir`` (default: the repository's ``docs/``), ``--only cold_start,peer_cpu`` (measure
only those sections and replace them in the existing JSON, charts redrawn), ``--charts-only``. A full run
writes ``benchmarks.partial.json`` after every section and replaces ``benchmarks.json`` only when it is
whole, so a failing section neither loses what was measured before it nor leaves a partial
``benchmarks.json``; ``measured_on`` gives each section's date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.api_stream import api_stream_costs
from bench.charts import Series, bar_groups, line_plot
from bench.cold_start import cold_start
from bench.imports import cold_import, import_costs
from bench.large_payload import large_payload_costs
from bench.live_text import live_text_costs
from bench.mcp_calls import mcp_call_costs
from bench.overhead import (
    as_dict,
    dynamodb_overhead,
    local_mode_rate,
    local_store_overhead,
    moto_dynamodb,
)
from bench.peer_cpu import peer_cpu
from bench.prompt_cache import prompt_cache_costs
from bench.telemetry import telemetry_costs

ROOT = Path(__file__).resolve().parents[1]
IMPORT_TARGET_MS = 300
# Step overhead excluding the model, against a local store: a step's own work must stay small beside the model.
OVERHEAD_TARGETS_MS = {1_000: 150, 10_000: 1_500}
SIZES = (10, 100, 1_000, 10_000)
#: The request peak target (bench.request_peak): peak <= 2x the request body + 8 MiB; the last is the trap.
REQUEST_PEAKS = (
    (10, "anthropic", "normal"),
    (1_000, "anthropic", "normal"),
    (10_000, "anthropic", "normal"),
    (10_000, "openai", "normal"),
    (10_000, "anthropic", "second-copy"),
)


async def peer_step_costs(quick: bool) -> dict[str, Any]:
    from bench.step_costs import approval_costs, dynamo_row_writer, judge, peer_costs
    from stepagent.stores.metrics import StoreMetrics

    figures = []
    async with moto_dynamodb() as moto:
        for turn in (10, 60 if quick else 500):
            result: dict[str, Any] = {}
            for mode in ("cold", "warm"):
                async with moto.fresh_tables() as tables:

                    def stores(metrics: StoreMetrics, tables: Any = tables) -> Any:
                        return tables.stores(metrics, page_size=None)

                    writer = dynamo_row_writer(tables.client, tables.conversation_table)
                    result.update(await peer_costs(stores, turn, True, f"peer{turn}", writer, modes=(mode,)))
            figures.append(result)
            print(f"  turn {turn}: cold {[s['requests'] for s in result['cold']]} requests", flush=True)
        async with moto.fresh_tables() as tables:

            def approval_stores(metrics: StoreMetrics, tables: Any = tables) -> Any:
                return tables.stores(metrics, page_size=None)

            approval = await approval_costs(approval_stores, "approval")
            print(
                f"  approval: the deciding step +{approval['decision_extra_requests']} request(s)", flush=True
            )
    targets = judge(figures[0], figures[1])
    # An approval adds at most one DynamoDB request to the deciding step (vs. an ordinary tool result).
    targets["approval_decision_extra_requests"] = {
        "value": approval["decision_extra_requests"],
        "target": 1,
        "within_target": approval["decision_extra_requests"] <= 1,
    }
    return {"turns": figures, "approval": approval, "targets": targets}


async def overheads(quick: bool, skip_moto: bool) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for store in ("memory", "sqlite"):
        for rows in SIZES:
            for in_context in sorted({rows, min(rows, 10)}):
                results.append(as_dict(await local_store_overhead(store, rows, in_context, quick=quick)))
                print(
                    f"  {store} {rows} rows, {in_context} in context: {results[-1]['median_ms']} ms",
                    flush=True,
                )
    if skip_moto:
        return results
    async with moto_dynamodb() as moto:
        for rows in SIZES:
            for in_context in sorted({rows, min(rows, 10)}):
                results.append(as_dict(await dynamodb_overhead(moto, rows, in_context, quick=quick)))
                print(
                    f"  moto {rows} rows, {in_context} in context: {results[-1]['median_ms']} ms", flush=True
                )
    return results


def memory_runs(quick: bool) -> dict[str, Any]:
    """The memory measurements, each in a fresh process (two at a time)."""
    jobs: list[tuple[str, list[str]]] = []
    for variant in ("normal", "retaining", "per-thread-cache", "creep"):
        extra = ["--measured", "120"] if quick else []
        jobs.append((f"retained/{variant}", ["retained", "--variant", variant, *extra]))
    for rows, provider, variant in REQUEST_PEAKS:
        jobs.append(
            (
                f"request/{rows}/{provider}/{variant}",
                ["--rows", str(rows), "--provider", provider, "--variant", variant],
            )
        )
    peaks = [(10, 10), (1_000, 10), (10_000, 10), (10_000, 100), (100, 100), (1_000, 1_000)]
    for rows, in_context in peaks:
        jobs.append(
            (f"peak/{rows}/{in_context}", ["peak", "--rows", str(rows), "--in-context", str(in_context)])
        )
    jobs.append(
        ("peak/10000/10/holding", ["peak", "--rows", "10000", "--in-context", "10", "--variant", "holding"])
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="stepagent-bench-memory-") as folder:
        for start in range(0, len(jobs), 2):
            running = []
            for name, args in jobs[start : start + 2]:
                out = os.path.join(folder, name.replace("/", "_") + ".json")
                module = "bench.request_peak" if name.startswith("request/") else "bench.memory"
                command = [sys.executable, "-m", module, *args, "--out", out]
                process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
                running.append((name, out, process))
            for name, out, process in running:
                if process.wait() != 0:
                    raise RuntimeError(f"memory measurement {name} failed")
                with open(out, encoding="utf-8") as handle:
                    results[name] = json.load(handle)
                print(f"  memory {name} done", flush=True)
    retained = {
        name.split("/")[1]: {
            "passes_gate": not run["failures"],
            "failures": run["failures"],
            "checkpoint_deltas_bytes": [round(c - run["baseline"]) for c in run["checkpoints"]],
            "fitted_late_growth_bytes": round(run["fitted_growth"]),
            "interval_steps": run["interval"],
            "warmup_steps": run["warmup_steps"],
            "steps": run["steps"],
            "compactions": run["compactions"],
            "tool_results": run["tool_results"],
            "threads_seen": run["threads_seen"],
        }
        for name, run in results.items()
        if name.startswith("retained/")
    }
    peaks_out = [
        {key: run[key] for key in ("variant", "rows", "in_context", "peak", "rows_read", "maxrss_growth_kb")}
        for name, run in results.items()
        if name.startswith("peak/")
    ]
    request_peaks = [run for name, run in results.items() if name.startswith("request/")]
    return {"retained": retained, "peaks": peaks_out, "request_peaks": request_peaks}


def charts(results: dict[str, Any], out_dir: Path) -> list[str]:
    written: list[str] = []

    def save(name: str, data: bytes) -> None:
        (out_dir / name).write_bytes(data)
        written.append(name)

    def shape(row: dict[str, Any], compacted: bool) -> bool:
        """Whether a measurement belongs to the compacted (10 in context) or the all-in-context line; the
        10-row measurement belongs to both."""
        return bool(row["in_context"] == (min(row["rows"], 10) if compacted else row["rows"]))

    overhead = results["step_overhead"]
    series = []
    for store in ("memory", "sqlite", "dynamodb-moto"):
        for compacted in (False, True):
            points = sorted(
                (float(r["rows"]), float(r["median_ms"]))
                for r in overhead
                if r["store"] == store and shape(r, compacted)
            )
            if points:
                label = f"{store}, {'compacted to 10' if compacted else 'all in context'}"
                series.append(Series(label, points, dashed=compacted))
    save(
        "bench-step-overhead.png",
        line_plot(
            "Step overhead, model excluded",
            "stored rows",
            "median ms per step",
            series,
            log_x=True,
            log_y=True,
        ),
    )
    moto = [r for r in overhead if r["store"] == "dynamodb-moto"]
    if moto:
        calls = [
            Series(
                "AWS calls, " + ("compacted to 10" if compacted else "all in context"),
                sorted(
                    (float(r["rows"]), float(sum(r["calls_per_step"].values())))
                    for r in moto
                    if shape(r, compacted)
                ),
                dashed=compacted,
            )
            for compacted in (False, True)
        ]
        save(
            "bench-store-calls.png",
            line_plot("DynamoDB calls per step", "stored rows", "calls", calls, log_x=True, y_min=0),
        )
    memory = results.get("memory")
    if memory:
        retained = [
            Series(
                f"{variant} ({'passes' if run['passes_gate'] else 'fails'})",
                [(0.0, 0.0)]
                + [
                    ((k + 1.0) * run["interval_steps"], delta / 1024)
                    for k, delta in enumerate(run["checkpoint_deltas_bytes"])
                ],
            )
            for variant, run in memory["retained"].items()
            if variant != "retaining"  # megabytes: off this chart (see benchmarks.json)
        ]
        save(
            "bench-retained-memory.png",
            line_plot("Retained heap after warm-up", "warm steps", "KiB over baseline", retained),
        )

        def peak_kind(peak: dict[str, Any]) -> list[str]:
            if peak["variant"] == "holding":
                return ["holding trap"]
            return [
                label
                for label, compacted in (("compacted to 10", True), ("all in context", False))
                if shape(peak, compacted)
            ]

        peak_series = []
        for label in ("compacted to 10", "all in context", "holding trap"):
            points = sorted(
                {(float(p["rows"]), p["peak"] / 2**20) for p in memory["peaks"] if label in peak_kind(p)}
            )
            if points:
                peak_series.append(Series(label, points))
        save(
            "bench-step-peak.png",
            line_plot("Traced peak of one step", "stored rows", "MiB", peak_series, log_x=True, log_y=True),
        )
    peers = peer_groups(results)
    if peers:
        save("bench-peers.png", bar_groups("Framework CPU per turn, peer workload", "ms CPU per turn", peers))
    return written


def peer_groups(results: dict[str, Any]) -> list[tuple[str, list[tuple[str, float]]]]:
    """Framework CPU per turn against the peer (``peer_cpu``: one interleaved run), bars in ms; the peer has
    no turn-500 figure (its graph does not compact)."""
    cpu = (results.get("peer_cpu") or {}).get("median_cpu_ms_per_turn")
    if not cpu:
        return []
    groups: list[tuple[str, list[tuple[str, float]]]] = []
    for turn in (10, 500):
        bars = [
            ("stepagent cold", cpu.get(f"stepagent_cold_turn_{turn}")),
            ("stepagent warm", cpu.get(f"stepagent_warm_turn_{turn}")),
            ("LangGraph + DynamoDBSaver", cpu.get(f"peer_turn_{turn}")),
        ]
        groups.append((f"turn {turn}", [(label, value) for label, value in bars if value]))
    return groups


def _cold_import(args: argparse.Namespace) -> dict[str, Any]:
    imports = cold_import(ROOT, runs=3 if args.quick else 9)
    imports["target_ms"] = IMPORT_TARGET_MS
    imports["within_target"] = imports["import_ms_median"] <= IMPORT_TARGET_MS
    imports["costs"] = import_costs(ROOT)
    return imports


def _step_overhead(args: argparse.Namespace) -> list[dict[str, Any]]:
    return asyncio.run(overheads(args.quick, args.skip_moto))


def _overhead_targets(overhead: list[dict[str, Any]]) -> dict[str, Any]:
    memory_all = {
        r["rows"]: r["median_ms"] for r in overhead if r["store"] == "memory" and r["in_context"] == r["rows"]
    }
    return {
        f"{rows} rows all in context (memory store)": {
            "target_ms": target,
            "median_ms": memory_all.get(rows),
            "within_target": memory_all.get(rows, float("inf")) <= target,
        }
        for rows, target in OVERHEAD_TARGETS_MS.items()
    }


def _telemetry(args: argparse.Namespace) -> dict[str, Any]:
    baseline = os.environ.get("STEPAGENT_BENCH_BASELINE")
    return telemetry_costs(
        ROOT, Path(baseline) if baseline else None, runs=1 if args.quick else 5, steps=5 if args.quick else 60
    )


@dataclass(frozen=True)
class Section:
    """One section of ``benchmarks.json``: its key, what it is called while it runs, and how it is measured."""

    key: str
    title: str
    measure: Callable[[argparse.Namespace], Any]
    moto: bool = False  # needs moto (skipped by --skip-moto)
    memory: bool = False  # a memory section (skipped by --skip-memory)


SECTIONS = (
    Section("cold_import", "cold import", _cold_import),
    Section(
        "cold_start",
        "cold start (worker vs peer)",
        lambda a: asyncio.run(cold_start(runs=3 if a.quick else 9)),
        moto=True,
    ),
    Section("step_overhead", "step overhead", _step_overhead),
    Section(
        "step_costs", "step costs (peer workload)", lambda a: asyncio.run(peer_step_costs(a.quick)), moto=True
    ),
    Section("live_text", "live partial text", lambda a: asyncio.run(live_text_costs(a.quick)), moto=True),
    Section("api_stream", "api event stream", lambda a: asyncio.run(api_stream_costs(a.quick)), moto=True),
    Section("large_payload", "large payload", lambda a: asyncio.run(large_payload_costs()), moto=True),
    Section(
        "peer_cpu",
        "framework CPU per turn against LangGraph + DynamoDBSaver",
        lambda a: asyncio.run(
            peer_cpu(repetitions=1, late_seeded=40) if a.quick else peer_cpu(repetitions=5)
        ),
        moto=True,
    ),
    Section("telemetry", "telemetry off and on", _telemetry),
    Section("local_mode", "local mode", lambda a: asyncio.run(local_mode_rate(quick=a.quick))),
    Section("prompt_cache", "prompt cache bill", lambda a: asyncio.run(prompt_cache_costs(quick=a.quick))),
    Section("memory", "memory", lambda a: memory_runs(a.quick), memory=True),
    Section("mcp_calls", "MCP requests per step", lambda a: asyncio.run(mcp_call_costs(a.quick))),
)


def main(argv: list[str] | None = None) -> None:
    keys = [section.key for section in SECTIONS]
    parser = argparse.ArgumentParser(prog="python -m bench", description="stepagent benchmarks")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run, not a measurement")
    parser.add_argument("--skip-moto", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--charts-only", action="store_true", help="redraw the charts from an existing benchmarks.json"
    )
    parser.add_argument(
        "--only",
        metavar="SECTION[,SECTION...]",
        help=f"measure only these sections and replace them in an existing benchmarks.json ({', '.join(keys)})",
    )
    args = parser.parse_args(argv)
    only = [key.strip() for key in args.only.split(",") if key.strip()] if args.only else None
    unknown = sorted(set(only or ()) - set(keys))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; the sections are {', '.join(keys)}")
    logging.getLogger("stepagent").setLevel(logging.WARNING)  # the worker logs every step at INFO
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "benchmarks.json"
    if args.charts_only:
        print(", ".join(charts(json.loads(out.read_text(encoding="utf-8")), args.out_dir)))
        return

    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    if only is not None:
        results: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        chosen = [section for section in SECTIONS if section.key in only]
        progress = out  # the other sections stay as they are
    else:
        results = {
            "generated_by": "make bench (python -m bench)" + (" --quick" if args.quick else ""),
            "date": today,
            "environment": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
            },
        }
        chosen = [
            section
            for section in SECTIONS
            if not (section.moto and args.skip_moto) and not (section.memory and args.skip_memory)
        ]
        # A full run replaces the results only once it is whole; until then its sections go to a side
        # file, which a failing section leaves behind with everything measured before it.
        progress = out.with_name("benchmarks.partial.json")
    for number, section in enumerate(chosen, 1):
        print(f"[{number}/{len(chosen)}] {section.title} ...", flush=True)
        results[section.key] = section.measure(args)
        results.setdefault("measured_on", {})[section.key] = today
        if section.key == "step_overhead":
            results["step_overhead_targets"] = _overhead_targets(results["step_overhead"])
        progress.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    results["charts"] = charts(results, args.out_dir)
    progress.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if progress != out:
        progress.replace(out)
    measured = ", ".join(section.key for section in chosen)
    print(f"wrote {out} ({measured}) and {', '.join(results['charts'])}")


if __name__ == "__main__":
    main()
