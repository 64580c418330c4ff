"""Logging for ``stepagent run`` at a terminal: readable lines, not the handlers' CloudWatch JSON.

The handlers log through powertools (one JSON object per line, for CloudWatch). In a chat at a terminal
that is noise mixed into the conversation, so :func:`configure` routes every log record to stderr as one
short human line (``warning  worker: thread failed; its records will be retried (thread t1)``). Levels:
warnings and errors by default; ``debug`` raises stepagent's own loggers to DEBUG and nothing else;
``debug_sdk`` adds the AWS SDK, HTTP and moto libraries' debug logs (thousands of lines per message).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import TextIO

from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

#: Context keys powertools adds to records that are worth showing (the rest is CloudWatch plumbing).
_CONTEXT_KEYS = ("thread_id", "tool_call_id", "message_id", "error")
_SDK_LOGGERS = ("botocore", "aiobotocore", "boto3", "urllib3", "httpx", "httpcore", "werkzeug", "moto", "mcp")


class HumanFormatter(logging.Formatter):
    """``level  logger: message (key value, ...)``."""

    def format(self, record: logging.LogRecord) -> str:
        name = record.name.removeprefix("stepagent.")
        role = getattr(record, "role", None)
        context = [f"{key} {getattr(record, key)}" for key in _CONTEXT_KEYS if getattr(record, key, None)]
        line = f"{record.levelname.lower():8} {role or name}: {record.getMessage()}"
        if context:
            line += " (" + ", ".join(context) + ")"
        if record.exc_info and record.levelno >= logging.ERROR:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(*, debug: bool = False, debug_sdk: bool = False, stream: TextIO | None = None) -> None:
    """Send all logs to ``stream`` (stderr) as human lines at the levels described above."""
    # powertools reads these when its loggers are created: plain level, no JSON handler of its own.
    os.environ["POWERTOOLS_LOG_LEVEL"] = "DEBUG" if debug else "WARNING"
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(HumanFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug_sdk else logging.WARNING)
    logging.getLogger("stepagent").setLevel(logging.DEBUG if debug else logging.WARNING)
    for name in _SDK_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if debug_sdk else logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.DEBUG if debug_sdk else logging.ERROR)


class HumanPowertoolsFormatter(LambdaPowertoolsFormatter):
    """powertools' formatter (it keeps the appended keys the handlers rely on), printing a human line."""

    def format(self, record: logging.LogRecord) -> str:
        data = json.loads(super().format(record))
        context = [f"{key} {data[key]}" for key in _CONTEXT_KEYS if data.get(key)]
        line = f"{str(data.get('level', record.levelname)).lower():8} {data.get('role') or data.get('service') or record.name}: "
        line += str(data.get("message", ""))
        if context:
            line += " (" + ", ".join(context) + ")"
        if data.get("exception") and record.levelno >= logging.ERROR:
            line += "\n" + str(data["exception"])
        return line


class ShownAsEvent(logging.Filter):
    """Leaves out the worker's lines whose content the chat already prints as an ``error`` event (a retry,
    a rejection, giving up): at a terminal each would otherwise appear twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        from stepagent.aws.worker import REPORTED_TO_THREAD

        return not getattr(record, REPORTED_TO_THREAD, False)


def adopt_powertools_loggers(stream: TextIO | None = None, *, debug: bool = False) -> None:
    """Make the powertools logger (the stdlib logger ``stepagent`` with a JSON handler on stdout, set up
    once at the handler edge, :mod:`stepagent.aws.lambda_entry`, and reached by every ``stepagent.*``
    module's records) print human lines on stderr. The edge is imported first so that handler exists; it
    is kept (powertools needs it, and it carries the task's log keys), only its stream, formatter and
    filter change. Unless ``debug``, lines already shown as ``error`` events are left out
    (:class:`ShownAsEvent`)."""
    import stepagent.aws.lambda_entry  # noqa: F401 - imported for the one powertools Logger it configures

    for handler in logging.getLogger("stepagent").handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(stream or sys.stderr)
        handler.setFormatter(HumanPowertoolsFormatter())
        _leave_out_reported(handler, debug)
    for handler in logging.getLogger().handlers:  # records that propagate to the root
        _leave_out_reported(handler, debug)


def _leave_out_reported(handler: logging.Handler, debug: bool) -> None:
    for old in [f for f in handler.filters if isinstance(f, ShownAsEvent)]:
        handler.removeFilter(old)
    if not debug:
        handler.addFilter(ShownAsEvent())
