"""Framework CPU per turn: stepagent's real handlers against LangGraph + ``DynamoDBSaver``, same moto, same
conversation, measured interleaved in one run.

One turn = user text (~1 KB) → the model asks for one ``lookup`` call → the tool result (~1 KB) → the
model's answer (~1 KB), with a scripted model on both sides (no HTTP to a model).

- **stepagent**: one :class:`~stepagent.aws.runtime.AwsRuntime` (worker and tool-runner roles, the code
  the Lambdas run) on DynamoDB, SQS and S3 of the moto server. The user text is sent to the input FIFO
  queue; the bench then plays Lambda's event source mappings: it receives from the input and tool queues
  and hands each message as a one-record Lambda event to ``handle_sqs_batch``/``handle_tool_batch`` until
  both queues are empty (two worker invocations and one tool-runner invocation per turn). Only those
  handler calls are timed: the client's send and the event source's receive/delete are not the
  framework's work (in AWS they run elsewhere). **cold**: ``STEPAGENT_THREAD_CACHE_BYTES=0``, so every
  step rebuilds the thread from the store; **warm**: the default thread cache.
- **peer**: ``bench/peers/langgraph_turns.py`` in the bench-only ``.venv-peer`` (a subprocess; it does not
  import stepagent), one ``graph.invoke`` per turn, checkpointed by ``DynamoDBSaver`` (S3 offload on).

CPU is ``time.process_time()`` of the framework's process (all its threads), summed per turn. The moto
server is a child process of the bench, so its CPU is nobody's. Each repetition runs, back to back:
stepagent cold, then warm, each at turns 1-15 of a fresh thread and 491-505 of a seeded one in lockstep
(turn ``k`` of one, then ``490 + k`` of the other, so both see the same load of the shared machine), then
the peer at turns 1-15. Reported: per repetition the median over turns 6-15 ("turn 10") and 496-505
("turn 500"); then the medians over repetitions of those and of the per-repetition ratios
(stepagent/peer at turn 10, turn 500/turn 10).

The thread at turn 500 is seeded, not run: 490 finished turns of the same shape are written into the
store's row layout, and a compaction summary covers all of them (the state the thread's own compactions
keep it in), then turns 491-505 run for real. So turn ``495 + k`` has the same context as turn ``5 + k``
plus the summary, and what grows is only the stored history behind it. Compaction stays on (the script's
context window would compact a thread holding more than :data:`COMPACT_AFTER_TURNS` turns) but does not
fire in the measured turns.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.step_costs import ANSWER, MESSAGE_CHARS, dynamo_row_writer, seed_thread, user_text
from bench.workload import window_for, workload_script
from stepagent.aws.queue_resources import LOCAL_SCHEDULER_ROLE_ARN
from stepagent.aws.runtime import TOOL_RUNNER, WORKER, AwsRuntime
from stepagent.aws.settings import Settings
from stepagent.devstack.poller import lambda_record
from stepagent.messages import InputMessage
from stepagent.providers.scripted import ScriptedProvider
from stepagent.providers.window import ITEM_FRAMING_TOKENS, estimate_text
from stepagent.tools.base import Tool
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import FunctionTool, tool

ROOT = Path(__file__).resolve().parents[1]
PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
PEER_SCRIPT = ROOT / "bench" / "peers" / "langgraph_turns.py"
PEER_NAME = "LangGraph + DynamoDBSaver (langgraph-checkpoint-aws, S3 offload)"
ACK = "Looking it up."
EARLY_TURNS = range(1, 16)
LATE_SEEDED = 490
WARMUP_TURNS = 5  # the first turns of each run: imports, first-use caches, connection pools
COMPACT_AFTER_TURNS = 20
#: A turn's rows as the engine estimates them (user text, ack, call, ~1 KB result, answer).
TURN_TOKENS = sum(
    estimate_text(text) + ITEM_FRAMING_TOKENS
    for text in (user_text(500), ACK, 'lookup{"query": "x"}', "result: " + "0" * MESSAGE_CHARS, ANSWER)
)
#: Issue "A cheaper step": stepagent ≤ 1.0x the peer at turn 10, and ≤ 1.2x growth from turn 10 to 500.
PEER_RATIO_TARGET = 1.0
GROWTH_TARGET = 1.2


def lookup_tool() -> FunctionTool[..., Any]:
    """The tool both sides run: its ``n``-th result is ``"result: "`` and ``n`` repeated to ~1 KB."""
    calls = 0

    @tool
    async def lookup(query: str) -> str:
        """Look something up."""
        nonlocal calls
        calls += 1
        return "result: " + (f"{calls:07d}" * (MESSAGE_CHARS // 7 + 1))[:MESSAGE_CHARS]

    return lookup


def script(tools: list[Tool]) -> dict[str, Any]:
    window = window_for(tools, COMPACT_AFTER_TURNS * TURN_TOKENS)
    return workload_script(window, summary="SUMMARY", ack=ACK, answer=ANSWER)


@contextlib.contextmanager
def moto_process() -> Iterator[str]:
    """A moto server in a child process on a free loopback port; yields its endpoint URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the moto server did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill()  # werkzeug's server does not always stop on SIGTERM
        server.wait(timeout=30)


