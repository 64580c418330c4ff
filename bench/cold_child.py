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

import gc
import importlib
import json
import os
import sys
import time


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


def service_of(client: object) -> str:
    return str(getattr(client, "meta").service_model.service_name)  # noqa: B009 - botocore is untyped


def aws_clients() -> list[str]:
    """The services of the botocore clients alive now (aiobotocore's subclass them); none when botocore
    was never imported."""
    client = sys.modules.get("botocore.client")
    if client is None:
        return []
    return sorted(service_of(o) for o in gc.get_objects() if isinstance(o, client.BaseClient))


def record_created(created: dict[str, list[str]]) -> None:
    """From now on, note every botocore client (its service) and every httpx client created in
    ``created`` — also those closed again by the time a call returns. Only libraries already imported are
    watched (the worker's import imports both)."""
    botocore_client = sys.modules.get("botocore.client")
    if botocore_client is not None:
        init = botocore_client.BaseClient.__init__

        def noting_init(self: object, *args: object, **kwargs: object) -> None:
            init(self, *args, **kwargs)
            created["aws"].append(service_of(self))

        botocore_client.BaseClient.__init__ = noting_init
    httpx = sys.modules.get("httpx")
    if httpx is not None:
        http_init = httpx.AsyncClient.__init__

        def noting_http_init(self: object, *args: object, **kwargs: object) -> None:
            http_init(self, *args, **kwargs)
            created["http"].append("httpx.AsyncClient")

        httpx.AsyncClient.__init__ = noting_http_init


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
    calls: list[dict[str, object]] = []
    out = {
        "import_wall_ms": import_wall * 1000,
        "import_cpu_ms": import_cpu * 1000,
        "aws_clients_after_import": aws_clients(),
        "modules_after_import": sorted(sys.modules),
        "calls": calls,
    }
    if request.get("function"):
        handler = getattr(module, request["function"])
        created: dict[str, list[str]] = {"aws": [], "http": []}
        record_created(created)
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
