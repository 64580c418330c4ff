"""Request peak memory gate: one step with N = 10, 1,000 and 10,000 rows of ~4 KB all in context, through
the Anthropic and OpenAI providers and a transport that reads the body as a server would, peaks at most
twice its request body plus 8 MiB (``bench.request_peak``: the real worker handler, a store outside the
traced heap). A trap that keeps a serialised second copy of the body while it is sent must exceed the same
bound at 10,000 rows. Readings are traced heap sizes and byte counts, never time; each measurement runs in
a fresh process (its own file, so it runs beside the retained-growth and per-step peak gates)."""

from __future__ import annotations

from bench.memory import PEAK_BOUND
from tests.reliability.test_memory_gates import measure


def test_one_step_peaks_under_twice_its_request_body_plus_8_mib_and_a_second_copy_fails() -> None:
    jobs = [["--rows", str(rows)] for rows in (10, 1000, 10000)]
    jobs += [["--rows", "10000", "--provider", "openai"], ["--rows", "10000", "--variant", "second-copy"]]
    *runs, trap = measure(jobs, module="bench.request_peak")
    for run in runs:
        # Every row was in the request: nothing compacted or truncated away.
        assert run["rows_read"] == run["rows"] and run["body"] > run["rows"] * 4000, run
        assert run["peak"] <= 2 * run["body"] + PEAK_BOUND, run
    assert trap["rows_read"] == 10000 and trap["body"] == runs[2]["body"]
    assert trap["peak"] > 2 * trap["body"] + PEAK_BOUND, trap
