"""The deployed artifact runs every handler.

The layer is built exactly as ``sam build`` builds it (``make build-RuntimeLayer``, the same recipe, wheels
resolved for the Lambda platform) with the example tools project (``examples/tools_project``, one
third-party dependency), into a temporary folder. Each of the four functions then runs in its own clean
interpreter (``python -I -S``: only the function's code and the layer on ``sys.path``, ``LAMBDA_TASK_ROOT``
set, the environment the template gives that function and nothing else) against the moto server; this
test plays Lambda's event sources and the Function URL, handing them Lambda-shaped events.

The interpreter is the one the template deploys (``Runtime: python3.13``): the layer is built and every
handler runs on that CPython version (this venv's own interpreter when it is that version, else pyenv's or
one on ``PATH``; the test fails, naming the version, when the machine has none).

Covered: a user message through worker → tool queue → tool runner (the user's tool, importing its own
dependency) → worker; an inline user tool; an MCP tool run by the tool runner; a timer through the delay
queue and the relay; a RAP tool whose result comes back through the receiver's Function URL; a forged
callback refused with a 4xx. The callback key is read from Secrets Manager, as deployed. With the
template's ``OtlpEndpoint`` pointing at an OTLP/HTTP collector on loopback, every function exports its spans
before it returns, and each conversation is one trace across the functions that served it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stepagent.aws.queue_resources import LOCAL_SCHEDULER_ROLE_ARN, ensure_queues_and_bucket
from stepagent.aws.resources import ensure_tables
from stepagent.blobs import ContentBlobs
from stepagent.devstack.rap_demo_server import build_server
from stepagent.rap.server import serve_in_background
from stepagent.senders.claim_check import unwrap_body
from tests.api.helpers import AUDIENCE, ISSUER, ec_key, jwks_server
from tests.artifact.template_env import Evaluator, load_template
from tests.conftest import REGION, aws_client, moto_endpoint, unique_name
from tests.integration.aws_helpers import lambda_record
from tests.otlp_collector import otlp_collector
from tests.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("lambda_driver.py")
ECHO_SERVER = ROOT / "tests" / "mcp" / "fixtures" / "echo_server.py"
TOOLS_PROJECT = ROOT / "examples" / "tools_project"
API_KEY = ec_key("artifact-1")
FUNCTIONS = ("WorkerFunction", "ToolRunnerFunction", "TimerRelayFunction", "RapReceiverFunction")

pytestmark = pytest.mark.slow

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "forecast",
            "on": ["user"],
            "reply": [
                {"text": "Checking the forecast."},
                {
                    "tool_call": {
                        "name": "forecast_size",
                        "arguments": {"city": "Paris", "bytes_of_data": 3000000},
                    }
                },
            ],
        },
        {
            "when": "^The forecast for Paris",
            "on": ["tool_result"],
            "reply": [{"text": "Forecast delivered."}],
        },
        {
            "when": "ordinal",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "ordinal", "arguments": {"n": 21}}}],
        },
        {"when": "^21st$", "on": ["tool_result"], "reply": [{"text": "Ordinal computed."}]},
        {
            "when": "nap",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 1}}}],
        },
        {"when": "^Slept for", "on": ["tool_result"], "reply": [{"text": "Awake."}]},
        {"when": "time", "on": ["user"], "reply": [{"tool_call": {"name": "get_time", "arguments": {}}}]},
        {"when": "UTC", "on": ["tool_result"], "reply": [{"text": "Time received."}]},
        {
            "when": "echo",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "echo__echo", "arguments": {"text": "from the layer"}}}],
        },
        {"when": "^echo: from the layer", "on": ["tool_result"], "reply": [{"text": "Echo received."}]},
    ],
    "default": [{"text": "I did not understand."}],
}

CONVERSATIONS = {
    "forecast": "Forecast delivered.",
    "ordinal": "Ordinal computed.",
    "nap": "Awake.",
    "time": "Time received.",
    "echo": "Echo received.",
}


def runtime_version() -> str:
    """The Python version the template deploys, e.g. ``3.13`` for ``Runtime: python3.13``."""
    runtime = str(load_template()["Globals"]["Function"]["Runtime"])
    assert runtime.startswith("python"), runtime
    return runtime.removeprefix("python")


def runtime_python() -> str:
    """A base interpreter (no venv: ``-S`` must leave only the standard library) of the deployed version."""
    version = runtime_version()
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return str(getattr(sys, "_base_executable", None) or sys.executable)
    candidates = sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))
    found = [str(c) for c in candidates] + [p for p in [shutil.which(f"python{version}")] if p]
    if not found:
        pytest.fail(
            f"the template deploys python{version} and the built layer must be tested on it, but this machine "
            f"has no python{version} (install it, e.g. pyenv install {version})"
        )
    return found[0]


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make build-RuntimeLayer`` into a temporary ARTIFACTS_DIR, as ``sam build`` runs it."""
    artifacts = tmp_path_factory.mktemp("RuntimeLayer")
    subprocess.run(
        [
            "make",
            "-s",
            "build-RuntimeLayer",
            f"ARTIFACTS_DIR={artifacts}",
            f"TOOLS_DIR={TOOLS_PROJECT}",
            f"PYTHON={layer_build_python()}",
        ],
        cwd=ROOT,
        check=True,
    )
    return artifacts / "python"


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The functions' code as ``sam build`` packages ``CodeUri: handlers/``, plus the model script."""
    root = tmp_path_factory.mktemp("task") / "var-task"
    shutil.copytree(ROOT / "handlers", root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "agent.json").write_text(json.dumps(SCRIPT))
    return root


