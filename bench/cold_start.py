"""Cold start of the worker Lambda against the peer, measured in one run: import and first invocation.

:func:`cold_start` runs, interleaved and ``runs`` times each, in fresh interpreters (:mod:`bench.cold_child`,
``python -I``):

- the worker handler's import exactly as Lambda does it: module ``worker`` of ``Handler: worker.handler``
  (template.yaml), ``python -I -S`` with the function's code (``handlers/``, Lambda's ``/var/task``), this
  checkout's ``src/`` and the built layer (``make build-RuntimeLayer``: the Lambda wheels of the pinned
  dependencies, nothing development-only) on ``sys.path``, in the environment the template gives
  ``WorkerFunction`` (evaluated by ``tests/artifact/template_env.py``) plus the variables Lambda sets. The
  layer is built into a temporary folder (a few minutes: pip fetches the wheels) unless
  ``STEPAGENT_BENCH_LAYER`` names an already built one (its ``python/`` folder);
- ``import strands`` in the peer's interpreter: ``STEPAGENT_PEER_PYTHON``, else ``.venv-peer/bin/python``
  (``bench/peer-requirements.txt``); without one that ratio is skipped with a note saying so;
- a cold container: the import, then two handler calls, each with a real SQS-event-shaped batch of one user
  message on a new thread (the second is the warm, comparable call), against a moto server in this process
  (so not in the measured one's CPU), with the template's default model — Bedrock's Claude Sonnet 4.5 —
  answered by a loopback stand-in for the Bedrock runtime endpoint (``tests/providers/bedrock_stub.py``,
  the real ConverseStream event-stream encoding, also in this process), so the Bedrock provider, its
  aioboto3 client and its stream parsing are all in the measured CPU. The same container with the scripted
  model is measured too (``scripted_*``: no model client), for comparison. Reported: the CPU
  (``time.process_time``) of the first call minus that of the second, and the AWS clients alive after
  the import (must be 0) and opened by each call. Every call must answer its message (checked on the
  output queue), or the run fails. Not in the figures: TLS handshakes (moto and the stand-in are plain
  HTTP on loopback; each client's CA-bundle parse is in them, since aiobotocore does it at a client's first
  request whatever the scheme) and network latency.

The ratios use medians of the same run, so a loaded machine slows both sides alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types_aiobotocore_sqs import SQSClient

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("cold_child.py")
PEER_PYTHON_ENV = "STEPAGENT_PEER_PYTHON"
LAYER_ENV = "STEPAGENT_BENCH_LAYER"
IMPORT_RATIO_TARGET = 0.8
FIRST_MINUS_WARM_TARGET_MS = 300
REGION = "us-east-1"
ANSWER = "Cold start answered."
SCRIPT = {"rules": [], "default": [{"text": ANSWER}]}
#: What the Bedrock stand-in streams for every ConverseStream call: the same answer, as Bedrock sends it.
BEDROCK_ANSWER: list[dict[str, Any]] = [
    {"messageStart": {"role": "assistant"}},
    {"contentBlockDelta": {"delta": {"text": ANSWER}, "contentBlockIndex": 0}},
    {"contentBlockStop": {"contentBlockIndex": 0}},
    {"messageStop": {"stopReason": "end_turn"}},
    {
        "metadata": {
            "usage": {"inputTokens": 12, "outputTokens": 4, "totalTokens": 16},
            "metrics": {"latencyMs": 9},
        }
    },
]
# The third-party modules a worker's first message cannot do without, whoever imports them: the AWS SDK
# (aioboto3: aiobotocore's clients over aiohttp), pydantic's model machinery and powertools. Their import
# is reported as the floor of the worker's own, next to the peer's.
FLOOR = (
    "aioboto3",
    "aiobotocore.session",
    "aiobotocore.client",
    "aiobotocore.endpoint",
    "aiobotocore.httpsession",
    "pydantic.main",
    "aws_lambda_powertools",
)

# What Lambda's Python runtime sets for every function (fake credentials: the moto server only).
LAMBDA_ENV = {
    "AWS_LAMBDA_FUNCTION_NAME": "WorkerFunction",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024",
    "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
    "AWS_EXECUTION_ENV": "AWS_Lambda_python3.13",
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_SESSION_TOKEN": "bench",
    "_X_AMZN_TRACE_ID": "Root=1-00000000-000000000000000000000000;Parent=53995c3f42cd8ad8;Sampled=1",
    "PATH": "/usr/bin:/bin",
    "TZ": ":UTC",
}


def peer_candidate() -> Path:
    """Where the peer's interpreter is looked for: ``STEPAGENT_PEER_PYTHON``, else ``.venv-peer``."""
    configured = os.environ.get(PEER_PYTHON_ENV)
    return Path(configured) if configured else ROOT / ".venv-peer" / "bin" / "python"