@contextlib.contextmanager
def production_logging() -> Iterator[None]:
    """The worker's logs at their Lambda level (INFO: one JSON line per step is part of a step's work),
    written to the null device instead of the terminal."""
    logger = logging.getLogger("stepagent")
    level = logger.level
    handlers = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]
    with open(os.devnull, "w", encoding="utf-8") as null:
        streams = [(h, h.setStream(null)) for h in handlers]
        logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            logger.setLevel(level)
            for handler, stream in streams:
                if stream is not None:
                    handler.setStream(stream)


def fake_credentials() -> None:
    """Every AWS client of this process and of the peer's talks to moto with throwaway credentials."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(name, None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )


@dataclass
class Driver:
    """Lambda's event source mappings for one runtime: input queue → worker, tool queue → tool runner."""

    runtime: AwsRuntime
    arns: dict[str, str]
    invocations: int = 0

    async def _drain_once(self, url: str, handler: Any) -> float:
        sqs = self.runtime.sqs
        found = await sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=1, AttributeNames=["All"], MessageAttributeNames=["All"]
        )
        messages = found.get("Messages", [])
        if not messages:
            return -1.0
        event = {"Records": [lambda_record(m, self.arns[url]) for m in messages]}
        start = time.process_time()
        result = await handler(event)
        cpu = time.process_time() - start
        if result["batchItemFailures"]:
            raise RuntimeError(f"a bench step failed: {result}")
        await sqs.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
        self.invocations += 1
        return cpu

    async def turn(self, thread: str, turn: int) -> float:
        """Send turn ``turn``'s user text and run every invocation it causes; their CPU in ms."""
        settings = self.runtime.settings
        message = InputMessage.user_text(thread, user_text(turn), id=f"ask-{turn}")
        await self.runtime.sender.send(message, f"ask-{turn}")
        queues = (
            (str(settings.input_queue_url), self.runtime.handle_sqs_batch),
            (str(settings.tool_queue_url), self.runtime.handle_tool_batch),
        )
        before, total = self.invocations, 0.0
        while True:
            spent = [await self._drain_once(url, handler) for url, handler in queues]
            if max(spent) < 0:
                break
            total += sum(cpu for cpu in spent if cpu >= 0)
        if self.invocations - before != 3:
            raise RuntimeError(f"turn {turn} took {self.invocations - before} invocations, not 3")
        return total * 1000


