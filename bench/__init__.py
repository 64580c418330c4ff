"""Benchmarks and memory-gate instruments (``make bench``; not part of the runtime, never imported by it).

- :mod:`bench.__main__` — runs everything, writes ``docs/benchmarks.json`` and ``docs/bench-*.png``;
- :mod:`bench.workload` — the warm step-mode workload (the real worker handler, one record per
  invocation, in process);
- :mod:`bench.sqlite_store` — a store pair on SQLite, whose data lives outside the Python heap;
- :mod:`bench.memory` — retained-growth and per-step-peak measurements with their traps, one
  measurement per process (also used by ``tests/reliability/test_memory_gates.py``);
- :mod:`bench.overhead`, :mod:`bench.imports` — step overhead, store calls, local-mode
  throughput, cold import time;
- :mod:`bench.charts` — the charts, drawn with matplotlib (a `dev` extra, not a runtime dependency).

Everything here may import test-only tools lazily (moto for the DynamoDB benchmark); the runtime does not
depend on this package.
"""
