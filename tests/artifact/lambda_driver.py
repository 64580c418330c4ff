"""Run one Lambda handler the way the Python runtime does, from the built artifact alone.

Started as ``python -I -S lambda_driver.py TASK_ROOT LAYER_DIR module.function``: isolated mode and no
``site``, so nothing of the development environment is importable; ``sys.path`` is the function's code
(``TASK_ROOT``, Lambda's ``/var/task``), then the layer (``/opt/python``), then the standard library. The
process stays up between invocations (a warm container). Each line on stdin is one invocation
(``{"event": ..., "request_id": ...}``); each answer is one JSON line on the original stdout
(``{"result": ...}`` or ``{"error": ..., "traceback": ...}``), while everything the handler prints or logs goes
to stderr. Deliberately standard library only.
"""

import importlib
import json
import os
import sys
import time
import traceback

task_root, layer, handler_name = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path[:0] = [task_root, layer]

answers = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # the handler's prints and powertools' JSON logs go to stderr
sys.stdout = sys.stderr


class Context:
    """The attributes of Lambda's context object that handlers and powertools read."""

    def __init__(self, request_id: str, timeout_seconds: float) -> None:
        self.aws_request_id = request_id
        self.function_name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "test")
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512"))
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = "test"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


module_name, _, function_name = handler_name.rpartition(".")
handler = None
for line in sys.stdin:
    request = json.loads(line)
    try:
        if handler is None:  # the first invocation imports the handler, as the runtime's init does
            handler = getattr(importlib.import_module(module_name), function_name)
        result = handler(request["event"], Context(request["request_id"], request.get("timeout", 300)))
        answers.write(json.dumps({"result": result}) + "\n")
    except BaseException as error:  # report everything: the test shows it
        answers.write(
            json.dumps({"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()})
            + "\n"
        )