@contextlib.asynccontextmanager
async def stepagent_thread(
    endpoint: str, prefix: str, *, cache: bool, seeded: int = 0
) -> AsyncIterator[Callable[[int], Awaitable[float]]]:
    """A fresh runtime on fresh resources and a fresh thread (after ``seeded`` finished turns behind a
    summary, if any); yields ``turn(k)``, which runs the thread's turn ``seeded + k`` and returns its CPU
    ms."""
    from stepagent.devstack.stack import create_resources

    env = await create_resources(endpoint, prefix)
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_REGION="us-east-1",
        STEPAGENT_SCHEDULER_ROLE_ARN=LOCAL_SCHEDULER_ROLE_ARN,
        STEPAGENT_THREAD_CACHE_BYTES=str(64 * 2**20) if cache else "0",
        # Partial text is written only while a completion outlasts 0.25 s, which moto's slow transactions
        # on a big table (it copies the table on each) would cause at turn 500 where DynamoDB would not;
        # the peer has no such feature, and the live_text section measures its cost.
        STEPAGENT_LIVE_TEXT="off",
    )
    settings = Settings.from_env(env)
    lookup = lookup_tool()
    provider = ScriptedProvider(script([lookup, *builtin_tools()]))
    runtime = await AwsRuntime.create(
        settings, roles=[WORKER, TOOL_RUNNER], provider=provider, tools=[lookup]
    )
    try:
        thread = f"{prefix}-thread"
        if seeded:
            writer = dynamo_row_writer(runtime.dynamodb, str(settings.conversation_table))
            await seed_thread(runtime.conversation, thread, seeded + 1, True, writer, kept_turns=0)
        arns = {}
        for url in (settings.input_queue_url, settings.tool_queue_url):
            found = await runtime.sqs.get_queue_attributes(QueueUrl=str(url), AttributeNames=["QueueArn"])
            arns[str(url)] = str(found["Attributes"]["QueueArn"])
        driver = Driver(runtime, arns)

        async def turn(k: int) -> float:
            return await driver.turn(thread, seeded + k)

        yield turn
    finally:
        await runtime.aclose()
        await _delete_resources(runtime, env)


async def stepagent_runs(endpoint: str, prefix: str, *, cache: bool, late_seeded: int) -> tuple[float, float]:
    """("turn 10", "turn 500"): a fresh thread and a seeded one, their turns run in lockstep (turn ``k`` of
    one, then turn ``late_seeded + k`` of the other), so both medians see the same load of the machine."""
    async with (
        stepagent_thread(endpoint, f"{prefix}e", cache=cache) as early,
        stepagent_thread(endpoint, f"{prefix}l", cache=cache, seeded=late_seeded) as late,
    ):
        early_ms, late_ms = [], []
        for k in EARLY_TURNS:
            early_ms.append(await early(k))
            late_ms.append(await late(k))
    return _measured(early_ms), _measured(late_ms)


async def _delete_resources(runtime: AwsRuntime, env: dict[str, str]) -> None:
    """moto keeps everything in memory: drop a run's tables and queues once it is measured."""
    from stepagent.aws.clients import aws_session, client

    settings = Settings.from_env(env)
    session = aws_session(settings)
    async with client(session, "dynamodb", settings) as dynamodb, client(session, "sqs", settings) as sqs:
        for table in (settings.conversation_table, settings.state_table):
            await dynamodb.delete_table(TableName=str(table))
        for name, url in env.items():
            if name.endswith(("_QUEUE_URL", "_DLQ_URL")):
                await sqs.delete_queue(QueueUrl=url)