def peer_python() -> Path | None:
    """The peer's interpreter, or ``None`` when there is none."""
    path = peer_candidate()
    return path if path.exists() else None


def built_layer(folder: Path) -> Path:
    """The layer's ``python/`` folder: ``STEPAGENT_BENCH_LAYER``, else built into ``folder`` as `sam build`
    builds it."""
    configured = os.environ.get(LAYER_ENV)
    if configured:
        return Path(configured)
    subprocess.run(
        ["make", "-s", "build-RuntimeLayer", f"ARTIFACTS_DIR={folder}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return folder / "python"


def base_python() -> str:
    """The interpreter behind the venv: with ``-S`` none of the venv's packages are importable."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def peer_version(python: Path) -> str:
    """The strands-agents version installed for the peer's interpreter."""
    query = "import importlib.metadata as m; print(m.version('strands-agents'))"
    done = subprocess.run([str(python), "-c", query], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def handler_path() -> tuple[str, str]:
    """``(module, function)`` of the worker's ``Handler`` in template.yaml."""
    from tests.artifact.template_env import load_template

    handler = str(load_template()["Resources"]["WorkerFunction"]["Properties"]["Handler"])
    module, _, function = handler.rpartition(".")
    return module, function


def run_child(command: list[str], request: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [*command, str(CHILD)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        cwd=request["path"][0] if request["path"] else None,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cold-start child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@dataclass
class MotoStack:
    """The worker's resources on a moto server in this process, and clients to drive them."""

    env: dict[str, str]
    sqs: SQSClient
    urls: dict[str, str]

    async def batch(self, group: str) -> dict[str, Any]:
        """One user message on thread ``group``, as `stepagent send` queues it, received as Lambda's SQS
        event source hands it to the worker."""
        body = {"content": {"type": "text", "text": "hello"}, "group_id": group}
        await self.sqs.send_message(
            QueueUrl=self.urls["input"],
            MessageBody=json.dumps(body),
            MessageGroupId=group,
            MessageDeduplicationId=f"{group}-1",
        )
        found = await self.sqs.receive_message(
            QueueUrl=self.urls["input"],
            MaxNumberOfMessages=1,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
            WaitTimeSeconds=1,
        )
        (message,) = found["Messages"]
        record = {
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": message["Body"],
            "attributes": dict(message.get("Attributes", {})),
            "messageAttributes": {},
            "eventSource": "aws:sqs",
        }
        return {"Records": [record]}

    async def answered(self) -> set[str]:
        """Threads that got the answer (scripted or streamed by the Bedrock stand-in) on the output queue
        since the last call."""
        threads: set[str] = set()
        while True:
            found = await self.sqs.receive_message(
                QueueUrl=self.urls["output"], MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = found.get("Messages", [])
            if not messages:
                return threads
            for message in messages:
                event = json.loads(message["Body"])
                if event.get("type") == "text" and event.get("text") == ANSWER:
                    threads.add(event["thread_id"])
                await self.sqs.delete_message(
                    QueueUrl=self.urls["output"], ReceiptHandle=message["ReceiptHandle"]
                )


@contextmanager
def bedrock_stand_in() -> Iterator[str]:
    """A loopback Bedrock runtime endpoint in this process answering every ConverseStream call with
    :data:`BEDROCK_ANSWER`; yields its URL (for ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME``)."""
    from tests.providers.bedrock_stub import serve

    with contextmanager(serve)() as stub:
        stub.events = BEDROCK_ANSWER
        yield stub.url


def with_script(env: dict[str, str], script: Path) -> dict[str, str]:
    """``env`` with the scripted model ``script`` (the only variable the template's ``Model`` sets)."""
    return {**env, "STEPAGENT_MODEL": f"scripted:{script}"}


@asynccontextmanager
async def deployed_worker(endpoint: str, bedrock_url: str) -> AsyncIterator[MotoStack]:
    """The worker's resources, fresh, on the moto server at ``endpoint``, with ``WorkerFunction``'s
    environment as the template gives it (every parameter its default: the model is Bedrock's Claude
    Sonnet 4.5, whose endpoint is ``bedrock_url``) plus Lambda's variables. :func:`with_script` turns that
    environment into the scripted model's."""
    from tests.artifact.template_env import Evaluator, load_template

    from stepagent.aws.clients import AwsSession, open_client
    from stepagent.aws.queue_resources import LOCAL_SCHEDULER_ROLE_ARN, ensure_queues_and_bucket
    from stepagent.aws.resources import ensure_tables

    module, function = handler_path()
    session = AwsSession(REGION, credentials=("bench", "bench"))
    async with AsyncExitStack() as stack:
        sqs = await stack.enter_async_context(open_client(session, "sqs", endpoint))
        s3 = await stack.enter_async_context(open_client(session, "s3", endpoint))
        dynamodb = await stack.enter_async_context(open_client(session, "dynamodb", endpoint))
        secrets = await stack.enter_async_context(open_client(session, "secretsmanager", endpoint))
        prefix = f"cold-{uuid.uuid4().hex[:8]}"
        resources = await ensure_queues_and_bucket(sqs, s3, prefix=prefix, region=REGION)
        await ensure_tables(dynamodb, f"{prefix}-conversation", f"{prefix}-state")
        secret = await secrets.create_secret(Name=f"{prefix}-callback", SecretString=uuid.uuid4().hex)
        physical = {
            "ConversationTable": f"{prefix}-conversation",
            "StateTable": f"{prefix}-state",
            "InputQueue": resources.input_queue_url,
            "OutputQueue": resources.output_queue_url,
            "DelayQueue": resources.delay_queue_url,
            "ToolQueue": resources.tool_queue_url,
            "BlobBucket": resources.bucket,
            "CallbackSecret": secret["ARN"],
            "SchedulerRole.Arn": LOCAL_SCHEDULER_ROLE_ARN,
            "DelayDeadLetterQueue.Arn": resources.scheduler_dlq_arn,
            "RapReceiverFunctionUrl.FunctionUrl": "https://receiver.lambda-url.us-east-1.on.aws/",
        }
        evaluator = Evaluator(load_template(), physical, {}, region=REGION)
        env = {
            **evaluator.environment("WorkerFunction"),
            **LAMBDA_ENV,
            "LAMBDA_TASK_ROOT": str(ROOT / "handlers"),
            "_HANDLER": f"{module}.{function}",
            "AWS_ENDPOINT_URL": endpoint,
            # Only the Bedrock runtime's endpoint: the provider ignores AWS_ENDPOINT_URL on purpose.
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": bedrock_url,
        }
        if not env.get("STEPAGENT_MODEL", "").startswith("bedrock:"):
            raise RuntimeError(f"the template's default model is not Bedrock's: {env.get('STEPAGENT_MODEL')}")
        yield MotoStack(env, sqs, resources.urls)


@asynccontextmanager
async def moto_stack() -> AsyncIterator[MotoStack]:
    """:func:`deployed_worker` on a moto server of its own and a Bedrock stand-in, in this process."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        with bedrock_stand_in() as bedrock_url:
            async with deployed_worker(f"http://{host}:{port}", bedrock_url) as stack:
                yield stack
    finally:
        server.stop()


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


async def cold_start(runs: int = 7) -> dict[str, Any]:
    module, function = handler_path()
    peer = peer_python()
    worker_python = [base_python(), "-I", "-S"]
    peer_python_command = [str(peer), "-I"] if peer is not None else []
    worker_imports: list[dict[str, Any]] = []
    floor_imports: list[dict[str, Any]] = []
    peer_imports: list[dict[str, Any]] = []
    invocations: list[dict[str, Any]] = []
    scripted: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stepagent-cold-") as folder:
        path = [str(ROOT / "handlers"), str(ROOT / "src"), str(built_layer(Path(folder) / "layer"))]
        script = Path(folder) / "agent.json"
        script.write_text(json.dumps(SCRIPT), encoding="utf-8")
        async with moto_stack() as stack:
            importing = {"path": path, "module": module}
            # One unmeasured import each first: bytecode caches written, files in the page cache.
            run_child(worker_python, importing, stack.env)
            if peer is not None:
                run_child(peer_python_command, {"path": [], "module": "strands"}, LAMBDA_ENV)
            floor = {"path": path, "module": FLOOR[0], "also": list(FLOOR[1:])}
            for run in range(runs):
                worker_imports.append(run_child(worker_python, importing, stack.env))
                floor_imports.append(run_child(worker_python, floor, stack.env))
                if peer is not None:
                    strands = {"path": [], "module": "strands"}
                    peer_imports.append(run_child(peer_python_command, strands, LAMBDA_ENV))
                for model, env, into in (
                    ("bedrock", stack.env, invocations),
                    ("scripted", with_script(stack.env, script), scripted),
                ):
                    groups = [f"cold-{run}-{model}-first", f"cold-{run}-{model}-warm"]
                    events = [await stack.batch(group) for group in groups]
                    calling = {**importing, "function": function, "events": events}
                    into.append(run_child(worker_python, calling, env))
                    for call in into[-1]["calls"]:
                        if call["result"] != {"batchItemFailures": []}:
                            raise RuntimeError(f"the worker ({model}) failed a record: {call['result']}")
                    if await stack.answered() != set(groups):
                        raise RuntimeError(f"the worker ({model}) did not answer both threads of run {run}")
    out = summary(worker_imports, peer_imports, invocations)
    out["model"] = str(stack.env["STEPAGENT_MODEL"])
    first = [i["calls"][0]["cpu_ms"] for i in scripted]
    warm = [i["calls"][1]["cpu_ms"] for i in scripted]
    out["scripted_first_call_cpu_ms_median"] = _median(first)
    out["scripted_warm_call_cpu_ms_median"] = _median(warm)
    out["scripted_first_minus_warm_cpu_ms_median"] = _median(
        [f - w for f, w in zip(first, warm, strict=True)]
    )
    out["scripted_aws_clients_created_by_first_call"] = scripted[-1]["calls"][0]["aws_clients_created"]
    out["floor_modules"] = list(FLOOR)
    out["floor_import_cpu_ms_median"] = _median([f["import_cpu_ms"] for f in floor_imports])
    if peer is not None:
        out["peer_version"] = peer_version(peer)
        out["floor_import_cpu_ratio"] = round(
            out["floor_import_cpu_ms_median"] / out["peer_import_cpu_ms_median"], 3
        )
    return out


def summary(
    worker: list[dict[str, Any]],
    peer: list[dict[str, Any]],
    invocations: list[dict[str, Any]],
) -> dict[str, Any]:
    first = [i["calls"][0]["cpu_ms"] for i in invocations]
    warm = [i["calls"][1]["cpu_ms"] for i in invocations]
    extra = [f - w for f, w in zip(first, warm, strict=True)]
    out: dict[str, Any] = {
        "method": (
            "medians of fresh interpreters, interleaved in one run; import: the WorkerFunction handler "
            "module as Lambda imports it (python -I -S, built layer, template environment) vs import "
            "strands in the peer venv, wall (import_ratio, judged) and CPU; first minus warm: process CPU "
            "of a cold container's first one-message SQS batch minus its second's, with the template's default "
            "Bedrock model answered by a loopback ConverseStream stand-in (scripted_*: the scripted model), "
            "moto and the stand-in in another process, plain HTTP (no TLS handshake in the figures)"
        ),
        "runs": len(worker),
        "worker_import_ms_median": _median([w["import_wall_ms"] for w in worker]),
        "worker_import_cpu_ms_median": _median([w["import_cpu_ms"] for w in worker]),
        "aws_clients_after_import": max(len(i["aws_clients_after_import"]) for i in invocations),
        "aws_clients_created_by_first_call": invocations[-1]["calls"][0]["aws_clients_created"],
        "aws_clients_created_by_warm_call": invocations[-1]["calls"][1]["aws_clients_created"],
        "http_clients_created_by_first_call": invocations[-1]["calls"][0]["http_clients_created"],
        "first_call_cpu_ms_median": _median(first),
        "warm_call_cpu_ms_median": _median(warm),
        "first_minus_warm_cpu_ms_median": _median(extra),
        "first_minus_warm_target_ms": FIRST_MINUS_WARM_TARGET_MS,
        "first_minus_warm_within_target": statistics.median(extra) <= FIRST_MINUS_WARM_TARGET_MS,
        "import_ratio_target": IMPORT_RATIO_TARGET,
    }
    if not peer:
        out["peer"] = (
            f"skipped: no peer interpreter at {peer_candidate()} (set {PEER_PYTHON_ENV} or create "
            ".venv-peer from bench/peer-requirements.txt), so there is no import ratio"
        )
        out["import_ratio_within_target"] = None
        return out
    out["peer"] = "import strands (strands-agents) in the peer's venv"
    out["peer_import_ms_median"] = _median([p["import_wall_ms"] for p in peer])
    out["peer_import_cpu_ms_median"] = _median([p["import_cpu_ms"] for p in peer])
    out["import_ratio"] = round(out["worker_import_ms_median"] / out["peer_import_ms_median"], 3)
    out["import_cpu_ratio"] = round(out["worker_import_cpu_ms_median"] / out["peer_import_cpu_ms_median"], 3)
    out["import_ratio_within_target"] = out["import_ratio"] <= IMPORT_RATIO_TARGET
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(cold_start(int(sys.argv[1]) if len(sys.argv) > 1 else 3)), indent=2))
