"""Library modules log through the standard library; the handler edge's one powertools logger prints their
records as CloudWatch JSON, with the keys each task appended (the worker's ``thread_id`` per thread task)."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from stepagent.aws import lambda_entry, timers, tool_runner, worker
from stepagent.aws.log_keys import append_keys


def test_no_module_of_the_binding_makes_its_own_powertools_logger() -> None:
    assert [m.logger.name for m in (worker, tool_runner, timers)] == [
        "stepagent.aws.worker",
        "stepagent.aws.tool_runner",
        "stepagent.aws.timers",
    ]
    assert all(type(m.logger) is logging.Logger for m in (worker, tool_runner, timers))


def test_worker_lines_are_json_with_the_keys_of_their_own_task() -> None:
    handler = lambda_entry.logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    # Another test in this process may have turned the handler human (`stepagent run`); the edge's JSON.
    saved_formatter, saved_stream = handler.formatter, handler.setStream(stream)
    handler.setFormatter(LambdaPowertoolsFormatter(service="stepagent"))
    log = logging.getLogger("stepagent.aws.worker")

    async def thread(thread_id: str, started: asyncio.Event, other_started: asyncio.Event) -> None:
        append_keys(thread_id=thread_id)
        started.set()
        await other_started.wait()  # both tasks have set their key before either logs
        log.warning("step done", extra={"events": 2})

    async def both() -> None:
        a, b = asyncio.Event(), asyncio.Event()
        await asyncio.gather(thread("t1", a, b), thread("t2", b, a))

    try:
        asyncio.run(both())
        log.warning("outside any thread")
    finally:
        handler.setStream(saved_stream)
        handler.setFormatter(saved_formatter)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert sorted((line["message"], line.get("thread_id") or "") for line in lines) == [
        ("outside any thread", ""),
        ("step done", "t1"),
        ("step done", "t2"),
    ]
    assert all(line["service"] == "stepagent" and line["level"] == "WARNING" for line in lines)
    assert lines[0]["events"] == 2