def layer_build_python() -> str:
    """This venv's interpreter when it is the runtime's version (its pip builds the wheel), else the
    runtime's base interpreter: the layer's ``.pyc`` files are compiled by whichever runs the build."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == runtime_version():
        return sys.executable
    return runtime_python()


@dataclass
class LambdaFunction:
    """One function's warm container: a clean interpreter running ``lambda_driver.py``."""

    name: str
    process: asyncio.subprocess.Process
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    invocations: int = 0

    async def invoke(self, event: dict[str, Any], function_timeout: float = 300) -> dict[str, Any]:
        async with self.lock:
            assert self.process.stdin is not None and self.process.stdout is not None
            request = {"event": event, "request_id": uuid.uuid4().hex, "timeout": function_timeout}
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            await self.process.stdin.drain()
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout=120)
            self.invocations += 1
        if not line:
            raise AssertionError(f"{self.name} exited (code {await self.process.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"{self.name} raised {answer['error']}\n{answer['traceback']}")
        return answer["result"]  # type: ignore[no-any-return]


@asynccontextmanager
async def start_function(
    name: str, handler: str, env: dict[str, str], layer: Path, task_root: Path
) -> AsyncIterator[LambdaFunction]:
    lambda_env = {
        **env,
        "LAMBDA_TASK_ROOT": str(task_root),
        "AWS_LAMBDA_FUNCTION_NAME": name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_EXECUTION_ENV": f"AWS_Lambda_python{runtime_version()}",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_ENDPOINT_URL": moto_endpoint(),
        "PATH": "/usr/bin:/bin",
        "TZ": ":UTC",
    }
    process = await asyncio.create_subprocess_exec(
        runtime_python(),
        "-I",
        "-S",
        str(DRIVER),
        str(task_root),
        str(layer),
        handler,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=lambda_env,
        cwd=str(task_root),
    )
    try:
        yield LambdaFunction(name, process)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            process.kill()


def function_url_event(
    method: str, path: str, query: dict[str, str], body: bytes, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Lambda Function URL (payload format 2.0) event (header names in lower case, as Lambda gives them)."""
    return {
        "version": "2.0",
        "rawPath": path,
        "rawQueryString": "&".join(f"{k}={v}" for k, v in query.items()),
        "queryStringParameters": query or None,
        "headers": {"content-type": "application/json", **(headers or {})},
        "requestContext": {"http": {"method": method, "path": path}},
        "body": body.decode(),
        "isBase64Encoded": False,
    }


def function_url_app(functions: dict[str, LambdaFunction]) -> Any:
    """An ASGI app standing in for the receiver's Function URL: request → event → the function → response.
    The function is looked up per request: the worker needs the URL before the receiver has started."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = dict(
            pair.split("=", 1) for pair in scope.get("query_string", b"").decode().split("&") if "=" in pair
        )
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        event = function_url_event(scope["method"], scope["path"], query, body, headers)
        result = await functions["RapReceiverFunction"].invoke(event, 30)
        await send(
            {
                "type": "http.response.start",
                "status": result["statusCode"],
                "headers": [(k.encode(), v.encode()) for k, v in result.get("headers", {}).items()],
            }
        )
        await send({"type": "http.response.body", "body": result.get("body", "").encode()})

    return app


@dataclass
class DeployedStack:
    sqs: Any
    s3: Any
    urls: dict[str, str]
    bucket: str
    functions: dict[str, LambdaFunction]
    receiver_url: str
    api_env: dict[str, str] = field(default_factory=dict)

    async def receive_event(self, role: str) -> dict[str, Any]:
        found = await self.sqs.receive_message(
            QueueUrl=self.urls[role],
            MaxNumberOfMessages=10,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
            WaitTimeSeconds=0,
        )
        return {"Records": [lambda_record(m) for m in found.get("Messages", [])]}

    async def pump_once(self) -> bool:
        """One poll of each event source; True when something ran."""
        busy = False
        for role, function in (
            ("input", "WorkerFunction"),
            ("tool", "ToolRunnerFunction"),
            ("delay", "TimerRelayFunction"),
        ):
            event = await self.receive_event(role)
            if not event["Records"]:
                continue
            busy = True
            result = await self.functions[function].invoke(event)
            failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
            assert not failed, f"{function} reported failures: {result}"
            for record in event["Records"]:
                await self.sqs.delete_message(QueueUrl=self.urls[role], ReceiptHandle=record["receiptHandle"])
        return busy

    async def outputs(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            found = await self.sqs.receive_message(
                QueueUrl=self.urls["output"], MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = found.get("Messages", [])
            if not messages:
                return out
            for message in messages:
                out.append(json.loads(await unwrap_body(message["Body"], ContentBlobs(self.s3, self.bucket))))
                await self.sqs.delete_message(
                    QueueUrl=self.urls["output"], ReceiptHandle=message["ReceiptHandle"]
                )


@asynccontextmanager
async def deployed(layer: Path, task_root: Path, otlp_endpoint: str) -> AsyncIterator[DeployedStack]:
    async with AsyncExitStack() as stack:
        sqs = await stack.enter_async_context(aws_client("sqs"))
        s3 = await stack.enter_async_context(aws_client("s3"))
        dynamodb = await stack.enter_async_context(aws_client("dynamodb"))
        secrets = await stack.enter_async_context(aws_client("secretsmanager"))
        kms = await stack.enter_async_context(aws_client("kms"))
        prefix = unique_name("art")
        resources = await ensure_queues_and_bucket(sqs, s3, prefix=prefix, region=REGION)
        await ensure_tables(dynamodb, f"{prefix}-conversation", f"{prefix}-state")
        secret = await secrets.create_secret(Name=f"{prefix}-callback", SecretString=uuid.uuid4().hex * 2)
        oauth_key = (await kms.create_key(Description=f"{prefix} oauth tokens"))["KeyMetadata"]["KeyId"]

        demo_url = await stack.enter_async_context(serve_in_background(build_server().app))
        jwks = stack.enter_context(jwks_server([API_KEY]))
        functions: dict[str, LambdaFunction] = {}
        receiver_url = await stack.enter_async_context(serve_in_background(function_url_app(functions)))

        physical = {
            "ConversationTable": f"{prefix}-conversation",
            "StateTable": f"{prefix}-state",
            "InputQueue": resources.input_queue_url,
            "OutputQueue": resources.output_queue_url,
            "DelayQueue": resources.delay_queue_url,
            "ToolQueue": resources.tool_queue_url,
            "BlobBucket": resources.bucket,
            "CallbackSecret": secret["ARN"],
            "OAuthTokenKey": oauth_key,
            # The tool runner's STEPAGENT_API_URL (where MCP sign-ins return); no sign-in runs here.
            "ApiFunctionUrl.FunctionUrl": "https://api.lambda-url.us-east-1.on.aws/",
            "SchedulerRole.Arn": LOCAL_SCHEDULER_ROLE_ARN,
            "DelayDeadLetterQueue.Arn": resources.scheduler_dlq_arn,
            "RapReceiverFunctionUrl.FunctionUrl": receiver_url + "/",
        }
        parameters = {
            "Model": f"scripted:{task_root / 'agent.json'}",
            "Tools": "weather_tools.tools:toolset",
            "RapServers": demo_url,
            "McpServers": json.dumps(
                [{"name": "echo", "command": sys.executable, "args": [str(ECHO_SERVER)]}]
            ),
            "OtlpEndpoint": otlp_endpoint,
            "ApiJwtJwksUrl": jwks.url,
            "ApiJwtIssuer": ISSUER,
            "ApiJwtAudience": AUDIENCE,
        }
        template = load_template()
        evaluator = Evaluator(template, physical, parameters, region=REGION)
        for name in FUNCTIONS:
            handler = template["Resources"][name]["Properties"]["Handler"]
            functions[name] = await stack.enter_async_context(
                start_function(name, handler, evaluator.environment(name), layer, task_root)
            )
        yield DeployedStack(
            sqs,
            s3,
            resources.urls,
            resources.bucket,
            functions,
            receiver_url,
            evaluator.environment("ApiFunction"),
        )


async def test_the_built_layer_runs_every_handler(layer: Path, task_root: Path) -> None:
    assert not (layer / "moto").exists() and not (layer / "pytest").exists(), (
        "development packages in the layer"
    )
    assert (layer / "humanize").is_dir(), "the tools project's dependency is missing from the layer"
    with otlp_collector() as collector:
        await run_conversations(layer, task_root, collector.url)
    # Every function exported before returning (the driver reads the answer only after the handler returned).
    steps = [s for s in collector.spans if s.name == "invoke_agent"]
    by_conversation: dict[str, set[str]] = {}
    for span in steps:
        by_conversation.setdefault(str(span.attributes["gen_ai.conversation.id"]), set()).add(span.trace_id)
    # The conversations the driver sent, plus the one the HTTP API started (its message came through
    # ApiFunction, so its steps are traced like any other).
    assert set(by_conversation) == {*CONVERSATIONS, "api-art"}
    assert all(len(traces) == 1 for traces in by_conversation.values()), by_conversation
    [forecast] = by_conversation["forecast"]
    ran = [s.name for s in collector.spans if s.trace_id == forecast and s.name.startswith("execute_tool")]
    assert ran.count("execute_tool forecast_size") == 2  # the worker's dispatch, the tool runner's run
    assert {s.service for s in collector.spans} == {"stepagent"}


async def run_conversations(layer: Path, task_root: Path, otlp_endpoint: str) -> None:
    async with deployed(layer, task_root, otlp_endpoint) as stack:
        worker = stack.functions["WorkerFunction"]
        # A user message per conversation, as `stepagent send` puts it on the queue.
        for thread in CONVERSATIONS:
            await stack.sqs.send_message(
                QueueUrl=stack.urls["input"],
                MessageBody=json.dumps({"content": {"type": "text", "text": thread}, "group_id": thread}),
                MessageGroupId=thread,
                MessageDeduplicationId=f"{thread}-1",
            )
        events: list[dict[str, Any]] = []
        answered: dict[str, str] = {}

        async def all_answered() -> bool:
            busy = await stack.pump_once()
            for event in await stack.outputs():
                events.append(event)
                if event["type"] == "text" and event["text"] == CONVERSATIONS.get(event["thread_id"]):
                    answered[event["thread_id"]] = event["text"]
            done = set(answered) == set(CONVERSATIONS)
            if not busy and not done:
                await asyncio.sleep(0.2)  # a timer or a RAP callback is on its way
            return done

        await eventually(all_answered, "an answer in every conversation", within=90, interval=0)
        errors = [e for e in events if e["type"] == "error"]
        assert not errors, errors
        results = {e["thread_id"]: e.get("text", "") for e in events if e["type"] == "tool_result"}
        assert results["forecast"] == "The forecast for Paris is 3.0 MB."  # humanize, in the tool runner
        assert results["ordinal"] == "21st"  # humanize, inline in the worker
        assert results["echo"].startswith("echo: from the layer")  # the MCP client from the layer
        assert stack.functions["RapReceiverFunction"].invocations >= 1
        assert stack.functions["TimerRelayFunction"].invocations >= 1
        assert worker.invocations >= 2  # the answers came from a second, warm invocation

        # A forged callback is refused with a 4xx and a JSON error, and nothing is queued.
        import httpx

        async with httpx.AsyncClient() as http:
            forged = await http.post(
                f"{stack.receiver_url}/?token=forged", json={"type": "toolresult", "content": []}
            )
        assert 400 <= forged.status_code < 500 and "error" in forged.json()
        assert not (await stack.receive_event("input"))["Records"]

        # The HTTP API from the artifact: api_run.sh as the Web Adapter starts it (the layer as /opt/python,
        # an interpreter without site-packages), the template's environment; the adapter's part (relaying the
        # Function URL's requests to $PORT) is played by this test's HTTP client.
        async with api_function(stack.api_env, layer, task_root) as api_url:
            await api_round_trip(stack, api_url)


@asynccontextmanager
async def api_function(env: dict[str, str], layer: Path, task_root: Path) -> AsyncIterator[str]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bin_dir = task_root.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {runtime_python()} -S "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    runtime_dir = task_root.parent / "runtime"
    runtime_dir.mkdir(exist_ok=True)
    lambda_env = {
        **env,
        "PORT": str(port),
        "LAMBDA_TASK_ROOT": str(task_root),
        "LAMBDA_RUNTIME_DIR": str(runtime_dir),
        "PYTHONPATH": str(layer),
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": moto_endpoint(),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
    }
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    process = await asyncio.create_subprocess_exec(
        "/bin/sh", str(task_root / "api_run.sh"), env=lambda_env, cwd=str(task_root)
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        async with httpx.AsyncClient() as http:
            for _ in range(300):  # the adapter's readiness check: GET / until it answers
                assert process.returncode is None, "the API exited at start"
                try:
                    if (await http.get(url + "/")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        yield url
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)


async def api_round_trip(stack: DeployedStack, url: str) -> None:
    import httpx

    auth = {"Authorization": f"Bearer {API_KEY.token('artifact-user')}"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.get("/v1/threads/api-art")).status_code == 401
        sent = await http.post("/v1/threads/api-art/messages", json={"text": "ordinal"}, headers=auth)
        assert sent.status_code == 202, sent.text

        async def answered() -> bool:
            await stack.pump_once()
            history = (await http.get("/v1/threads/api-art", headers=auth)).json()
            return bool(history) and history[-1]["kind"] == "assistant"

        await eventually(answered, "the API thread's answer", within=60, interval=0.1)
        # The tree's events, streamed: the committed events, then the end after the root's turn_complete.
        async with http.stream("GET", "/v1/threads/api-art/events", headers=auth) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            kinds = [line[6:].strip() async for line in response.aiter_lines() if line.startswith("event:")]
        assert "tool_call" in kinds and kinds[-1] == "turn_complete"
