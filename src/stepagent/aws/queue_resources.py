"""The queue and bucket definitions of ``template.yaml``, for the local stack and ``stepagent infra create``.

Guarantees:

- :func:`queue_definitions` gives ``CreateQueue`` attributes equal to the template's: the input FIFO queue
  (one group per thread, visibility 1800 s, FIFO DLQ after 5 receives), the output FIFO queue, the standard
  delay queue and tool queue, each with its DLQ. One deliberate difference is flagged in the template
  review: the input queue enables content-based deduplication, because EventBridge Scheduler can deliver
  to a FIFO queue only then (its ``SqsParameters`` carry no deduplication id). Our own sends always pass
  an explicit deduplication id, which takes precedence.
- :func:`ensure_queues_and_bucket` is idempotent: it creates what is missing, converges the mutable
  attributes of queues that exist, and returns every URL, ARN and name (:class:`QueueResources`), whose
  :meth:`QueueResources.env` gives the ``STEPAGENT_*`` settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import BotoCoreError, ClientError

from stepagent.errors import ConfigurationError, QueueError

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_sqs import SQSClient
    from types_aiobotocore_sqs.literals import QueueAttributeNameType

    QueueAttributes = Mapping[QueueAttributeNameType, str]

RETENTION_14_DAYS = "1209600"
INPUT_MAX_RECEIVE_COUNT = 5
DELAY_MAX_RECEIVE_COUNT = 5
TOOL_MAX_RECEIVE_COUNT = 3
#: Any role ARN works on moto/LocalStack (they do not assume it); the local stack can use this one.
LOCAL_SCHEDULER_ROLE_ARN = "arn:aws:iam::123456789012:role/stepagent-scheduler"
PAYLOAD_EXPIRY_DAYS = 30
_FIFO_ONLY = frozenset({"FifoQueue"})  # cannot be changed after creation


@dataclass(frozen=True, slots=True)
class QueueDefinition:
    """One queue: its logical role, ``CreateQueue`` name and attributes, and its dead-letter queue role."""

    role: str
    name: str
    attributes: dict[str, str]
    dead_letter_role: str | None = None
    max_receive_count: int | None = None


def queue_definitions(prefix: str = "stepagent") -> list[QueueDefinition]:
    """Every queue, dead-letter queues first (their ARNs go into the others' redrive policies)."""
    fifo_group = {
        "FifoQueue": "true",
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
        "SqsManagedSseEnabled": "true",
    }
    retained = {"MessageRetentionPeriod": RETENTION_14_DAYS, "SqsManagedSseEnabled": "true"}
    return [
        QueueDefinition("input_dlq", f"{prefix}-input-dlq.fifo", {"FifoQueue": "true", **retained}),
        QueueDefinition("delay_dlq", f"{prefix}-delay-dlq", dict(retained)),
        QueueDefinition("tool_dlq", f"{prefix}-tools-dlq", dict(retained)),
        QueueDefinition(
            "input",
            f"{prefix}-input.fifo",
            {
                **fifo_group,
                "ContentBasedDeduplication": "true",
                "VisibilityTimeout": "1800",  # >= 6 x the worker's 300 s timeout
                "MessageRetentionPeriod": RETENTION_14_DAYS,
            },
            "input_dlq",
            INPUT_MAX_RECEIVE_COUNT,
        ),
        QueueDefinition(
            "output", f"{prefix}-output.fifo", {**fifo_group, "ContentBasedDeduplication": "false"}
        ),
        QueueDefinition(
            "delay",
            f"{prefix}-delay",
            {"VisibilityTimeout": "180", "SqsManagedSseEnabled": "true"},
            "delay_dlq",
            DELAY_MAX_RECEIVE_COUNT,
        ),
        QueueDefinition(
            "tool",
            f"{prefix}-tools",
            {"VisibilityTimeout": "5400", "SqsManagedSseEnabled": "true"},
            "tool_dlq",
            TOOL_MAX_RECEIVE_COUNT,
        ),
    ]


@dataclass(frozen=True, slots=True)
class QueueResources:
    """What :func:`ensure_queues_and_bucket` created or found."""

    urls: dict[str, str]  # role -> queue URL
    arns: dict[str, str]  # role -> queue ARN
    bucket: str

    @property
    def input_queue_url(self) -> str:
        return self.urls["input"]

    @property
    def input_dlq_url(self) -> str:
        return self.urls["input_dlq"]

    @property
    def output_queue_url(self) -> str:
        return self.urls["output"]

    @property
    def delay_queue_url(self) -> str:
        return self.urls["delay"]

    @property
    def tool_queue_url(self) -> str:
        return self.urls["tool"]

    @property
    def scheduler_dlq_arn(self) -> str:
        """Failed long-timer deliveries land here, as in the template."""
        return self.arns["delay_dlq"]

    def env(self) -> dict[str, str]:
        """The ``STEPAGENT_*`` settings for these resources (tables are :mod:`stepagent.aws.resources`').
        The scheduler role is :data:`LOCAL_SCHEDULER_ROLE_ARN`: moto and LocalStack accept any role; on
        AWS the SAM template creates the real one."""
        return {
            "STEPAGENT_INPUT_QUEUE_URL": self.input_queue_url,
            "STEPAGENT_OUTPUT_QUEUE_URL": self.output_queue_url,
            "STEPAGENT_DELAY_QUEUE_URL": self.delay_queue_url,
            "STEPAGENT_TOOL_QUEUE_URL": self.tool_queue_url,
            "STEPAGENT_BLOB_BUCKET": self.bucket,
            "STEPAGENT_SCHEDULER_DLQ_ARN": self.scheduler_dlq_arn,
            "STEPAGENT_SCHEDULER_ROLE_ARN": LOCAL_SCHEDULER_ROLE_ARN,
        }


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


async def _ensure_queue(sqs: SQSClient, name: str, attributes: dict[str, str]) -> str:
    try:
        # The names are the definitions' and the caller's overrides; SQS checks them.
        response = await sqs.create_queue(QueueName=name, Attributes=cast("QueueAttributes", attributes))
        return str(response["QueueUrl"])
    except ClientError as exc:
        if _code(exc) not in (
            "QueueAlreadyExists",
            "QueueNameExists",
            "AWS.SimpleQueueService.QueueNameExists",
        ):
            raise
    # It exists with other attributes: converge the ones that can change.
    url = str((await sqs.get_queue_url(QueueName=name))["QueueUrl"])
    mutable = {k: v for k, v in attributes.items() if k not in _FIFO_ONLY}
    if mutable:
        await sqs.set_queue_attributes(QueueUrl=url, Attributes=cast("QueueAttributes", mutable))
    return url


async def _ensure_bucket(s3: S3Client, bucket: str, region: str | None) -> None:
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region and region != "us-east-1":  # us-east-1 rejects an explicit LocationConstraint
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        await s3.create_bucket(**kwargs)
    except ClientError as exc:
        if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    await s3.put_public_access_block(
        Bucket=bucket,
        PublicAccessBlockConfiguration={
            "BlockPublicAcls": True,
            "IgnorePublicAcls": True,
            "BlockPublicPolicy": True,
            "RestrictPublicBuckets": True,
        },
    )
    # Only the queue-only payloads/ expire: blobs/ and rows/ are named by history rows (stepagent.blobs).
    await s3.put_bucket_lifecycle_configuration(
        Bucket=bucket,
        LifecycleConfiguration={
            "Rules": [
                {
                    "ID": "expire-queue-payloads",
                    "Filter": {"Prefix": "payloads/"},
                    "Status": "Enabled",
                    "Expiration": {"Days": PAYLOAD_EXPIRY_DAYS},
                }
            ]
        },
    )


async def ensure_queues_and_bucket(
    sqs: SQSClient,
    s3: S3Client,
    *,
    prefix: str = "stepagent",
    bucket: str | None = None,
    region: str | None = None,
    attribute_overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> QueueResources:
    """Create (or converge) every queue and the blob bucket with async clients. Idempotent.

    ``attribute_overrides`` maps a queue role (``"input"``, ``"tool"``, ...) to attributes that replace the
    defaults, e.g. ``{"input": {"VisibilityTimeout": "0"}}`` for a test that drives redelivery by hand.
    """
    overrides = attribute_overrides or {}
    unknown = set(overrides) - {d.role for d in queue_definitions(prefix)}
    if unknown:
        raise ConfigurationError(f"attribute_overrides names unknown queue roles {sorted(unknown)}")
    urls: dict[str, str] = {}
    arns: dict[str, str] = {}
    bucket_name = bucket or f"{prefix}-blobs"
    try:
        for definition in queue_definitions(prefix):
            attributes = {**definition.attributes, **overrides.get(definition.role, {})}
            if definition.dead_letter_role is not None:
                attributes.setdefault(
                    "RedrivePolicy",
                    json.dumps(
                        {
                            "deadLetterTargetArn": arns[definition.dead_letter_role],
                            "maxReceiveCount": definition.max_receive_count,
                        }
                    ),
                )
            url = await _ensure_queue(sqs, definition.name, attributes)
            found = await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
            urls[definition.role] = url
            arns[definition.role] = str(found["Attributes"]["QueueArn"])
        await _ensure_bucket(s3, bucket_name, region)
    except (ClientError, BotoCoreError) as exc:
        raise QueueError(
            f"creating the stepagent queues and bucket (prefix {prefix!r}) failed: {exc}"
        ) from exc
    return QueueResources(urls=urls, arns=arns, bucket=bucket_name)
