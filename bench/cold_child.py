"""One cold start of a Lambda handler, run as a script in a fresh interpreter by :mod:`bench.cold_start`.

Started as ``python -I [-S] cold_child.py`` with one JSON request on stdin: ``{"path": [...], "module": ...,
"function": ..., "events": [...]}``. It puts ``path`` first on ``sys.path`` (the function's code, as Lambda's
``/var/task``, then the package source and the layer), imports ``module`` (and the modules of ``also``,
if any) timing it (wall and CPU), notes
the modules and the AWS clients alive after the import, then calls ``function`` once per event in order
with a Lambda-like context, timing each call's CPU (``time.process_time``: this process only, so a moto
server in another process is not counted) and noting the AWS (botocore) and httpx clients it created,
and the modules loaded after the last call. With
no ``function`` it only imports (the peer's ``import strands``). The answer is one JSON line on stdout;
whatever the handler prints or logs goes to stderr.

Before the timed import it imports only what Lambda's own runtime has imported by then (``json``, ``os``,
``time``, ...): no ``typing``, no ``uuid``, so the import is measured from a bare interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from types import ModuleType  # loaded at start-up anyway


class Context:
    """The attributes of Lambda's context object that the handlers and powertools read."""

    def __init__(self) -> None:
        self.aws_request_id = os.urandom(16).hex()
        self.function_name = "WorkerFunction"
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 1024
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:WorkerFunction"
        self.log_group_name = "/aws/lambda/WorkerFunction"
        self.log_stream_name = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def load_watch() -> ModuleType:
    """:mod:`bench.cold_watch`, by path (``python -I`` puts no script folder on ``sys.path``); loaded after
    the timed import, since it imports ``typing``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cold_watch", os.path.join(os.path.dirname(__file__), "cold_watch.py")
    )
    assert spec is not None and spec.loader is not None
    watch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(watch)
    return watch


def main() -> None:
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the handler's logs (powertools JSON on stdout) go to stderr
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.read())
    sys.path[:0] = request["path"]
    wall, cpu = time.perf_counter(), time.process_time()
    module = importlib.import_module(request["module"])
    for also in request.get("also", []):  # more modules, timed with the first
        importlib.import_module(also)
    import_wall, import_cpu = time.perf_counter() - wall, time.process_time() - cpu
    watch = load_watch()
    calls: list[dict[str, object]] = []
    out = {
        "import_wall_ms": import_wall * 1000,
        "import_cpu_ms": import_cpu * 1000,
        "aws_clients_after_import": watch.aws_clients(),
        "modules_after_import": sorted(sys.modules),
        "calls": calls,
    }
    if request.get("function"):
        handler = getattr(module, request["function"])
        created: dict[str, list[str]] = {"aws": [], "http": []}
        watch.record_created(created)
        for event in request["events"]:
            created["aws"].clear()
            created["http"].clear()
            wall, cpu = time.perf_counter(), time.process_time()
            result = handler(event, Context())
            calls.append(
                {
                    "cpu_ms": (time.process_time() - cpu) * 1000,
                    "wall_ms": (time.perf_counter() - wall) * 1000,
                    "result": result,
                    "aws_clients_created": sorted(created["aws"]),
                    "http_clients_created": len(created["http"]),
                }
            )
    out["modules_after_calls"] = sorted(sys.modules)
    answer.write(json.dumps(out) + "\n")
    answer.flush()


if __name__ == "__main__":
    main()
