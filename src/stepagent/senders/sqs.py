"""SQS senders: :class:`SqsQueues` (``SendMessage``, or ``SendMessageBatch`` for several bodies to one
queue, with claim check and error mapping) and :class:`SqsSender`, the
:class:`~stepagent.senders.base.InputSender` over the FIFO input queue.

Guarantees of :meth:`SqsQueues.send_batch`: the same queue messages as one :meth:`SqsQueues.send` per body
(bodies, claim checks, group and dedup ids), in order, in as few requests as SQS allows (at most
:data:`BATCH_ENTRIES` entries and :data:`BATCH_BODY_BYTES` of bodies each); any entry SQS refuses is a
:class:`~stepagent.errors.QueueError`, raised after the batch, as a failed ``send`` would be.

Guarantees of :class:`SqsSender`:

- ``MessageGroupId`` = ``message.group_id`` (one FIFO group per thread).
- ``MessageDeduplicationId`` = :func:`dedup_key` ``(group_id, dedup_id)``: a SHA-256 hex digest, so it is
  deterministic (never a timestamp), scoped to the target thread (the same logical id sent to two threads
  never collides), and always within SQS's 128-character limit and alphabet.
- The body carries the logical id: ``"id": dedup_id`` unless the message already has one, so the receiving
  worker dedups by it even after SQS's 5-minute dedup window.
- Bodies over ~200 KB go to the blob bucket (see :mod:`stepagent.senders.claim_check`); their large texts
  are content-addressed objects shared with the rows and output events that repeat them, when the
  queues, the stores and the publisher share one :class:`~stepagent.blobs.ContentBlobs`.
- Every AWS failure is a :class:`~stepagent.errors.QueueError` naming the queue (transient: the record
  that caused the send is retried).
- Every message it sends (not a copy: ``claim_check=False``) carries this release's format version in
  the ``stepagent_format`` message attribute (:data:`FORMAT_ATTRIBUTE`; the body stays as it is, so its
  wire format is unchanged for other consumers); readers refuse a newer one.
- The message carries the sending task's trace context as the ``traceparent`` message attribute (none
  when there is no trace), so the step it wakes joins the same trace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from stepagent.blobs import ContentBlobs
from stepagent.errors import QueueError
from stepagent.formats import FORMAT_VERSION, check_version
from stepagent.messages import InputMessage
from stepagent.senders.claim_check import INLINE_BODY_LIMIT, unwrap_body, wrap_body
from stepagent.tracing import TRACEPARENT, trace_attributes

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_sqs import SQSClient
    from types_aiobotocore_sqs.type_defs import SendMessageBatchRequestEntryTypeDef

#: SQS's limits for one ``SendMessageBatch``: ten entries, 256 KiB of payload (bodies kept below it, so
#: ids and request framing fit too).
BATCH_ENTRIES = 10
BATCH_BODY_BYTES = 240_000


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One body for :meth:`SqsQueues.send_batch`, with its FIFO group and dedup ids."""

    body: str
    group_id: str | None = None
    dedup_id: str | None = None


#: The message attribute naming the format version of a message's body (absent: version 1).
FORMAT_ATTRIBUTE = "stepagent_format"
FORMAT_ATTRIBUTES = {FORMAT_ATTRIBUTE: str(FORMAT_VERSION)}


def _wire_attributes(attributes: Mapping[str, str]) -> dict[str, Any]:
    return {name: {"DataType": "String", "StringValue": value} for name, value in attributes.items()}


def record_attribute(record: Mapping[str, Any], name: str) -> str | None:
    """A string message attribute of a Lambda SQS record, if it has one."""
    attributes = record.get("messageAttributes") or {}
    value = attributes.get(name) if isinstance(attributes, Mapping) else None
    found = value.get("stringValue") if isinstance(value, Mapping) else None
    return found if isinstance(found, str) else None


def record_format(record: Mapping[str, Any], what: str) -> int:
    """The checked format version of a Lambda SQS record (its ``stepagent_format`` attribute; absent: 1):
    :class:`~stepagent.errors.NewerFormatError`, naming the version, for one this release cannot read."""
    return check_version(record_attribute(record, FORMAT_ATTRIBUTE), what)


def record_traceparent(record: Mapping[str, Any]) -> str | None:
    """The ``traceparent`` message attribute of a Lambda SQS record, if it has one."""
    attributes = record.get("messageAttributes") or {}
    value = attributes.get(TRACEPARENT) if isinstance(attributes, Mapping) else None
    found = value.get("stringValue") if isinstance(value, Mapping) else None
    return found if isinstance(found, str) else None


def dedup_key(group_id: str, dedup_id: str) -> str:
    """The ``MessageDeduplicationId`` for logical id ``dedup_id`` sent to thread ``group_id``."""
    return hashlib.sha256(f"{group_id}\x1f{dedup_id}".encode()).hexdigest()