def peer_run(endpoint: str, thread: str, folder: str) -> tuple[list[float], dict[str, str]]:
    """The peer's CPU ms per turn (turns 1-15) and its package versions."""
    spec = {
        "thread": thread,
        "user_texts": [user_text(turn) for turn in EARLY_TURNS],
        "ack": ACK,
        "answer": ANSWER,
        "result_chars": MESSAGE_CHARS,
    }
    spec_path, out_path = os.path.join(folder, "spec.json"), os.path.join(folder, f"{thread}.json")
    with open(spec_path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    command = [
        str(PEER_PYTHON),
        str(PEER_SCRIPT),
        "--endpoint",
        endpoint,
        "--spec",
        spec_path,
        "--out",
        out_path,
    ]
    subprocess.run(command, check=True, cwd=folder, env={**os.environ, "PYTHONPATH": ""})
    with open(out_path, encoding="utf-8") as handle:
        result = json.load(handle)
    return [float(ms) for ms in result["cpu_ms"]], dict(result["versions"])


def _measured(per_turn: list[float]) -> float:
    """The median over the turns after the warm-up ones ("turn 10" of 1-15, "turn 500" of 491-505)."""
    return statistics.median(per_turn[WARMUP_TURNS:])


def _judged(ratios: list[float], target: float) -> dict[str, Any]:
    ratio = statistics.median(ratios)
    return {
        "ratio": round(ratio, 3),
        "per_repetition": [round(r, 3) for r in ratios],
        "target": target,
        "within_target": ratio <= target,
    }


async def peer_cpu(repetitions: int = 5, late_seeded: int = LATE_SEEDED) -> dict[str, Any]:
    """The ``peer_cpu`` section of ``docs/benchmarks.json`` (``late_seeded`` < 490: a smoke run)."""
    if not PEER_PYTHON.exists():
        raise RuntimeError(
            f"{PEER_PYTHON} is missing: `make bench` creates it from bench/peer-requirements.txt"
        )
    fake_credentials()
    runs: dict[str, list[float]] = {
        key: [] for key in ("cold_10", "warm_10", "peer_10", "cold_500", "warm_500")
    }
    versions: dict[str, str] = {}
    with (
        moto_process() as endpoint,
        tempfile.TemporaryDirectory(prefix="stepagent-peer-") as folder,
        production_logging(),
    ):
        for rep in range(repetitions):
            # Interleaved: each repetition measures every figure once, so load from other users of the
            # machine falls on all of them alike.
            for mode in ("cold", "warm"):
                early, late = await stepagent_runs(
                    endpoint, f"pc{rep}{mode}", cache=mode == "warm", late_seeded=late_seeded
                )
                runs[f"{mode}_10"].append(early)
                runs[f"{mode}_500"].append(late)
            peer, versions = peer_run(endpoint, f"peer-{rep}", folder)
            runs["peer_10"].append(_measured(peer))
            print(
                f"  repetition {rep + 1}: "
                + ", ".join(f"{key} {values[-1]:.1f} ms" for key, values in runs.items()),
                flush=True,
            )
    medians = {key: round(statistics.median(values), 2) for key, values in runs.items()}
    pairs = range(repetitions)
    targets = {}
    for mode in ("cold", "warm"):
        targets[f"{mode}_vs_peer_turn_10"] = _judged(
            [runs[f"{mode}_10"][r] / runs["peer_10"][r] for r in pairs], PEER_RATIO_TARGET
        )
        targets[f"{mode}_growth_turn_10_to_500"] = _judged(
            [runs[f"{mode}_500"][r] / runs[f"{mode}_10"][r] for r in pairs], GROWTH_TARGET
        )
    return {
        "peer": PEER_NAME,
        "peer_versions": versions,
        "repetitions": repetitions,
        "late_turns": [late_seeded + 1, late_seeded + len(EARLY_TURNS)],
        "median_cpu_ms_per_turn": {
            "stepagent_cold_turn_10": medians["cold_10"],
            "stepagent_warm_turn_10": medians["warm_10"],
            "peer_turn_10": medians["peer_10"],
            "stepagent_cold_turn_500": medians["cold_500"],
            "stepagent_warm_turn_500": medians["warm_500"],
        },
        "per_repetition_ms": {key: [round(v, 2) for v in values] for key, values in runs.items()},
        "targets": targets,
        "method": (
            "process CPU (time.process_time) per turn, median of turns 6-15 (turn 10) and 496-505 (turn 500, "
            "490 turns seeded behind a compaction summary), medians over interleaved repetitions; stepagent: "
            "the worker and tool-runner handlers (AwsRuntime) on DynamoDB/SQS/S3 of one moto server, 3 "
            "invocations per turn, cold = thread cache off; peer: one LangGraph invoke per turn with "
            "DynamoDBSaver on the same moto, in .venv-peer; both with a scripted model"
        ),
    }
