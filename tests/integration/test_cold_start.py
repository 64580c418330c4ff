"""The worker Lambda's cold start does only the work its first message needs (counters, not timers).

The handler module of ``WorkerFunction`` (template.yaml's ``Handler``) is imported in a fresh interpreter
(``bench/cold_child.py``, ``python -I``), in the environment the template gives the function (every
parameter its default, so the model is Bedrock's Claude Sonnet 4.5, answered by a loopback stand-in for
the Bedrock runtime endpoint) plus Lambda's variables, exactly as ``make bench`` measures it; then it takes
two real SQS-event-shaped batches of one user message each (a cold call, then a warm one) against the moto
server.

Checked: the import creates no AWS client and loads none of the modules a first message does not need
(the console, the CLI, local mode, tool-server and MCP code, the providers — the configured one is built
by the first invocation —, the X-Ray SDK); the AWS SDK (aioboto3 over aiohttp) is loaded by the import,
since every message needs it. The cold call opens exactly the clients that message needs (SQS, DynamoDB,
Secrets Manager for the callback key, the Bedrock runtime for the model: no S3, no Scheduler, no HTTP client
without RAP servers) and the warm call opens none — the model's client included, so it is not opened per
model call. With telemetry off (no ``OTEL_EXPORTER_OTLP_*ENDPOINT``) no OpenTelemetry module is ever
imported.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from bench.cold_start import ROOT, bedrock_stand_in, deployed_worker, handler_path, run_child
from tests.conftest import moto_endpoint

# The SDK every message needs (stepagent.aws.clients): loaded by the import, not by the first message.
SDK = ("aioboto3", "aiobotocore", "aiohttp")
# Not needed before the first message: adding an eager import of any of these fails this test.
NOT_AT_IMPORT = (
    "stepagent.cli",
    "stepagent.console",
    "stepagent.client",
    "stepagent.demo",
    "stepagent.devstack",
    "stepagent.lifecycle",
    "stepagent.testing",
    "stepagent.transcript",
    "stepagent.modes.local_mode",
    "stepagent.stores.memory",
    "stepagent.stores.sqlite",
    "stepagent.rap.protocol",
    "stepagent.rap.receiver",
    "stepagent.rap.server",
    "stepagent.tools.mcp",
    "stepagent.tools.rap",
    "stepagent.tools.rap_http",
    "stepagent.providers.anthropic",
    "stepagent.providers.bedrock",
    "stepagent.providers.http",
    "stepagent.providers.openai_compat",
    "stepagent.providers.scripted",  # the configured provider is built by the first invocation
    "aws_xray_sdk",  # not used at all (traces are OpenTelemetry's)
    "opentelemetry",  # telemetry is off unless the OTEL_* variables turn it on
    "google.protobuf",
    "mcp",
    "starlette",
    "uvicorn",
    "jinja2",  # the web console's templates
    "sqlite3",
    "moto",
)
# Not needed by a first message without RAP servers nor payloads over the queue's size limit (S3's
# client and aioboto3's S3 helpers load only with the first oversized payload), nor with telemetry off (the
# template's default: no OTLP endpoint).
NOT_BY_FIRST_MESSAGE = ("httpcore", "s3transfer", "aioboto3.s3", "aiofiles", "aws_xray_sdk", "opentelemetry")


@pytest.fixture(scope="module")
def cold_container() -> dict[str, Any]:
    """One cold container's report (``bench/cold_child.py``) after two user messages."""
    module, function = handler_path()

    async def run() -> dict[str, Any]:
        with bedrock_stand_in() as bedrock_url:
            return await call(bedrock_url)

    async def call(bedrock_url: str) -> dict[str, Any]:
        async with deployed_worker(moto_endpoint(), bedrock_url) as stack:
            groups = ["cold-first", "cold-warm"]
            events = [await stack.batch(group) for group in groups]
            request = {
                "path": [str(ROOT / "handlers"), str(ROOT / "src")],
                "module": module,
                "function": function,
                "events": events,
            }
            report = run_child([sys.executable, "-I"], request, stack.env)
            report["answered"] = sorted(await stack.answered())
            return report

    return asyncio.run(run())


def test_the_import_creates_no_client_and_loads_nothing_the_first_message_does_not_need(
    cold_container: dict[str, Any],
) -> None:
    assert cold_container["aws_clients_after_import"] == []
    loaded = set(cold_container["modules_after_import"])
    assert "stepagent.aws.lambda_entry" in loaded  # the handler module really was imported
    assert set(SDK) <= loaded
    eager = sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in NOT_AT_IMPORT))
    assert eager == []


def test_the_first_message_opens_only_the_clients_it_needs_and_a_warm_one_none(
    cold_container: dict[str, Any],
) -> None:
    cold, warm = cold_container["calls"]
    assert cold["result"] == warm["result"] == {"batchItemFailures": []}
    assert cold_container["answered"] == ["cold-first", "cold-warm"]  # both messages got the answer
    assert cold["aws_clients_created"] == ["bedrock-runtime", "dynamodb", "secretsmanager", "sqs"]
    assert cold["http_clients_created"] == 0
    assert warm["aws_clients_created"] == [] and warm["http_clients_created"] == 0
    loaded = set(cold_container["modules_after_calls"])
    assert "stepagent.providers.bedrock" in loaded  # built on first use
    assert "stepagent.providers.scripted" not in loaded
    assert (
        sorted(m for m in loaded if m.split(".")[0] in NOT_BY_FIRST_MESSAGE or m in NOT_BY_FIRST_MESSAGE)
        == []
    )
