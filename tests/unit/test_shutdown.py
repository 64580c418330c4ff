"""Bounded shutdown (:mod:`stepagent.shutdown`), in a child process as a user's Ctrl-C or Lambda's SIGTERM
meets it: the first signal cancels the command and its cleanup runs; a call still blocking a non-daemon
thread cannot hold the exit past the grace period; a second signal ends a cleanup that hangs."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from tests.integration.test_cli import ROOT, clean_env

CHILD = textwrap.dedent(
    """
    import asyncio, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    from stepagent.shutdown import run_until_signalled

    MODE, GRACE = sys.argv[1], float(sys.argv[2])

    async def command():
        if MODE == "blocked-thread":
            # An AWS call in flight in a non-daemon pool thread that never returns: exit would join it.
            in_flight = asyncio.get_running_loop().run_in_executor(ThreadPoolExecutor(1), threading.Event().wait)
        try:
            print("ready", flush=True)
            await asyncio.Event().wait()
        finally:
            print("cleanup ran", flush=True)
            if MODE == "hanging-cleanup":
                await asyncio.Event().wait()

    sys.exit(run_until_signalled(command(), grace=GRACE))
    """
)


def start(mode: str, grace: float) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(grace)],
        env=clean_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    return process


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, out, err


def test_ctrl_c_cancels_the_command_and_its_cleanup_runs() -> None:
    process = start("plain", 60)
    process.send_signal(signal.SIGINT)
    code, out, err = finish(process, 30)
    assert (code, out, err) == (130, "cleanup ran\n", "")


def test_a_call_blocking_a_thread_cannot_hold_a_sigterm_exit_past_the_grace_period() -> None:
    process = start("blocked-thread", 0.5)
    process.send_signal(signal.SIGTERM)
    code, out, err = finish(process, 30)
    assert (code, out) == (143, "cleanup ran\n")
    assert "still stopping 0.5 s after the signal; exiting now" in err


def test_a_second_signal_ends_a_cleanup_that_hangs() -> None:
    process = start("hanging-cleanup", 60)
    process.send_signal(signal.SIGINT)
    assert process.stdout is not None
    assert process.stdout.readline() == "cleanup ran\n"
    process.send_signal(signal.SIGINT)
    code, _, _ = finish(process, 30)
    assert code == 130
