"""A 500 KB tool result through the real worker on moto (a large payload is stored once): one
stored object for the queue copy, the history row and the output event; at most one S3 read per step;
the user still gets the full text; a redelivery and a rewind break nothing.

Counted three ways, independently: the objects in the bucket (S3's side), every S3 request each runtime's
client sends (a botocore hook, below our code), and the runtimes' store metrics (``s3:PutObject`` /
``s3:GetObject``). The tool runner runs in a runtime of its own, as in Lambda, so the worker starts with
nothing cached.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from bench.large_payload import Requests as S3Requests
from stepagent.aws.runtime import TOOL_RUNNER, AwsRuntime
from stepagent.blobs import ContentBlobs
from stepagent.client import Client
from stepagent.senders.claim_check import ENVELOPE_KEY, unwrap_body
from stepagent.stores.base import Rewind, replace_history
from tests.integration.aws_helpers import SCRIPT, Stack, aws_stack, failed_ids
from tests.integration.test_worker import tid

pytestmark = pytest.mark.asyncio

SIZE = 500_000
TEXT = "x" * SIZE
KEY = f"blobs/sha256/{hashlib.sha256(TEXT.encode()).hexdigest()}"
HALF_MEGABYTE = {
    "when": "half a megabyte",
    "on": ["user"],
    "reply": [{"tool_call": {"name": "big_result", "arguments": {"size": SIZE}}}],
}
BIG_SCRIPT = {**SCRIPT, "rules": [HALF_MEGABYTE, *SCRIPT["rules"]]}


@dataclass
class Deployment:
    """The stack's worker plus a separate tool-runner runtime, each with its S3 requests counted."""

    stack: Stack
    tools: AwsRuntime
    worker_s3: S3Requests
    tools_s3: S3Requests

    async def pump(self, worker: AwsRuntime | None = None) -> list[Counter[str]]:
        """Drain the queues; the worker's S3 requests of each input batch (each step), in order."""
        worker = worker or self.stack.runtime
        counted = self.worker_s3 if worker is self.stack.runtime else await S3Requests.on(worker.s3)
        resources = self.stack.resources
        handlers = [
            (resources.input_queue_url, worker.handle_sqs_batch),
            (resources.tool_queue_url, self.tools.handle_tool_batch),
            (resources.delay_queue_url, worker.handle_delay_batch),
        ]
        steps: list[Counter[str]] = []
        for _ in range(60):
            busy = False
            for url, handler in handlers:
                event = await self.stack.receive_event(url)
                if not event["Records"]:
                    continue
                busy = True
                before = Counter(counted.counts)
                result = await handler(event)
                assert failed_ids(result) == []
                if url == resources.input_queue_url:
                    steps.append(counted.counts - before)
                await self.stack.ack(url, event, result)
            if not busy:
                return steps
        raise AssertionError("the queues did not drain")

    async def big_objects(self) -> list[str]:
        """Keys of the bucket's objects of at least 100 KB."""
        listing = await self.stack.s3.list_objects_v2(Bucket=self.stack.resources.bucket)
        return sorted(o["Key"] for o in listing.get("Contents", []) if o["Size"] >= 100_000)

    async def raw_outputs(self) -> list[str]:
        """The output queue's bodies as sent (drained)."""
        bodies: list[str] = []
        while messages := await self.stack.receive(self.stack.resources.output_queue_url):
            for message in messages:
                bodies.append(message["Body"])
                await self.stack.sqs.delete_message(
                    QueueUrl=self.stack.resources.output_queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
        return bodies


@asynccontextmanager
async def deployment() -> AsyncIterator[Deployment]:
    async with aws_stack(script=BIG_SCRIPT) as stack:
        tools = await AwsRuntime.create(stack.settings, roles=[TOOL_RUNNER])
        try:
            yield Deployment(
                stack, tools, await S3Requests.on(stack.runtime.s3), await S3Requests.on(tools.s3)
            )
        finally:
            await tools.aclose()


async def fresh_worker(stack: Stack) -> AwsRuntime:
    """A cold worker (a new Lambda container): nothing cached."""
    return await AwsRuntime.create(stack.settings)


async def resolved(bodies: list[str], stack: Stack) -> list[dict[str, Any]]:
    """Output bodies as a consumer that never saw them reads them."""
    reader = ContentBlobs(stack.s3, stack.resources.bucket)
    return [json.loads(await unwrap_body(body, reader)) for body in bodies]


async def history_texts(stack: Stack, thread: str) -> list[str]:
    """The thread's transcript texts through ``stepagent.client`` (its own, cold, reads)."""
    async with Client(stack.settings) as client:
        return [str(item.get("text", "")) for item in await client.history(thread)]


async def test_a_500kb_tool_result_is_stored_once_and_read_at_most_once_per_step() -> None:
    async with deployment() as d:
        thread = tid("big")
        await d.stack.send_user(thread, "half a megabyte please", "m1")
        steps = await d.pump()

        assert await d.big_objects() == [KEY]  # S3's side: one object, named by the text's hash
        assert d.tools_s3.counts["PutObject"] == 1  # the tool result, sent by reference
        assert d.worker_s3.counts["PutObject"] == 0  # neither the row nor the output event writes again
        assert all(step["GetObject"] <= 1 for step in steps), steps
        assert sum(step["GetObject"] for step in steps) == 1  # the input's text, read once
        assert d.stack.runtime.store_metrics.calls.get("s3:PutObject", 0) == 0
        assert d.stack.runtime.store_metrics.calls["s3:GetObject"] == 1
        assert d.tools.store_metrics.calls["s3:PutObject"] == 1
        rules = await d.stack.s3.get_bucket_lifecycle_configuration(Bucket=d.stack.resources.bucket)
        assert not any(KEY.startswith(rule["Filter"]["Prefix"]) for rule in rules["Rules"])  # never expires

        bodies = await d.raw_outputs()
        [wire] = [b for b in bodies if ENVELOPE_KEY in b]
        assert len(wire) < 1_000 and KEY in wire  # the output event names the same object
        events = await resolved(bodies, d.stack)
        assert [e["text"] for e in events if e["type"] == "tool_result"] == [TEXT]
        assert await history_texts(d.stack, thread) == [
            "half a megabyte please",
            "",
            TEXT,
            "Got a big result.",
        ]

        # Later turns: the warm worker's caches hold the text; a cold worker reads the blob row once.
        await d.stack.send_user(thread, "and now?", "m2")
        [warm] = await d.pump()
        assert warm["GetObject"] == 0 and warm["PutObject"] == 0
        cold = await fresh_worker(d.stack)
        try:
            await d.stack.send_user(thread, "once more", "m3")
            [step] = await d.pump(cold)
            assert step["GetObject"] == 1 and step["PutObject"] == 0
            assert cold.store_metrics.calls["s3:GetObject"] == 1
        finally:
            await cold.aclose()
        assert await d.big_objects() == [KEY]
        assert (await d.stack.texts(thread))[-2:] == ["once more", "ok"]


async def test_a_redelivered_step_reads_once_and_stores_nothing_again() -> None:
    async with deployment() as d:
        thread = tid("again")
        await d.stack.send_user(thread, "half a megabyte please", "m1")
        url = d.stack.resources.input_queue_url
        # The user's message, then the tool call's run: everything but the tool result's step.
        event = await d.stack.receive_event(url)
        await d.stack.ack(url, event, await d.stack.runtime.handle_sqs_batch(event))
        tool_event = await d.stack.receive_event(d.stack.resources.tool_queue_url)
        tool_result = await d.tools.handle_tool_batch(tool_event)
        await d.stack.ack(d.stack.resources.tool_queue_url, tool_event, tool_result)

        # The step commits and publishes, but its record is not acknowledged (a crash after publishing).
        event = await d.stack.receive_event(url)
        assert failed_ids(await d.stack.runtime.handle_sqs_batch(event)) == []
        for record in event["Records"]:
            await d.stack.sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
            )
        cold = await fresh_worker(d.stack)
        try:
            requests = await S3Requests.on(cold.s3)
            again = await d.stack.receive_event(url)
            assert again["Records"][0]["attributes"]["ApproximateReceiveCount"] == "2"
            result = await cold.handle_sqs_batch(again)  # dedup, then a replay of the step's events
            await d.stack.ack(url, again, result)
            assert failed_ids(result) == []
            assert requests.counts["GetObject"] == 1 and requests.counts["PutObject"] == 0
        finally:
            await cold.aclose()

        assert await d.big_objects() == [KEY]
        assert (await d.stack.texts(thread)).count(TEXT) == 1
        events = await resolved(await d.raw_outputs(), d.stack)
        results = [e for e in events if e["type"] == "tool_result"]
        assert results and all(e["text"] == TEXT for e in results)
        assert len({e["event_id"] for e in results}) == 1  # a replay, not a second event


