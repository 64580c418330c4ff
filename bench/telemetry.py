"""What OpenTelemetry costs: nothing with it off (measured against the tree before it), and what it adds on.

:func:`telemetry_costs` measures, each in fresh interpreters:

- **off, against a baseline tree** (``baseline``: a checkout without this feature, e.g. the main branch):
  the worker handler's cold import (``import handlers.worker``) and the CPU per worker step of the peer
  workload (:mod:`bench.workload`: user text → tool call → tool result → answer, compaction; in-memory
  stores, scripted model), the two trees interleaved run by run so machine load hits both alike;
- **on**: the same steps with an :class:`~stepagent.telemetry.otel.OtelTracer` recording every span and
  each step's spans encoded as the OTLP request (the export minus the network), and the one-time import
  of the SDK and the OTLP/HTTP exporter on top of the handler's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

_STEPS_CHILD = """
import asyncio, json, sys, time
from stepagent.stores.memory import memory_stores
from bench.workload import Workload

async def main(mode, warmup, steps):
    conversation, state = memory_stores()
    workload = Workload.build(conversation, state)
    tracer = None
    if mode == "on":
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from stepagent.telemetry.otel import OtelTracer
        tracer = OtelTracer(None)
        workload.worker.system.config.tracer = tracer
    cpus, spans, request_bytes = [], [], []
    for n in range(warmup + steps):
        start = time.process_time()
        await workload.step()
        if tracer is not None:
            taken = tracer.take()
            body = encode_spans(taken).SerializeToString()
        cpu = (time.process_time() - start) * 1000
        if n >= warmup:
            cpus.append(cpu)
            if tracer is not None:
                spans.append(len(taken))
                request_bytes.append(len(body))
    print(json.dumps({"cpus": cpus, "spans": spans, "bytes": request_bytes}))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""

_IMPORT_CHILD = (
    "import time as _t; _s = _t.perf_counter(); import handlers.worker; print(_t.perf_counter() - _s)"
)

_ON_IMPORT_CHILD = """
import time
import handlers.worker
from stepagent import telemetry
start = time.process_time()
tracer = telemetry.tracer_from_env()
assert tracer is not None
print((time.process_time() - start) * 1000)
"""


def _env(tree: Path, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**clean, "PYTHONPATH": f"{tree / 'src'}:{tree}", **extra}


def _run(tree: Path, code: str, *args: str, **extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tree,
        env=_env(tree, **extra),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def telemetry_costs(root: Path, baseline: Path | None, *, runs: int = 5, steps: int = 60) -> dict[str, Any]:
    """The section ``telemetry`` of ``docs/benchmarks.json`` (see the module docstring); without a
    ``baseline`` tree, only off against on."""
    warmup = 10
    imports: dict[str, list[float]] = {"baseline": [], "off": []} if baseline else {"off": []}
    step_cpu: dict[str, list[float]] = {"off": [], "on": []}
    if baseline is not None:
        step_cpu["baseline"] = []
    per_run: dict[str, list[float]] = {label: [] for label in step_cpu}
    spans: list[float] = []
    request_bytes: list[float] = []
    on_import: list[float] = []
    for _ in range(runs):
        trees = ([("baseline", baseline)] if baseline is not None else []) + [("off", root)]
        for label, tree in trees:
            imports[label].append(float(_run(tree, _IMPORT_CHILD)) * 1000)
        for label, tree, mode in [*((label, tree, "off") for label, tree in trees), ("on", root, "on")]:
            found = json.loads(_run(tree, _STEPS_CHILD, mode, str(warmup), str(steps)))
            step_cpu[label].extend(found["cpus"])
            per_run[label].append(_median(found["cpus"]))
            if mode == "on":
                spans.extend(found["spans"])
                request_bytes.extend(found["bytes"])
        on_import.append(
            float(_run(root, _ON_IMPORT_CHILD, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"))
        )
    medians = {label: _median(values) for label, values in step_cpu.items()}
    return {
        "method": (
            "fresh interpreters, baseline tree and this one interleaved run by run; worker steps of the peer "
            "workload (bench.workload, in-memory stores, scripted model), median CPU ms per step; on: every "
            "span recorded and each step's spans encoded as the OTLP/HTTP request body (the network is not "
            "counted); on_import: building the tracer (importing the SDK and the exporter) after the handler"
        ),
        "baseline": str(baseline) if baseline is not None else None,
        "runs": runs,
        "steps_per_run": steps,
        "handler_import_ms_median": {label: _median(values) for label, values in imports.items()},
        "step_cpu_ms_median": medians,
        # The run-to-run spread of each tree's median: the noise the differences below are judged against.
        "step_cpu_ms_per_run_medians": per_run,
        "off_minus_baseline_cpu_ms": (
            round(medians["off"] - medians["baseline"], 3) if "baseline" in medians else None
        ),
        "on_minus_off_cpu_ms": round(medians["on"] - medians["off"], 3),
        "spans_per_step_median": _median(spans),
        "otlp_request_bytes_per_step_median": _median(request_bytes),
        "on_import_cpu_ms_median": _median(on_import),
    }


if __name__ == "__main__":  # python -m bench.telemetry BASELINE_TREE: measure and merge into docs/
    here = Path(__file__).resolve().parents[1]
    section = telemetry_costs(here, Path(sys.argv[1]).resolve())
    out = here / "docs" / "benchmarks.json"
    existing = json.loads(out.read_text(encoding="utf-8"))
    existing["telemetry"] = section
    out.write_text(json.dumps(existing, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(section, indent=2))
