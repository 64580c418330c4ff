"""``large_payload``: what a 500 KB tool result costs in S3, through the real worker and tool runner on moto.

One thread: the user asks, the model calls a tool that returns 500 KB of text, the tool result comes back
through the input queue, the model answers; then two more user turns, one on the warm worker and one on a
cold one (a new runtime: nothing cached). Measured from outside the product: every S3 request each
runtime's client sends (a botocore ``before-call`` hook) and the objects left in the bucket. The worker and
the tool runner are separate runtimes, as in Lambda.

Targets (a large payload is stored once and read at most once per step): one stored object per payload (``PutObject`` calls for the text
across queue + row + output = 1) and at most one ``GetObject`` per step. Runs against any version of the
code, since it reads nothing but the clients and the bucket.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from bench.overhead import local_moto
from stepagent.aws.clients import LazyClient
from stepagent.tools.functions import tool

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_sqs import SQSClient

SIZE = 500_000
PUT_TARGET = 1
GETS_PER_STEP_TARGET = 1


@tool
def big_result(size: int) -> str:
    """A result of ``size`` characters."""
    return "x" * size


TOOLS = [big_result]
SCRIPT = {
    "rules": [
        {
            "when": "half a megabyte",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "big_result", "arguments": {"size": SIZE}}}],
        },
        {"when": "^x{1000}", "on": ["tool_result"], "reply": [{"text": "Got a big result."}]},
    ],
    "default": [{"text": "ok"}],
}


class Requests:
    """Every S3 request one client sends, by operation (a botocore ``before-call`` hook)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    @classmethod
    async def on(cls, s3: S3Client) -> Requests:
        """Count ``s3``'s requests (a runtime's lazy client is opened for its hooks)."""
        requests = cls()
        real = await s3.opened_client() if isinstance(s3, LazyClient) else s3
        real.meta.events.register("before-call.s3", requests._count)
        return requests

    def _count(self, model: Any, **_: Any) -> None:
        self.counts[model.name] += 1


@contextlib.asynccontextmanager
async def _stack() -> AsyncIterator[tuple[dict[str, str], SQSClient, S3Client]]:
    """(environment, sqs client, s3 client) of fresh tables, queues and bucket on a local moto server."""
    from stepagent.aws.clients import AwsSession, open_client
    from stepagent.aws.queue_resources import ensure_queues_and_bucket
    from stepagent.aws.resources import ensure_tables

    session = AwsSession("us-east-1")
    handle, script = tempfile.mkstemp(prefix="bench-script-", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump(SCRIPT, out)
    try:
        with local_moto() as endpoint:
            async with (
                open_client(session, "sqs", endpoint) as sqs,
                open_client(session, "s3", endpoint) as s3,
                open_client(session, "dynamodb", endpoint) as dynamodb,
            ):
                prefix = f"bench-{uuid.uuid4().hex[:8]}"
                resources = await ensure_queues_and_bucket(sqs, s3, prefix=prefix, region="us-east-1")
                await ensure_tables(dynamodb, f"{prefix}-conversation", f"{prefix}-state")
                env = {
                    **resources.env(),
                    "STEPAGENT_CONVERSATION_TABLE": f"{prefix}-conversation",
                    "STEPAGENT_STATE_TABLE": f"{prefix}-state",
                    "STEPAGENT_MODEL": f"scripted:{script}",
                    "STEPAGENT_TOOLS": "bench.large_payload:TOOLS",
                    "AWS_ENDPOINT_URL": endpoint,
                    "AWS_REGION": "us-east-1",
                }
                yield env, sqs, s3
    finally:
        os.unlink(script)


class _Pump:
    """Feeds the queues to the runtimes like the event sources (successes deleted)."""

    def __init__(self, env: dict[str, str], sqs: SQSClient, tools: Any) -> None:
        self.env, self.sqs, self.tools = env, sqs, tools

    async def _batch(self, url: str) -> dict[str, Any]:
        found = await self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], WaitTimeSeconds=0
        )
        return {
            "Records": [
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "attributes": dict(m.get("Attributes", {})),
                    "messageAttributes": {},
                    "eventSource": "aws:sqs",
                }
                for m in found.get("Messages", [])
            ]
        }

    async def once(self, url: str, handler: Any, *, ack: bool = True) -> None:
        """One batch of ``url`` through ``handler``; unacknowledged (visible again at once) unless ``ack``."""
        event = await self._batch(url)
        await handler(event)
        for record in event["Records"]:
            if ack:
                await self.sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
            else:
                await self.sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
                )

    async def run(self, worker: Any, requests: Requests) -> list[dict[str, int]]:
        """Drain every queue; the worker's S3 requests of each input batch (one step each here)."""
        routes = [
            (self.env["STEPAGENT_INPUT_QUEUE_URL"], worker.handle_sqs_batch),
            (self.env["STEPAGENT_TOOL_QUEUE_URL"], self.tools.handle_tool_batch),
        ]
        steps: list[dict[str, int]] = []
        for _ in range(30):
            busy = False
            for url, handler in routes:
                event = await self._batch(url)
                if not event["Records"]:
                    continue
                busy = True
                before = Counter(requests.counts)
                result = await handler(event)
                failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
                if failed:
                    raise RuntimeError(f"records failed: {failed}")
                if url == routes[0][0]:
                    delta = requests.counts - before
                    steps.append({"GetObject": delta["GetObject"], "PutObject": delta["PutObject"]})
                for record in event["Records"]:
                    await self.sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])
            if not busy:
                return steps
        raise RuntimeError("the queues did not drain")


