"""Benchmarks and memory-gate instruments (``make bench``; not part of the runtime, never imported by it).

- :mod:`stepagent.bench.__main__` — runs everything, writes ``docs/benchmarks.json`` and ``docs/bench-*.png``;
- :mod:`stepagent.bench.workload` — the warm step-mode workload (the real worker handler, one record per
  invocation, in process);
- :mod:`stepagent.bench.sqlite_store` — a store pair on SQLite, whose data lives outside the Python heap;
- :mod:`stepagent.bench.memory` — retained-growth and per-step-peak measurements with their traps, one
  measurement per process (also used by ``tests/reliability/test_memory_gates.py``);
- :mod:`stepagent.bench.overhead`, :mod:`stepagent.bench.imports` — step overhead, store calls, local-mode
  throughput, cold import time;
- :mod:`stepagent.bench.png` — a dependency-free PNG line-plot writer.

Everything here may import test-only tools lazily (moto for the DynamoDB benchmark); the runtime does not
depend on this package.
"""
