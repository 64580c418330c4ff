"""Persistent local state for the embedded stack: a snapshot saved at exit and loaded at start.

The embedded moto server lives in memory, so without this every conversation is gone when ``stepagent
run`` exits. With a state directory (``--state-dir DIR`` or ``STEPAGENT_STATE_DIR``), :func:`local_state`
starts the embedded stack, loads ``DIR`` into it, hands the settings to the command, and (for commands that
change something) saves the stack back to ``DIR`` when the command ends, so ``run --thread``, ``history``,
``export``, ``rewind`` and ``import`` work across restarts.

Guarantees:

- The snapshot goes through the AWS APIs (Scan, GetObject, ReceiveMessage), not moto's internals, so it
  survives moto upgrades and reads like the data it holds: one JSON line per table item, one file per blob,
  one JSON line per queued message, and a ``snapshot.json`` manifest with a format version.
- It is written to a sibling temporary directory and swapped in with renames, so an interrupted save leaves
  the previous snapshot whole.
- What is not kept, and why: messages in flight or not yet visible at exit (a delay-queue timer still
  counting down, a batch being processed) — the queue does not show them. A conversation that was idle at
  exit is kept whole.
"""

# Local files are read and written with plain blocking calls: a snapshot is taken when the command has
# finished (or before it starts), with nothing else running on the loop.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepagent.aws.clients import aws_session, client
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.metrics import StoreMetrics

FORMAT_VERSION = 1
_TABLES = {"conversation": "STEPAGENT_CONVERSATION_TABLE", "state": "STEPAGENT_STATE_TABLE"}
_QUEUES = {
    "input": "STEPAGENT_INPUT_QUEUE_URL",
    "tool": "STEPAGENT_TOOL_QUEUE_URL",
    "delay": "STEPAGENT_DELAY_QUEUE_URL",
}


@dataclass(frozen=True, slots=True)
class SnapshotCounts:
    """How much a snapshot saved or loaded."""

    items: int = 0
    blobs: int = 0
    messages: int = 0

    def __str__(self) -> str:
        return f"{self.items} table items, {self.blobs} blobs, {self.messages} queued messages"


