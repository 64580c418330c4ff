"""Load a recorded corpus (:mod:`tests.corpus.record`) into a fresh stack on moto and drive its threads.

:func:`loaded` deploys today's code on the recorded data as a new release would find it: the same tables'
items byte for byte, the same queued messages (bodies, attributes, groups, dedup ids), the same blob
bucket and objects; due schedules are delivered as EventBridge Scheduler would (the target input, as is);
the delay queue's wake-ups are put back without their delay. :func:`continue_threads` then answers what
only a person answers (the approval) and pumps every queue until all are empty. For the RAP agent,
:func:`loaded_with_rap` adds the tool server and the receiver, and :func:`answer_rap_calls` has the tool
server send, through the recorded callback URLs, what the held calls were waiting for.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from stepagent.history_items import waiting_for_approval
from stepagent.messages import InputMessage
from tests.corpus.scenarios import (
    AGENT_ENV,
    COMPACTION_SCRIPT,
    RAP_SCRIPT,
    SCRIPT,
    CorpusRapServer,
    corpus_rap,
    rap_receiver,
)
from tests.integration.aws_helpers import Stack, aws_stack

CORPUS = Path(__file__).parent
SCRIPTS = {"main": SCRIPT, "compaction": COMPACTION_SCRIPT, "rap": RAP_SCRIPT}


def releases() -> list[Path]:
    """Every recorded release (a directory of ``tests/corpus``), oldest name first."""
    return sorted(p for p in CORPUS.iterdir() if p.is_dir() and (p / "main.json").is_file())


def recorded_bucket(recorded: dict[str, Any]) -> str | None:
    """The blob bucket the recording ran with (named by its claim-checked bodies)."""
    for messages in recorded["queues"].values():
        for message in messages:
            if '"stepagent_claim_check"' in message["body"]:
                return str(json.loads(message["body"])["stepagent_claim_check"]["bucket"])
    return None


@asynccontextmanager
async def loaded(recorded: dict[str, Any], extra_env: dict[str, str] | None = None) -> AsyncIterator[Stack]:
    """A stack running today's code over ``recorded`` (``extra_env``: more settings of the agent)."""
    bucket = recorded_bucket(recorded)
    # The deployment's blob bucket stays across a deploy (claim checks name it): the recorded one.
    env = {**AGENT_ENV, **(extra_env or {}), **({"STEPAGENT_BLOB_BUCKET": bucket} if bucket else {})}
    async with aws_stack(script=SCRIPTS[recorded["agent"]], env=env) as stack:
        if bucket is not None:
            with contextlib.suppress(stack.s3.exceptions.BucketAlreadyOwnedByYou):
                await stack.s3.create_bucket(Bucket=bucket)
        await _load(stack, recorded, stack.settings.blob_bucket or stack.resources.bucket)
        yield stack


async def _load(stack: Stack, recorded: dict[str, Any], bucket: str) -> None:
    tables = {"conversation": stack.settings.conversation_table, "state": stack.settings.state_table}
    for name, items in recorded["tables"].items():
        for item in items:
            await stack.dynamodb.put_item(TableName=tables[name], Item=item)
    for key, data in recorded["blobs"].items():
        await stack.s3.put_object(Bucket=bucket, Key=key, Body=gzip.decompress(base64.b64decode(data)))
    for name in ("input", "tool", "delay"):
        url = getattr(stack.resources, f"{name}_queue_url")
        for message in recorded["queues"][name]:
            send: dict[str, Any] = {"QueueUrl": url, "MessageBody": message["body"]}
            if message["attributes"]:
                send["MessageAttributes"] = message["attributes"]
            if message["group_id"]:
                send["MessageGroupId"] = message["group_id"]
            if message["dedup_id"]:
                send["MessageDeduplicationId"] = message["dedup_id"]
            await stack.sqs.send_message(**send)
    for schedule in recorded["schedules"]:  # due now: delivered the way the Scheduler sends its target
        await stack.sqs.send_message(
            QueueUrl=stack.resources.input_queue_url,
            MessageBody=schedule["input"],
            MessageGroupId=schedule["group_id"],
            MessageDeduplicationId=hashlib.sha256(schedule["input"].encode()).hexdigest(),
        )


@asynccontextmanager
async def loaded_with_rap(recorded: dict[str, Any]) -> AsyncIterator[tuple[Stack, CorpusRapServer]]:
    """:func:`loaded` for the RAP agent: today's code, the corpus RAP server (a new process: it knows
    only what it held, the recorded invocations) and today's receiver behind the deployment's unchanged
    callback URL and key."""
    async with (
        corpus_rap() as (rap, rap_env),
        loaded(recorded, rap_env) as stack,
        rap_receiver(stack.settings, rap),
    ):
        yield stack, rap


async def answer_rap_calls(rap: CorpusRapServer, recorded: dict[str, Any]) -> None:
    """The tool server answers every call it held, through each call's recorded callback URL (and so its
    token, as the recorded release issued it): the report, the subscription's final event. A callback the
    receiver refuses raises (the SDK's ``CallbackRefusedError``)."""
    for invocation in recorded["rap_calls"].values():
        await rap.answer(invocation)


async def continue_threads(stack: Stack, threads: list[str]) -> None:
    """Approve what waits for approval, then pump every queue until all are empty."""
    for thread in threads:
        rows = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
        waiting = waiting_for_approval(rows)
        if waiting is not None:
            decision = f"approve-{thread}"
            await stack.runtime.sender.send(
                InputMessage.approval(thread, waiting.call.id, "approve", id=decision), decision
            )
    await stack.pump(rounds=80)


async def dead_letters(stack: Stack) -> list[dict[str, Any]]:
    """Everything on the three DLQs (input, tool, delay)."""
    found: list[dict[str, Any]] = []
    for role, url in stack.resources.urls.items():
        if role.endswith("_dlq"):
            found += await stack.receive(url)
    return found
