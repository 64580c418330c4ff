"""``stepagent chat`` and ``stepagent tail`` against a deployment-shaped stack on moto, run as a user runs
them: subprocesses (``--stack NAME`` reading CloudFormation outputs, or the settings), and the interactive
chat under a pseudo-terminal, where the screen the user sees is rebuilt from the raw output and checked.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import json
import os
import pty
import signal
import struct
import sys
import termios
import uuid
from collections.abc import Callable
from pathlib import Path

from stepagent.client import Client
from stepagent.errors import ProviderError
from stepagent.providers.base import ModelRequest
from tests.client.deployment import Deployment, FunctionModel, Gate, Step, call, deployment, say
from tests.conftest import aws_client
from tests.integration.test_cli import clean_env

ROOT = Path(__file__).resolve().parents[2]
T = "conv-cli"


def model(gate: Gate | None = None) -> FunctionModel:
    def reply(text: str, request: ModelRequest) -> list[Step]:
        if text == "weather in Paris?":
            chunks: list[str | Gate] = ["Let me check ", *([gate] if gate else []), "the weather."]
            return call("get_weather", "call-weather", *chunks, city="Paris")
        if text.startswith("Sunny in"):
            return say("It is sunny in Paris.")
        if text == "pick a color":
            return call("pick_color", "call-color")
        if text.startswith("The user picked"):
            return say(f"Noted: {text.removeprefix('The user picked ').rstrip('.')}.")
        if text == "fail":
            return [ProviderError("401 Unauthorized: bad API key", retryable=False, status=401)]
        return say(f"ack: {text}")

    return FunctionModel(reply)


async def cli(*args: str, env: dict[str, str], within: float = 120) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "stepagent.cli",
        *args,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), within)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def stack_named_after(d: Deployment) -> str:
    """A CloudFormation stack on moto whose outputs name the deployment's resources."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    outputs = {
        "InputQueueUrl": d.settings.input_queue_url,
        "OutputQueueUrl": d.settings.output_queue_url,
        "ConversationTableName": d.settings.conversation_table,
        "StateTableName": d.settings.state_table,
        "BlobBucketName": d.settings.blob_bucket,
    }
    template = {
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": f"{name}-marker"}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    async with aws_client("cloudformation") as cloudformation:
        await cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(template))
    return name


async def test_chat_say_against_a_stack_by_name() -> None:
    async with deployment(model()) as d:
        stack = await stack_named_after(d)
        env = clean_env(AWS_ENDPOINT_URL=str(d.settings.endpoint_url))
        code, out, err = await cli("chat", T, "--stack", stack, "--say", "weather in Paris?", env=env)
        assert code == 0, err
        assert out.splitlines() == [
            "you > weather in Paris?",
            "agent > Let me check the weather.",
            'agent ⚙ get_weather({"city": "Paris"})',
            "agent ← Sunny in Paris",
            "agent > It is sunny in Paris.",
            "· turn: 0 in · 0 out · 2 model calls",  # what the turn spent (this model reports no tokens)
        ]
        assert f"conversation {T}" in err

        # An error is shown, and --say then exits non-zero.
        code, out, err = await cli("chat", T, "--stack", stack, "--say", "fail", env=env)
        assert code == 1, err
        assert out.splitlines() == ["you > fail", "agent ! The model failed: 401 Unauthorized: bad API key"]


async def test_tail_follows_what_another_client_sends_and_stops_on_ctrl_c() -> None:
    async with deployment(model()) as d, Client(d.settings, poll_interval=0.05) as client:
        env = clean_env(**d.env())
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "stepagent.cli", "tail", T, env=env, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None and process.stderr is not None
        started = await asyncio.wait_for(process.stderr.readline(), 60)
        assert started.decode().startswith(f"following thread {T}")
        await client.send(T, "hello")
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert line.decode() == "user > hello\n"  # another client's message
        assert (await asyncio.wait_for(process.stdout.readline(), 60)).decode() == "agent > ack: hello\n"
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30) == 130
        assert b"Traceback" not in await process.stderr.read()

        # --history --until-idle: the transcript so far, then exit as the tree is idle.
        code, out, err = await cli("tail", T, "--history", "--until-idle", "--timeout", "60", env=env)
        assert code == 0, err
        assert out.splitlines() == ["user > hello", "agent > ack: hello"]


# ---- the interactive chat under a pseudo-terminal ------------------------------------------------------------


