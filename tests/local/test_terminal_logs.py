"""At a terminal, `stepagent run` logs readable lines, powertools' JSON loggers included."""

from __future__ import annotations

import io
import logging

from aws_lambda_powertools import Logger

from stepagent.devstack import terminal_logs


def test_powertools_and_stdlib_logs_become_human_lines() -> None:
    stream = io.StringIO()
    saved = logging.getLogger().handlers[:], logging.getLogger().level
    try:
        terminal_logs.configure(stream=stream)
        terminal_logs.adopt_powertools_loggers(stream)
        Logger(service="stepagent").warning(
            "thread failed; its records will be retried", extra={"thread_id": "t1"}
        )
        logging.getLogger("stepagent.devstack.poller").info("not shown below WARNING")
        logging.getLogger("botocore.hooks").warning("sdk warnings still show")
        logging.getLogger("botocore.hooks").debug("sdk debug hidden")
    finally:
        logging.getLogger().handlers[:], _ = saved[0], logging.getLogger().setLevel(saved[1])
    lines = stream.getvalue().splitlines()
    assert lines[0] == "warning  stepagent: thread failed; its records will be retried (thread_id t1)"
    assert not any(line.lstrip().startswith("{") for line in lines), lines
    assert "not shown" not in stream.getvalue() and "sdk debug hidden" not in stream.getvalue()
    assert any("sdk warnings still show" in line for line in lines)


def test_lines_the_chat_shows_as_error_events_are_left_out_unless_debugging() -> None:
    stream = io.StringIO()
    saved = logging.getLogger().handlers[:], logging.getLogger().level
    logger = Logger(service="stepagent")
    try:
        terminal_logs.configure(stream=stream)
        terminal_logs.adopt_powertools_loggers(stream)
        logger.error("thread failed; its records will be retried", extra={"reported_to_thread": True})
        logger.error("could not publish the retrying error event", extra={"reported_to_thread": False})
        terminal_logs.adopt_powertools_loggers(stream, debug=True)
        logger.error("shown when debugging", extra={"reported_to_thread": True})
    finally:
        terminal_logs.adopt_powertools_loggers(io.StringIO())  # back to the default filter
        logging.getLogger().handlers[:], _ = saved[0], logging.getLogger().setLevel(saved[1])
    # (Distinct lines: whether a record also reaches the root handler depends on when powertools first
    # configured the logger, which differs between this test process and `stepagent run`.)
    shown = {line.split(": ", 1)[1] for line in stream.getvalue().splitlines() if line.startswith("error")}
    assert shown == {"could not publish the retrying error event", "shown when debugging"}, shown
