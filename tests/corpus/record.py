"""Record a release's corpus: threads left at every waiting point, as the bytes that release stored and
queued.

Usage (``make corpus`` runs it against a checkout of the release, see the Makefile)::

    python -m tests.corpus.record tests/corpus/<release>

It starts the moto server, runs the agent of :mod:`tests.corpus.scenarios` through the worker, the tool
runner and the timer relay of whatever ``stepagent`` is importable (``PYTHONPATH`` picks the release to
record), leaves each thread of :data:`~tests.corpus.scenarios.WAITING` (and
:data:`~tests.corpus.scenarios.COMPACTING`, and :data:`~tests.corpus.scenarios.WAITING_ON_RAP` with the
RAP server and receiver of that release) at its point, then writes, per agent, one JSON file of what
is stored and queued — every DynamoDB item as stored (low-level wire form), every queued message (body,
message attributes, group and dedup ids), every schedule's target, every blob (gzip, base64) — plus an export file of two
threads. ``tests/corpus/test_corpus.py`` continues every recorded thread with today's code.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from stepagent.lifecycle.export import export_lines
from stepagent.messages import InputMessage
from tests.corpus.scenarios import (
    AGENT_ENV,
    COMPACTING,
    COMPACTION_SCRIPT,
    RAP_SCRIPT,
    SCRIPT,
    WAITING,
    WAITING_ON_RAP,
    corpus_rap,
    rap_receiver,
)
from tests.integration.aws_helpers import Stack, aws_stack, lambda_record
from tests.polling import eventually

QUEUES = ("input", "tool", "delay", "output")


def queue_url(stack: Stack, name: str) -> str:
    return str(getattr(stack.resources, f"{name}_queue_url"))


async def scan(stack: Stack, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = await stack.dynamodb.scan(**kwargs)
        items.extend(page.get("Items", []))
        if not page.get("LastEvaluatedKey"):
            return sorted(items, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


async def take_all(stack: Stack, url: str) -> list[dict[str, Any]]:
    """Every message on ``url`` (received, kept in flight, not deleted) as recorded."""
    found: list[dict[str, Any]] = []
    empty = 0
    while empty < 2:
        response = await stack.sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
            VisibilityTimeout=600,
            WaitTimeSeconds=0,
        )
        messages = response.get("Messages", [])
        empty = 0 if messages else empty + 1
        for message in messages:
            system = message.get("Attributes", {})
            found.append(
                {
                    "body": message["Body"],
                    "attributes": message.get("MessageAttributes", {}),
                    "group_id": system.get("MessageGroupId"),
                    "dedup_id": system.get("MessageDeduplicationId"),
                }
            )
    return found


async def snapshot(stack: Stack, exports: dict[str, str]) -> dict[str, Any]:
    schedules = []
    listed = await stack.scheduler.list_schedules()
    for summary in listed.get("Schedules", []):
        found = await stack.scheduler.get_schedule(Name=summary["Name"])
        target = found["Target"]
        schedules.append(
            {
                "name": found["Name"],
                "input": target["Input"],
                "group_id": target.get("SqsParameters", {}).get("MessageGroupId"),
            }
        )
    blobs = {}
    objects = await stack.s3.list_objects_v2(Bucket=stack.resources.bucket)
    for entry in objects.get("Contents", []):
        body = await stack.s3.get_object(Bucket=stack.resources.bucket, Key=entry["Key"])
        async with body["Body"] as stream:
            blobs[entry["Key"]] = base64.b64encode(gzip.compress(await stream.read(), mtime=0)).decode()
    export_files = {}
    for thread in exports:
        lines = [line async for line in export_lines(stack.runtime.conversation, stack.runtime.state, thread)]
        export_files[thread] = "".join(line + "\n" for line in lines)
    return {
        "tables": {
            "conversation": await scan(stack, stack.settings.conversation_table),
            "state": await scan(stack, stack.settings.state_table),
        },
        "queues": {name: await take_all(stack, queue_url(stack, name)) for name in QUEUES},
        "schedules": sorted(schedules, key=lambda s: s["name"]),
        "blobs": dict(sorted(blobs.items())),
        "exports": export_files,
    }


async def pump_queue(stack: Stack, name: str) -> None:
    """Hand ``name``'s messages to its handler until it is empty (the other queues wait)."""
    handler = dict(zip(("input", "tool", "delay"), [h for _, h in stack.handlers()], strict=True))[name]
    url = queue_url(stack, name)
    for _ in range(100):
        event = await stack.receive_event(url)
        if not event["Records"]:
            return
        await stack.ack(url, event, await handler(event))
    raise AssertionError(f"the {name} queue did not drain")


