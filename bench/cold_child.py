"""One cold start of a Lambda handler, run as a script in a fresh interpreter by :mod:`bench.cold_start`.

Started as ``python -I cold_child.py`` with one JSON request on stdin: ``{"path": [...], "module": ...,
"function": ..., "events": [...]}``. It puts ``path`` first on ``sys.path`` (the function's code, as Lambda's
``/var/task``, then the package source), imports ``module`` timing it (wall and CPU), counts the AWS clients
alive after the import, then calls ``function`` once per event in order with a Lambda-like context, timing
each call's CPU (``time.process_time``: this process only, so a moto server in another process is not
counted). With no ``function`` it only imports (the peer's ``import strands``). The answer is one JSON
line on stdout; whatever the handler prints or logs goes to stderr.

Standard library only before the timed import, so the import is measured from a bare interpreter.
"""

import gc
import importlib
import json
import os
import sys
import time
import uuid
from typing import Any


class Context:
    """The attributes of Lambda's context object that the handlers and powertools read."""

    def __init__(self) -> None:
        self.aws_request_id = uuid.uuid4().hex
        self.function_name = "WorkerFunction"
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 1024
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:WorkerFunction"
        self.log_group_name = "/aws/lambda/WorkerFunction"
        self.log_stream_name = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def aws_clients() -> int:
    """botocore clients alive now (aiobotocore's subclass them); 0 when botocore was never imported."""
    client = sys.modules.get("botocore.client")
    if client is None:
        return 0
    return sum(1 for o in gc.get_objects() if isinstance(o, client.BaseClient))


def main() -> None:
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the handler's logs (powertools JSON on stdout) go to stderr
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.read())
    sys.path[:0] = request["path"]
    wall, cpu = time.perf_counter(), time.process_time()
    module = importlib.import_module(request["module"])
    calls: list[dict[str, Any]] = []
    out = {
        "import_wall_ms": (time.perf_counter() - wall) * 1000,
        "import_cpu_ms": (time.process_time() - cpu) * 1000,
        "aws_clients_after_import": aws_clients(),
        "calls": calls,
    }
    if request.get("function"):
        handler = getattr(module, request["function"])
        for event in request["events"]:
            wall, cpu = time.perf_counter(), time.process_time()
            result = handler(event, Context())
            calls.append(
                {
                    "cpu_ms": (time.process_time() - cpu) * 1000,
                    "wall_ms": (time.perf_counter() - wall) * 1000,
                    "result": result,
                    "aws_clients": aws_clients(),
                }
            )
    answer.write(json.dumps(out) + "\n")
    answer.flush()


if __name__ == "__main__":
    main()