class SqsQueues:
    """Sends bodies to any of our queues; big bodies are claim-checked, failures are ``QueueError``.
    ``blobs`` (shared with the stores) stores the big texts, else one is made of ``s3_client`` and
    ``bucket``; with neither, a big body is refused."""

    def __init__(
        self,
        sqs: SQSClient,
        *,
        s3_client: S3Client | None = None,
        bucket: str | None = None,
        inline_limit: int = INLINE_BODY_LIMIT,
        blobs: ContentBlobs | None = None,
    ) -> None:
        self.sqs = sqs
        if blobs is None and s3_client is not None and bucket:
            blobs = ContentBlobs(s3_client, bucket)
        self.blobs = blobs
        self.s3 = blobs.s3 if blobs is not None else s3_client
        self.bucket = blobs.bucket if blobs is not None else bucket
        self.inline_limit = inline_limit

    async def send(
        self,
        queue_url: str,
        body: str,
        *,
        group_id: str | None = None,
        dedup_id: str | None = None,
        delay_seconds: int | None = None,
        attributes: Mapping[str, str] | None = None,
        claim_check: bool = True,
    ) -> str:
        """Send ``body`` (claim-checked if big, unless ``claim_check`` is false: a body copied from a
        queue already fits one); returns the SQS message id."""
        wire = await wrap_body(body, self.blobs, limit=self.inline_limit) if claim_check else body
        if claim_check:
            attributes = {**(attributes or {}), **FORMAT_ATTRIBUTES}
        kwargs: dict[str, Any] = {"QueueUrl": queue_url, "MessageBody": wire}
        if group_id is not None:
            kwargs["MessageGroupId"] = group_id
        if dedup_id is not None:
            kwargs["MessageDeduplicationId"] = dedup_id
        if delay_seconds:
            kwargs["DelaySeconds"] = delay_seconds
        if attributes:
            kwargs["MessageAttributes"] = _wire_attributes(attributes)
        try:
            response = await self.sqs.send_message(**kwargs)
        except (ClientError, BotoCoreError, OSError) as exc:
            raise QueueError(f"SendMessage to {queue_url} failed: {exc}") from exc
        return str(response.get("MessageId", ""))

    async def send_batch(self, queue_url: str, messages: Sequence[Outgoing]) -> None:
        """Send ``messages`` in order, batched (see the module's guarantees)."""
        wires = [await wrap_body(m.body, self.blobs, limit=self.inline_limit) for m in messages]
        batch: list[SendMessageBatchRequestEntryTypeDef] = []
        size = 0
        for message, wire in zip(messages, wires, strict=True):
            length = len(wire.encode())
            if batch and (len(batch) == BATCH_ENTRIES or size + length > BATCH_BODY_BYTES):
                await self._send_entries(queue_url, batch)
                batch, size = [], 0
            entry: SendMessageBatchRequestEntryTypeDef = {
                "Id": str(len(batch)),
                "MessageBody": wire,
                "MessageAttributes": _wire_attributes(FORMAT_ATTRIBUTES),
            }
            if message.group_id is not None:
                entry["MessageGroupId"] = message.group_id
            if message.dedup_id is not None:
                entry["MessageDeduplicationId"] = message.dedup_id
            batch.append(entry)
            size += length
        if batch:
            await self._send_entries(queue_url, batch)

    async def _send_entries(self, queue_url: str, entries: list[SendMessageBatchRequestEntryTypeDef]) -> None:
        if len(entries) == 1:  # SendMessage: the same message, and the request a single body has always made
            entry = entries[0]
            await self.send(
                queue_url,
                entry["MessageBody"],
                group_id=entry.get("MessageGroupId"),
                dedup_id=entry.get("MessageDeduplicationId"),
                attributes=FORMAT_ATTRIBUTES,
                claim_check=False,
            )
            return
        try:
            response = await self.sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        except (ClientError, BotoCoreError, OSError) as exc:
            raise QueueError(f"SendMessageBatch to {queue_url} failed: {exc}") from exc
        failed = response.get("Failed") or []
        if failed:
            reasons = ", ".join(
                f"{f.get('Id')}: {f.get('Code')} {f.get('Message', '')}".strip() for f in failed
            )
            raise QueueError(
                f"SendMessageBatch to {queue_url} refused {len(failed)} of {len(entries)}: {reasons}"
            )

    async def resolve(self, body: str) -> str:
        """The original body of a (possibly claim-checked) received body."""
        return await unwrap_body(body, self.blobs)


class SqsSender:
    """``InputSender`` over the FIFO input queue. Give ``s3_client`` and ``bucket`` (the blob bucket) so
    big messages can be claim-checked, or share an existing :class:`SqsQueues` with ``queues``."""

    def __init__(
        self,
        sqs: SQSClient,
        queue_url: str,
        *,
        s3_client: S3Client | None = None,
        bucket: str | None = None,
        queues: SqsQueues | None = None,
    ) -> None:
        self.queues = queues if queues is not None else SqsQueues(sqs, s3_client=s3_client, bucket=bucket)
        self.queue_url = queue_url

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        logical = message if message.id is not None else message.model_copy(update={"id": dedup_id})
        await self.queues.send(
            self.queue_url,
            logical.to_json(),
            group_id=message.group_id,
            dedup_id=dedup_key(message.group_id, dedup_id),
            attributes=trace_attributes(),
        )