async def test_rewinding_one_thread_keeps_the_object_another_thread_uses() -> None:
    async with deployment() as d:
        first, second = tid("first"), tid("second")
        for thread in (first, second):
            await d.stack.send_user(thread, "half a megabyte please", "m1")
            await d.pump()
        assert await d.big_objects() == [KEY]  # both threads' rows and outputs share it
        assert d.tools_s3.counts["PutObject"] == 1  # the second tool result was known to exist
        conversation = d.stack.runtime.conversation

        # Drop the first thread's result every way the store drops rows: a rewind, a whole-history
        # replacement and the sweep of the replaced generation.
        info = await conversation.get_thread(first)
        assert info is not None
        info = await conversation.rewind(first, Rewind(expected_version=info.version, to_order=2))
        kept = [(row.item, row.message_id) async for row in conversation.load_rows(first)]
        await replace_history(conversation, first, info.version, kept[:1])
        assert await conversation.sweep_generations(first, now=time.time() + 3600, lease_seconds=0) > 0
        assert await d.stack.texts(first) == ["half a megabyte please"]

        assert await d.big_objects() == [KEY]
        assert TEXT in await history_texts(d.stack, second)  # a cold reader still gets the full text
        events = await resolved(await d.raw_outputs(), d.stack)  # so does the output queue's
        assert [e["thread_id"] for e in events if e["type"] == "tool_result" and e["text"] == TEXT] == [
            first,
            second,
        ]