class Screen:
    """Rebuilds what a terminal shows from the raw output (the few escapes the chat uses)."""

    def __init__(self) -> None:
        self.lines: list[str] = [""]
        self.row = 0
        self.col = 0
        self.raw = ""

    def feed(self, text: str) -> None:
        self.raw += text
        i = 0
        while i < len(text):
            char = text[i]
            if text.startswith("\x1b[K", i):
                self.lines[self.row] = self.lines[self.row][: self.col]
                i += 3
                continue
            if text.startswith("\x1b[1A", i):
                self.row = max(0, self.row - 1)
                i += 4
                continue
            if char == "\r":
                self.col = 0
            elif char == "\n":
                self.row += 1
                if self.row == len(self.lines):
                    self.lines.append("")
            else:
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + char + line[self.col + 1 :]
                self.col += 1
            i += 1

    def text(self) -> str:
        return "\n".join(self.lines)


class Pty:
    """``stepagent chat`` on a pseudo-terminal, 120 columns wide."""

    def __init__(self, screen: Screen) -> None:
        self.screen = screen
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.changed = asyncio.Event()
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        asyncio.get_running_loop().add_reader(self.master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
            return
        self.screen.feed(self._decoder.decode(data))
        self.changed.set()

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    async def until(self, condition: Callable[[], bool], what: str, within: float = 60) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not condition():
            remaining = deadline - loop.time()
            assert remaining > 0, f"timed out waiting for {what}; the screen:\n{self.screen.text()}"
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)


async def test_interactive_chat_under_a_pseudo_terminal() -> None:
    gate = Gate()
    async with deployment(model(gate)) as d:
        screen = Screen()
        term = Pty(screen)
        env = clean_env(**d.env(), TERM="xterm", COLUMNS="120")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "stepagent.cli", "chat", T, env=env, cwd=ROOT,
            stdin=term.slave, stdout=term.slave, stderr=term.slave,
        )  # fmt: skip
        os.close(term.slave)
        try:
            await run_the_session(term, screen, gate)
            term.type("\x04")  # Ctrl-D
            assert await asyncio.wait_for(process.wait(), 60) == 0, screen.text()
        finally:
            if process.returncode is None:
                process.kill()
            term.close()


def last_line(screen: Screen) -> str:
    return screen.lines[screen.row]


async def run_the_session(term: Pty, screen: Screen, gate: Gate) -> None:
    await term.until(lambda: last_line(screen) == "you > ", "the prompt")

    # The live partial text shows on the status line while the model is still streaming.
    term.type("weather in Paris?\r")
    await term.until(lambda: "agent is writing: Let me check" in screen.text(), "the partial text")
    assert "agent > Let me check" not in screen.text()  # not shown as committed

    # Typing while the agent works: the prompt stays the last line, under the status line.
    term.type("hello while busy")
    await term.until(lambda: last_line(screen) == "you > hello while busy", "the typed text")
    assert screen.lines[screen.row - 1].startswith(tuple("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"))
    term.type("\r")  # sent now; it waits in the thread's queue and interrupts the tool call
    await term.until(lambda: "you > hello while busy\n" in screen.text() + "\n", "the sent line")
    gate.open()
    await term.until(lambda: "agent > ack: hello while busy" in screen.text(), "the reply to it")
    assert "agent > Let me check the weather." in screen.text()
    assert "agent ← Tool call interrupted by user" in screen.text()

    # A question: the next line is the answer, delivered to the tool.
    term.type("pick a color\r")
    await term.until(
        lambda: "agent ? Which color? [0: red, 1: green, 2: blue]" in screen.text(), "the choice"
    )
    await term.until(lambda: "waiting for your answer" in screen.text(), "the answer prompt")
    term.type("1\r")
    await term.until(lambda: "agent > Noted: green." in screen.text(), "the answered choice")
    text = screen.text()
    assert "you > 1 → green" in text and "agent ← The user picked green." in text
    # Once the tree is idle the status line goes: the prompt follows the last line of output.
    await term.until(
        lambda: last_line(screen) == "you > " and screen.lines[screen.row - 1] == "agent > Noted: green.",
        "a clean prompt once idle",
    )

    # Nothing ever merged into the prompt line, and every committed line is whole.
    for line in screen.lines:
        assert not (line.startswith("you > ") and "agent" in line), line
    assert [line for line in screen.lines if line.startswith("agent >")] == [
        "agent > Let me check the weather.",
        "agent > ack: hello while busy",
        "agent > Noted: green.",
    ]