async def _send(runtime: Any, thread: str, text: str, message_id: str) -> None:
    from stepagent.messages import InputMessage

    await runtime.sender.send(InputMessage.user_text(thread, text, id=message_id), message_id)


async def _redelivered(settings: Any, env: dict[str, str], pump: _Pump, worker: Any) -> dict[str, int]:
    """S3 requests of a cold worker handling a redelivered tool-result step (the first attempt committed
    and published, then died before acknowledging)."""
    from stepagent.aws.runtime import WORKER, AwsRuntime

    thread = f"bench-{uuid.uuid4().hex[:8]}"
    inputs, tools = env["STEPAGENT_INPUT_QUEUE_URL"], env["STEPAGENT_TOOL_QUEUE_URL"]
    await _send(worker, thread, "half a megabyte please", "r1")
    await pump.once(inputs, worker.handle_sqs_batch)
    await pump.once(tools, pump.tools.handle_tool_batch)
    await pump.once(inputs, worker.handle_sqs_batch, ack=False)
    async with AwsRuntime.open(settings, roles=[WORKER]) as cold:
        requests = await Requests.on(cold.s3)
        await pump.once(inputs, cold.handle_sqs_batch)
    return {"GetObject": requests.counts["GetObject"], "PutObject": requests.counts["PutObject"]}


async def large_payload_costs() -> dict[str, Any]:
    """The ``large_payload`` section of ``docs/benchmarks.json``."""
    from stepagent.aws.runtime import TOOL_RUNNER, WORKER, AwsRuntime
    from stepagent.aws.settings import Settings

    async with _stack() as (env, sqs, s3):
        settings = Settings.from_env(env)
        async with (
            AwsRuntime.open(settings, roles=[WORKER]) as worker,
            AwsRuntime.open(settings, roles=[TOOL_RUNNER]) as tools,
        ):
            worker_requests, tool_requests = await Requests.on(worker.s3), await Requests.on(tools.s3)
            pump = _Pump(env, sqs, tools)
            thread = f"bench-{uuid.uuid4().hex[:8]}"
            await _send(worker, thread, "half a megabyte please", "m1")
            first = await pump.run(worker, worker_requests)
            await _send(worker, thread, "and now?", "m2")
            warm = await pump.run(worker, worker_requests)
            async with AwsRuntime.open(settings, roles=[WORKER]) as cold:
                cold_requests = await Requests.on(cold.s3)
                await _send(cold, thread, "once more", "m3")
                later_cold = await pump.run(cold, cold_requests)
            by_runtime = {
                "tool_runner": tool_requests.counts["PutObject"],
                "worker": worker_requests.counts["PutObject"],
                "cold_worker": cold_requests.counts["PutObject"],
            }
            listing = await s3.list_objects_v2(Bucket=env["STEPAGENT_BLOB_BUCKET"])
            objects = listing.get("Contents", [])
            redelivered = await _redelivered(settings, env, pump, worker)
    puts = sum(by_runtime.values())
    gets = [step["GetObject"] for step in [*first, *warm, *later_cold, redelivered]]
    return {
        "method": (
            "one 500 KB tool result through the worker and a separate tool runner on moto (S3, SQS, "
            "DynamoDB), then a warm and a cold later turn; then, on a second thread with the same result, "
            "a redelivered result step on a cold worker; S3 requests counted on each runtime's client "
            "(botocore hook), objects listed in the bucket after the first thread (puts and bytes: its own)"
        ),
        "payload_bytes": SIZE,
        "puts": puts,
        "puts_by_runtime": by_runtime,
        "redelivery_puts": redelivered["PutObject"],
        "objects_over_100kb": sum(1 for o in objects if o["Size"] >= 100_000),
        "bytes_stored": sum(int(o["Size"]) for o in objects),
        "gets_per_step": {
            "first_turn": [step["GetObject"] for step in first],
            "later_turn_warm": [step["GetObject"] for step in warm],
            "later_turn_cold": [step["GetObject"] for step in later_cold],
            "redelivered_result_step_cold": redelivered["GetObject"],
            "max": max(gets),
        },
        "targets": {
            "puts": {"target": PUT_TARGET, "value": puts, "within_target": puts <= PUT_TARGET},
            "gets_per_step": {
                "target": GETS_PER_STEP_TARGET,
                "value": max(gets),
                "within_target": max(gets) <= GETS_PER_STEP_TARGET,
            },
        },
    }
