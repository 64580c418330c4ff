"""The dead-letter queues, for people: list what failed and why, show one message, redrive after a fix.

Guarantees:

- The DLQs are found from their source queues' ``RedrivePolicy`` (the input queue and the tool queue), so
  the same settings (or ``--stack``) as every other command are enough, on moto, LocalStack or AWS.
- Listing does not consume: messages are received with a short visibility timeout and made visible again
  at once. SQS lets a reader see at most ``limit`` messages of a FIFO DLQ per message group in one pass.
- Redrive sends each message back to its source queue unchanged (the same body, its format version
  attribute, and, on the FIFO input
  queue, the same message group, so its thread's order is kept) and deletes it from the DLQ only after the
  send succeeded: a crash in between leaves a duplicate in the source queue, which the worker's dedup by
  logical id (or the tool call id) absorbs, never a loss. The FIFO dedup id is the original one with a
  ``:redrive`` suffix, so SQS's five-minute dedup window cannot swallow a quick redrive. A send or delete
  that fails transiently (throttling, a 5xx) is tried again through the one backoff rule
  (:func:`~stepagent.aws.transient.retry_transient`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from stepagent.aws.transient import retry_transient
from stepagent.errors import ConfigurationError
from stepagent.senders.sqs import FORMAT_ATTRIBUTE

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_sqs import SQSClient
    from types_aiobotocore_sqs.type_defs import MessageTypeDef

QUEUES = ("input", "tool")
_LIST_HOLD_SECONDS = 30
_MAX_DEDUP_ID = 128


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered message."""

    queue: str  # "input" or "tool"
    message_id: str
    thread_id: str | None
    reason: str | None
    receive_count: int
    body: str
    group_id: str | None
    dedup_id: str | None
    receipt_handle: str
    #: The body's format version as the message carried it (``stepagent_format``; ``None``: version 1).
    format_version: str | None = None

    def summary(self) -> dict[str, Any]:
        """What ``dlq list --json`` shows (no receipt handle, the body shortened)."""
        return {
            "queue": self.queue,
            "message_id": self.message_id,
            "thread_id": self.thread_id,
            "reason": self.reason,
            "receive_count": self.receive_count,
            "body": self.body if len(self.body) <= 200 else self.body[:200] + "…",
        }


async def dead_letter_queue(sqs: SQSClient, source_url: str) -> str:
    """The URL of ``source_url``'s DLQ (its redrive target, in the same account and region)."""
    found = await sqs.get_queue_attributes(QueueUrl=source_url, AttributeNames=["RedrivePolicy"])
    policy = found.get("Attributes", {}).get("RedrivePolicy")
    if not policy:
        raise ConfigurationError(f"the queue {source_url} has no dead-letter queue (no RedrivePolicy)")
    arn = str(json.loads(policy)["deadLetterTargetArn"])
    return source_url.rsplit("/", 1)[0] + "/" + arn.rsplit(":", 1)[1]


def _thread_of(queue: str, body: str, group_id: str | None) -> str | None:
    if group_id:
        return group_id
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get("thread_id") if isinstance(data, dict) and queue == "tool" else None


def _letter(queue: str, message: MessageTypeDef) -> DeadLetter:
    attributes = message.get("Attributes", {})
    custom = message.get("MessageAttributes", {})

    def string(name: str) -> str | None:
        value = custom.get(name)
        return value.get("StringValue") if value is not None else None

    reason = string("stepagent_error")
    group = attributes.get("MessageGroupId")
    body = str(message["Body"])
    return DeadLetter(
        queue=queue,
        message_id=str(message["MessageId"]),
        thread_id=_thread_of(queue, body, group),
        reason=reason,
        receive_count=int(attributes.get("ApproximateReceiveCount", 0)),
        body=body,
        group_id=group,
        dedup_id=attributes.get("MessageDeduplicationId"),
        receipt_handle=str(message["ReceiptHandle"]),
        format_version=string(FORMAT_ATTRIBUTE),
    )


async def _receive(sqs: SQSClient, dlq_url: str, queue: str, limit: int) -> list[DeadLetter]:
    letters: dict[str, DeadLetter] = {}
    while len(letters) < limit:
        found = await retry_transient(
            partial(
                sqs.receive_message,
                QueueUrl=dlq_url,
                MaxNumberOfMessages=min(10, limit - len(letters)),
                VisibilityTimeout=_LIST_HOLD_SECONDS,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
                WaitTimeSeconds=0,
            )
        )
        messages = found.get("Messages", [])
        fresh = [m for m in messages if m["MessageId"] not in letters]
        if not fresh:
            break
        for message in fresh:
            letters[message["MessageId"]] = _letter(queue, message)
    return list(letters.values())


async def _release(sqs: SQSClient, dlq_url: str, letters: Sequence[DeadLetter]) -> None:
    for letter in letters:
        await retry_transient(
            partial(
                sqs.change_message_visibility,
                QueueUrl=dlq_url,
                ReceiptHandle=letter.receipt_handle,
                VisibilityTimeout=0,
            )
        )


async def list_dead_letters(sqs: SQSClient, dlq_url: str, queue: str, limit: int = 100) -> list[DeadLetter]:
    """Up to ``limit`` messages of the DLQ, left in it."""
    letters = await _receive(sqs, dlq_url, queue, limit)
    await _release(sqs, dlq_url, letters)
    return letters


async def redrive(
    sqs: SQSClient,
    dlq_url: str,
    source_url: str,
    queue: str,
    *,
    message_ids: Sequence[str] = (),
    limit: int = 1000,
) -> list[DeadLetter]:
    """Send the chosen messages (all when ``message_ids`` is empty) back to ``source_url``; returns them.
    An id that is not in the DLQ is a :class:`ConfigurationError` naming it (nothing is moved)."""
    letters = await _receive(sqs, dlq_url, queue, limit)
    chosen = [letter for letter in letters if not message_ids or letter.message_id in message_ids]
    missing = set(message_ids) - {letter.message_id for letter in chosen}
    if missing:
        await _release(sqs, dlq_url, letters)
        raise ConfigurationError(f"not in the {queue} DLQ: {', '.join(sorted(missing))}")
    await _release(sqs, dlq_url, [letter for letter in letters if letter not in chosen])
    for letter in chosen:
        send: dict[str, Any] = {"QueueUrl": source_url, "MessageBody": letter.body}
        if letter.group_id is not None:
            send["MessageGroupId"] = letter.group_id
            base = letter.dedup_id or letter.message_id
            send["MessageDeduplicationId"] = (base + ":redrive")[-_MAX_DEDUP_ID:]
        if letter.format_version is not None:  # a newer release's message goes back labelled as such
            send["MessageAttributes"] = {
                FORMAT_ATTRIBUTE: {"DataType": "String", "StringValue": letter.format_version}
            }
        # Both calls are safe to repeat (the dedup id, a receipt handle), so a throttled or 5xx one is tried
        # again rather than stopping a redrive half-way.
        await retry_transient(partial(sqs.send_message, **send))
        await retry_transient(
            partial(sqs.delete_message, QueueUrl=dlq_url, ReceiptHandle=letter.receipt_handle)
        )
    return chosen
