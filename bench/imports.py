"""Cold import time of the worker Lambda handler, measured in fresh interpreters.

:func:`cold_import` runs ``import handlers.worker`` (what Lambda does at a cold start, before the first
event) in ``runs`` fresh subprocesses from the repository root and reports the median time of the import
itself and of the whole process (interpreter start-up included). :func:`import_costs` runs it once more
under ``python -X importtime`` and attributes the time: exclusive ("self") time summed per top-level
package, the slowest ``stepagent`` modules, and the imports directly under the handler with their
cumulative time — where to look when the import is over budget.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

_TIMED = "import time as _t; _s = _t.perf_counter(); import handlers.worker; print(_t.perf_counter() - _s)"
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( +)(\S+)")


def cold_import(root: Path, runs: int = 7) -> dict[str, Any]:
    imports: list[float] = []
    processes: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _TIMED], cwd=root, capture_output=True, text=True, check=True
        )
        processes.append((time.perf_counter() - start) * 1000)
        imports.append(float(done.stdout.strip()) * 1000)
    return {
        "runs": runs,
        "import_ms_median": round(statistics.median(imports), 1),
        "import_ms_min": round(min(imports), 1),
        "process_ms_median": round(statistics.median(processes), 1),
    }


def import_costs(root: Path, top: int = 12) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import handlers.worker"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [m for m in map(_LINE.match, done.stderr.splitlines()) if m is not None]
    by_package: Counter[str] = Counter()
    stepagent: list[tuple[int, str]] = []
    for match in lines:
        by_package[match[4].split(".")[0]] += int(match[1])
        if match[4].startswith("stepagent"):
            stepagent.append((int(match[1]), match[4]))

    def children(parent: str) -> dict[str, float]:
        """Modules first imported by ``parent``, with their cumulative time. ``-X importtime`` prints a
        module after its own imports, so they are the lines just before it, one level deeper."""
        for index, match in enumerate(lines):
            if match[4] != parent:
                continue
            depth = (len(match[3]) - 1) // 2
            found: list[tuple[int, str]] = []
            for earlier in reversed(lines[:index]):
                level = (len(earlier[3]) - 1) // 2
                if level <= depth:
                    break
                if level == depth + 1:
                    found.append((int(earlier[2]), earlier[4]))
            return {name: round(us / 1000, 1) for us, name in sorted(found, reverse=True)[:top]}
        return {}

    return {
        "total_self_ms": round(sum(by_package.values()) / 1000, 1),
        "self_ms_by_package": {name: round(us / 1000, 1) for name, us in by_package.most_common(top)},
        "slowest_stepagent_modules_self_ms": {
            name: round(us / 1000, 1) for us, name in sorted(stepagent, reverse=True)[:top]
        },
        "imported_by_lambda_entry_cumulative_ms": children("stepagent.aws.lambda_entry"),
        "imported_by_aws_runtime_cumulative_ms": children("stepagent.aws.runtime"),
    }
