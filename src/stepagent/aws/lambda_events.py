"""The shapes Lambda hands an SQS-triggered handler and expects back, as TypedDicts, so the type checker
follows a record from the event to the partial-batch response.

Guarantees: :class:`SqsEvent` and :class:`SqsRecord` name the fields of Lambda's SQS event that the worker,
the tool runner and the timer relay read (camelCase, as Lambda sends them; every key optional, since the
handlers treat a missing one as bad input rather than trusting it); :class:`BatchResponse` is the partial
batch response (``ReportBatchItemFailures``): the ``messageId`` of each record to retry. These are
declarations, not validation: the handlers still check every value they use.
"""

from __future__ import annotations

from typing import TypedDict


class SqsMessageAttribute(TypedDict, total=False):
    """One message attribute of a record (string attributes are all the runtime sets; another's
    ``stringValue`` is null)."""

    stringValue: str | None
    dataType: str


class SqsRecordAttributes(TypedDict, total=False):
    """The SQS system attributes of a record the runtime reads."""

    ApproximateReceiveCount: str
    MessageGroupId: str
    MessageDeduplicationId: str
    SentTimestamp: str


class SqsRecord(TypedDict, total=False):
    """One record of Lambda's SQS event."""

    messageId: str
    receiptHandle: str
    body: str
    attributes: SqsRecordAttributes
    messageAttributes: dict[str, SqsMessageAttribute]
    md5OfBody: str
    eventSource: str
    eventSourceARN: str
    awsRegion: str


class SqsEvent(TypedDict, total=False):
    """Lambda's event for a batch of SQS messages."""

    Records: list[SqsRecord]


class BatchItemFailure(TypedDict):
    """A record SQS must deliver again (its ``messageId``)."""

    itemIdentifier: str


class BatchResponse(TypedDict):
    """The partial-batch response: the records to retry; every other record of the batch is deleted."""

    batchItemFailures: list[BatchItemFailure]
