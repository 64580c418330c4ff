"""Bounded shutdown for the command line: Ctrl-C (SIGINT) and SIGTERM stop a command within a known time.

:func:`run_until_signalled` runs the command's coroutine as :func:`asyncio.run` would, with these
guarantees:

- The first SIGINT or SIGTERM cancels the command, so its ``finally`` blocks and context managers run
  (servers stop, a ``--state-dir`` is saved, the terminal is restored), and the process exits with
  ``128 + signal`` (130 for Ctrl-C, 143 for SIGTERM).
- Whatever is still in flight then — a blocking AWS call in a worker thread, a client that keeps a
  connection open, cleanup that never finishes — the process ends at most :data:`SHUTDOWN_GRACE_SECONDS`
  after that first signal: a daemon timer ends it with the same status. Without it, interpreter exit
  waits for every non-daemon thread (a thread pool's in-flight calls), however long they take.
- A second signal ends the process at once.

:func:`exit_now` ends the ``stepagent`` program once its command is done, cleanup included: it flushes the
output and the logs and skips the interpreter's own teardown, which would wait for every non-daemon thread
(an AWS call still in flight in a pool thread, whose caller was cancelled) and then run a last full garbage
collection. With moto, botocore and the rest loaded that collection walks about 300,000 objects: 0.7 s on an
idle core, ten seconds and more on a busy machine, for nothing a finished command needs. (That, with the
servers' signal hand-offs, is why ``run --console`` once took over 30 s to exit after Ctrl-C on a loaded
test machine.)

Embedded servers (uvicorn) must leave the signals to this module (:func:`stepagent.rap.server.serve_in_background`
does): a server that captures them itself postpones the cancellation until it has shut down, and several of
them chain their handlers, so one slow server holds up the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Coroutine
from typing import Any, NoReturn

#: Seconds from the first signal to the end of the process, cleanup included.
SHUTDOWN_GRACE_SECONDS = 10.0

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _force_exit(status: int, grace: float) -> None:
    with contextlib.suppress(Exception):
        print(f"stepagent: still stopping {grace:g} s after the signal; exiting now", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
    os._exit(status)


class _Stopper:
    """The signal handlers of one run: cancel the command on the first signal, exit on the second."""

    def __init__(self, task: asyncio.Task[Any], grace: float) -> None:
        self.task = task
        self.grace = grace
        self.signum: int | None = None

    def on_signal(self, signum: int) -> None:
        if self.signum is not None:
            _force_exit(128 + self.signum, 0)
        self.signum = signum
        timer = threading.Timer(self.grace, _force_exit, (128 + signum, self.grace))
        timer.daemon = True
        timer.start()
        self.task.cancel()


async def _guarded(command: Coroutine[Any, Any, int], grace: float) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopper = _Stopper(task, grace)
    installed = []
    for signum in SIGNALS:
        try:
            loop.add_signal_handler(signum, stopper.on_signal, signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal here
            continue
        installed.append(signum)
    try:
        return await command
    except asyncio.CancelledError:
        if stopper.signum is None:
            raise
        return 128 + stopper.signum
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def run_until_signalled(command: Coroutine[Any, Any, int], *, grace: float = SHUTDOWN_GRACE_SECONDS) -> int:
    """Run ``command`` to completion, or until SIGINT/SIGTERM; its exit status (see the module docstring)."""
    return asyncio.run(_guarded(command, grace))


def exit_now(status: int) -> NoReturn:
    """End the process with ``status`` at once, after flushing stdout, stderr and the logging handlers (see
    the module docstring: for a program whose work is done, never for a library call)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