async def record_main(stack: Stack) -> dict[str, Any]:
    for waiting in WAITING:
        await stack.send_user(waiting.thread, waiting.say, f"{waiting.thread}-1")
    await pump_queue(stack, "input")
    # Only the big result is run: its claim-checked result waits on the input queue; the other calls wait
    # on the tool queue.
    tool_url = queue_url(stack, "tool")
    messages = await stack.receive(tool_url)
    while more := await stack.receive(tool_url):
        messages += more
    for message in messages:
        record = lambda_record(message)
        if json.loads(message["Body"]).get("tool_name") == "big_payload":
            result = await stack.runtime.handle_tool_batch({"Records": [record]})
            await stack.ack(tool_url, {"Records": [record]}, result)
        else:
            await stack.sqs.change_message_visibility(
                QueueUrl=tool_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
    await stack.wait_visible(queue_url(stack, "delay"))  # the one-second nap
    return await snapshot(stack, {"corpus-tool": "", "corpus-parent": ""})


async def record_compaction(stack: Stack) -> dict[str, Any]:
    thread = COMPACTING.thread
    url = queue_url(stack, "input")
    for turn in range(1, 12):
        await stack.runtime.sender.send(
            InputMessage.user_text(thread, f"turn {turn}", id=f"turn-{turn}"), f"turn-{turn}"
        )
        while (event := await stack.receive_event(url))["Records"]:
            await stack.ack(url, event, await stack.runtime.handle_sqs_batch(event))
            state = await scan(stack, stack.settings.state_table)
            if any(item["sk"]["S"] == "COMPACTION" for item in state):
                return await snapshot(stack, {})
    raise AssertionError("the compaction agent never started a compaction")


async def record_rap(stack: Stack, rap: Any) -> dict[str, Any]:
    """The RAP agent's threads: the worker hands both calls to the RAP server, which holds them; the
    subscription's start result comes back through the receiver and is folded in; then nothing more comes.
    The recording also keeps what the tool server holds (each call's invocation, with its callback URL)."""
    for waiting in WAITING_ON_RAP:
        await stack.send_user(waiting.thread, waiting.say, f"{waiting.thread}-1")
    subscribing = WAITING_ON_RAP[1].thread

    async def settled() -> bool:
        await pump_queue(stack, "input")
        subscribed = await stack.runtime.state.active_subscriptions(subscribing)
        return len(rap.held) == len(WAITING_ON_RAP) and bool(subscribed)

    async with rap_receiver(stack.settings, rap):
        await eventually(settled, "the RAP server holding both calls, the subscription started")
    return {**await snapshot(stack, {}), "rap_calls": dict(sorted(rap.held.items()))}


def release_name() -> str:
    from importlib.metadata import version

    import stepagent

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(stepagent.__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return f"stepagent {version('stepagent')} ({commit})"


async def record() -> dict[str, dict[str, Any]]:
    """Each agent's recording, by agent name."""
    release = release_name()
    agents = (
        ("main", SCRIPT, record_main),
        ("compaction", COMPACTION_SCRIPT, record_compaction),
    )
    recordings = {}
    for name, script, run in agents:
        async with aws_stack(script=script, env=AGENT_ENV) as stack:
            recordings[name] = {"release": release, "agent": name, **await run(stack)}
    async with (
        corpus_rap() as (rap, rap_env),
        aws_stack(script=RAP_SCRIPT, env={**AGENT_ENV, **rap_env}) as stack,
    ):
        recordings["rap"] = {"release": release, "agent": "rap", **await record_rap(stack, rap)}
    return recordings


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    for name, recorded in asyncio.run(record()).items():
        path = directory / f"{name}.json"
        path.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        print(f"corpus: {path} ({sum(len(v) for v in recorded['tables'].values())} items)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