def _encode(value: Any) -> Any:
    """DynamoDB JSON with binary values as base64 (``{"B": b"..."}`` → ``{"B64": "..."}``)."""
    if isinstance(value, bytes | bytearray):
        return {"__b64__": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__b64__"}:
            return base64.b64decode(value["__b64__"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


async def save_snapshot(directory: Path, env: dict[str, str]) -> SnapshotCounts:
    """Write the stack named by ``env`` (settings + ``AWS_ENDPOINT_URL``) to ``directory``."""
    settings = Settings.from_env(env)
    session = aws_session(settings)
    scratch = directory.with_name(directory.name + ".saving")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "blobs").mkdir(parents=True)
    items = blobs = messages = 0
    async with (
        client(session, "dynamodb", settings) as dynamodb,
        client(session, "s3", settings) as s3,
        client(session, "sqs", settings) as sqs,
    ):
        for role, name in _TABLES.items():
            with open(scratch / f"{role}.jsonl", "w", encoding="utf-8") as out:
                pages = dynamodb.get_paginator("scan").paginate(TableName=env[name], ConsistentRead=True)
                async for page in pages:
                    for item in page.get("Items", []):
                        out.write(json.dumps(_encode(item), ensure_ascii=False) + "\n")
                        items += 1
        bucket = env["STEPAGENT_BLOB_BUCKET"]
        with open(scratch / "blobs.jsonl", "w", encoding="utf-8") as manifest:
            async for listed in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for entry in listed.get("Contents", []):
                    blobs += 1
                    obj = await s3.get_object(Bucket=bucket, Key=entry["Key"])
                    async with obj["Body"] as body:
                        (scratch / "blobs" / f"{blobs:06d}").write_bytes(await body.read())
                    manifest.write(json.dumps({"key": entry["Key"], "file": f"{blobs:06d}"}) + "\n")
        with open(scratch / "queues.jsonl", "w", encoding="utf-8") as out:
            for role, name in _QUEUES.items():
                seen: set[str] = set()
                while True:
                    found = await sqs.receive_message(
                        QueueUrl=env[name],
                        MaxNumberOfMessages=10,
                        VisibilityTimeout=60,
                        MessageSystemAttributeNames=["All"],
                        MessageAttributeNames=["All"],
                        WaitTimeSeconds=0,
                    )
                    fresh = [m for m in found.get("Messages", []) if m["MessageId"] not in seen]
                    if not fresh:
                        break
                    for message in fresh:
                        seen.add(message["MessageId"])
                        attributes = message.get("Attributes", {})
                        record = {
                            "queue": role,
                            "body": message["Body"],
                            "group_id": attributes.get("MessageGroupId"),
                            "dedup_id": attributes.get("MessageDeduplicationId"),
                            "attributes": message.get("MessageAttributes", {}),
                        }
                        out.write(json.dumps(record, ensure_ascii=False) + "\n")
                        messages += 1
    counts = SnapshotCounts(items, blobs, messages)
    (scratch / "snapshot.json").write_text(
        json.dumps({"format": FORMAT_VERSION, "items": items, "blobs": blobs, "messages": messages}) + "\n"
    )
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    scratch.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return counts


def has_snapshot(directory: Path) -> bool:
    """Whether ``directory`` holds a snapshot (its ``snapshot.json`` manifest)."""
    return (directory / "snapshot.json").is_file()


async def load_snapshot(directory: Path, env: dict[str, str]) -> SnapshotCounts:
    """Put the snapshot in ``directory`` into the (empty) stack named by ``env``."""
    manifest = json.loads((directory / "snapshot.json").read_text())
    if manifest.get("format") != FORMAT_VERSION:
        raise ConfigurationError(
            f"{directory} holds a snapshot in format {manifest.get('format')!r}; this stepagent reads format "
            f"{FORMAT_VERSION} (move it aside to start afresh)"
        )
    settings = Settings.from_env(env)
    session = aws_session(settings)
    items = blobs = messages = 0
    async with (
        client(session, "dynamodb", settings) as dynamodb,
        client(session, "s3", settings) as s3,
        client(session, "sqs", settings) as sqs,
    ):
        # The stores' batch writer: 25 items a request, unprocessed items retried.
        io = DynamoIo(dynamodb, None, None, StoreMetrics())
        for role, name in _TABLES.items():
            with open(directory / f"{role}.jsonl", encoding="utf-8") as lines:
                loaded = [_decode(json.loads(line)) for line in lines]
            await io.batch_put(env[name], loaded)
            items += len(loaded)
        with open(directory / "blobs.jsonl", encoding="utf-8") as lines:
            for line in lines:
                entry = json.loads(line)
                body = (directory / "blobs" / entry["file"]).read_bytes()
                await s3.put_object(Bucket=env["STEPAGENT_BLOB_BUCKET"], Key=entry["key"], Body=body)
                blobs += 1
        with open(directory / "queues.jsonl", encoding="utf-8") as lines:
            for line in lines:
                record = json.loads(line)
                send: dict[str, Any] = {
                    "QueueUrl": env[_QUEUES[record["queue"]]],
                    "MessageBody": record["body"],
                }
                if record["group_id"]:
                    send["MessageGroupId"] = record["group_id"]
                    send["MessageDeduplicationId"] = record["dedup_id"] or str(messages)
                if record["attributes"]:
                    send["MessageAttributes"] = {
                        k: {
                            key: v
                            for key, v in value.items()
                            if key in ("DataType", "StringValue", "BinaryValue")
                        }
                        for k, value in record["attributes"].items()
                    }
                await sqs.send_message(**send)
                messages += 1
    return SnapshotCounts(items, blobs, messages)


@asynccontextmanager
async def local_state(
    directory: str | os.PathLike[str], *, save: bool, prefix: str
) -> AsyncIterator[dict[str, str]]:
    """Start the embedded stack, load ``directory`` into it (if it holds a snapshot), set the settings in
    ``os.environ`` and yield them; on exit save the stack back when ``save`` (also after an error: what was
    committed is kept), then stop the stack."""
    from stepagent.devstack.stack import EmbeddedMoto, create_resources, use_fake_credentials

    if os.environ.get("AWS_ENDPOINT_URL"):
        raise ConfigurationError(
            "--state-dir keeps the embedded stack's state; with AWS_ENDPOINT_URL set the state lives in that "
            "endpoint (LocalStack has its own persistence): unset one of them"
        )
    path = Path(directory).expanduser().resolve()
    moto = EmbeddedMoto()
    endpoint = moto.start()
    use_fake_credentials()
    try:
        env = {**await create_resources(endpoint, prefix), "AWS_ENDPOINT_URL": endpoint}
        os.environ.update(env)
        if has_snapshot(path):
            counts = await load_snapshot(path, env)
            print(f"restored the local state from {path} ({counts})", file=sys.stderr)
        try:
            yield env
        finally:
            if save:
                path.parent.mkdir(parents=True, exist_ok=True)
                counts = await save_snapshot(path, env)
                print(f"saved the local state to {path} ({counts})", file=sys.stderr)
    finally:
        moto.stop()
