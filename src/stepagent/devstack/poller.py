"""A local stand-in for Lambda's SQS event source mapping.

It behaves like the real one where it matters for correctness: batches of up to ``batch_size`` records
in the Lambda event shape, the handler's ``batchItemFailures`` respected (only successes are deleted),
failed records left to reappear after the visibility timeout (shortened locally so a retry is seconds
away, not half an hour), and FIFO ordering left to the queue itself (one message group in flight).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from stepagent.aws.lambda_events import BatchResponse, SqsEvent, SqsRecord, SqsRecordAttributes

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_sqs import SQSClient
    from types_aiobotocore_sqs.type_defs import MessageTypeDef

log = logging.getLogger(__name__)

BatchHandler = Callable[[SqsEvent], Awaitable[BatchResponse]]


def lambda_record(message: MessageTypeDef, queue_arn: str) -> SqsRecord:
    """An SQS message as Lambda's event source hands it to the function."""
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": cast(SqsRecordAttributes, dict(message.get("Attributes", {}))),
        "messageAttributes": {
            name: {
                "stringValue": value.get("StringValue"),
                "dataType": value.get("DataType", "String"),
            }
            for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": queue_arn.split(":")[3] if queue_arn.count(":") >= 3 else "us-east-1",
    }


@dataclass(slots=True)
class SqsEventSource:
    """Polls one queue and feeds its batches to ``handler`` until stopped."""

    sqs: SQSClient
    queue_url: str
    handler: BatchHandler
    batch_size: int = 10
    retry_after_seconds: int = 1
    wait_seconds: int = 1
    in_flight: int = 0
    batches: int = 0
    _queue_arn: str | None = field(default=None, repr=False)

    async def _arn(self) -> str:
        if self._queue_arn is None:
            attributes = await self.sqs.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=["QueueArn"]
            )
            self._queue_arn = str(attributes["Attributes"]["QueueArn"])
        return self._queue_arn

    async def poll_once(self) -> int:
        """Receive one batch and hand it to the handler. Returns how many records it carried."""
        response = await self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            WaitTimeSeconds=self.wait_seconds,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if not messages:
            return 0
        arn = await self._arn()
        self.in_flight = len(messages)
        try:
            event: SqsEvent = {"Records": [lambda_record(m, arn) for m in messages]}
            try:
                result = await self.handler(event)
                failed = {item["itemIdentifier"] for item in result.get("batchItemFailures", [])}
            except Exception:  # like Lambda: an invocation error fails the whole batch
                log.exception("handler failed for a batch from %s", self.queue_url)
                failed = {m["MessageId"] for m in messages}
            done = [m for m in messages if m["MessageId"] not in failed]
            if done:
                await self.sqs.delete_message_batch(
                    QueueUrl=self.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
                )
            retry = [m for m in messages if m["MessageId"] in failed]
            if retry:
                await self.sqs.change_message_visibility_batch(
                    QueueUrl=self.queue_url,
                    Entries=[
                        {
                            "Id": str(i),
                            "ReceiptHandle": m["ReceiptHandle"],
                            "VisibilityTimeout": self.retry_after_seconds,
                        }
                        for i, m in enumerate(retry)
                    ],
                )
        finally:
            self.in_flight = 0
            self.batches += 1
        return len(messages)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the local stack keeps polling through transient errors, as Lambda does
                log.exception("polling %s failed; retrying", self.queue_url)
                await asyncio.sleep(self.retry_after_seconds)
