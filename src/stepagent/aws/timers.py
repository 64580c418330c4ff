"""Durable timers on AWS: the SQS delay queue up to 15 minutes, a one-time EventBridge Scheduler schedule
beyond; the timer relay; and :func:`deliver_due_schedules` for stacks where schedules never fire (moto).

Guarantees:

- :class:`AwsTimers` (a :class:`~stepagent.tools.base.TimerBackend`) never loses a wake-up silently: every
  AWS failure is a :class:`~stepagent.errors.QueueError`, so the dispatch fails, its outbox intent stays
  open and the next step re-dispatches it.
- Delays of at most :data:`MAX_DELAY_SECONDS` go to the standard delay queue with per-message
  ``DelaySeconds`` (rounded up: a timer never fires early) and the body
  ``{"message": <InputMessage object>, "group_id": ..., "dedup_id": ...}``.
- Longer delays create the schedule ``stepagent-<sha256(group, dedup id)[:48]>``: deterministic and unique
  per (thread, logical id), so a re-dispatch finds the existing schedule (``ConflictException`` is
  success). It fires once (``at(...)`` in UTC, rounded up to the second), deletes itself afterwards, sends
  failed deliveries to ``STEPAGENT_SCHEDULER_DLQ_ARN`` and targets the FIFO input queue with the thread as
  ``MessageGroupId``. Scheduler cannot pass a deduplication id, so the input queue uses content-based
  deduplication; the body is deterministic (it carries the logical id), which makes that dedup exact.
- The trace context travels with every wake-up: the delay-queue message's ``traceparent`` attribute (the
  relay forwards it), or a ``traceparent`` field of the schedule's body (Scheduler sets no attributes).
- :func:`handle_delay_batch` forwards each delay-queue message to the input queue with
  ``MessageDeduplicationId`` derived from (thread, dedup id), so a twice-delivered wake-up is absorbed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from botocore.exceptions import BotoCoreError, ClientError

from stepagent.aws.lambda_events import BatchItemFailure, BatchResponse, SqsEvent, SqsRecord
from stepagent.errors import MalformedMessageError, PayloadTooLargeError, QueueError
from stepagent.formats import FORMAT_FIELD, check_version, stamp_body
from stepagent.messages import InputMessage, parse_input_message
from stepagent.senders.sqs import SqsQueues, SqsSender, record_format, record_traceparent
from stepagent.tools.sleep import Clock, utc_now
from stepagent.tracing import continuing, trace_attributes

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_scheduler import EventBridgeSchedulerClient
    from types_aiobotocore_scheduler.type_defs import (
        GetScheduleOutputTypeDef,
        RetryPolicyTypeDef,
        TargetTypeDef,
    )
    from types_aiobotocore_sqs import SQSClient

logger = logging.getLogger(__name__)

MAX_DELAY_SECONDS = 900
SCHEDULE_PREFIX = "stepagent-"
#: EventBridge Scheduler's limit on a target's ``Input``.
MAX_SCHEDULE_INPUT = 8192
# Scheduler retries a failed delivery for up to a day before it goes to the DLQ.
_RETRY_POLICY: RetryPolicyTypeDef = {"MaximumEventAgeInSeconds": 86400, "MaximumRetryAttempts": 185}
_AT = re.compile(r"^at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)$")

SchedulerFactory = Callable[[], Awaitable["EventBridgeSchedulerClient"]]


def schedule_name(group_id: str, dedup_id: str) -> str:
    """The one schedule name for wake-up ``dedup_id`` of thread ``group_id`` (<= 64 characters)."""
    return SCHEDULE_PREFIX + hashlib.sha256(f"{group_id}\x1f{dedup_id}".encode()).hexdigest()[:48]


def relay_body(message: InputMessage, dedup_id: str) -> str:
    """A delay-queue message body: the message (with its logical id), its thread and its dedup id, as
    compact JSON."""
    return json.dumps(
        {"message": message.model_dump(), "group_id": message.group_id, "dedup_id": dedup_id},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def schedule_body(message: InputMessage) -> str:
    """A schedule's target input: the message, plus the trace context as a top-level ``traceparent`` field
    (Scheduler cannot set SQS message attributes; the message model ignores unknown fields, and the worker
    reads this one when the record has no ``traceparent`` attribute)."""
    body = stamp_body(message.to_json())  # Scheduler sends it as it is: nothing else stamps it
    carried = trace_attributes()
    if not carried:
        return body
    return body[:-1] + "," + json.dumps(carried, separators=(",", ":"))[1:]


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class AwsTimers:
    """``TimerBackend`` over the delay queue and EventBridge Scheduler."""

    def __init__(
        self,
        queues: SqsQueues,
        *,
        delay_queue_url: str,
        input_queue_url: str,
        scheduler: SchedulerFactory,
        role_arn: str | None,
        dead_letter_arn: str | None,
        clock: Clock = utc_now,
    ) -> None:
        self.queues = queues
        self.delay_queue_url = delay_queue_url
        self.input_queue_url = input_queue_url
        self._scheduler = scheduler
        self.role_arn = role_arn
        self.dead_letter_arn = dead_letter_arn
        self.clock = clock
        self._input_arn: str | None = None

    async def schedule(self, message: InputMessage, dedup_id: str, delay_seconds: float) -> None:
        # The logical id travels in the body: Scheduler deliveries have no deduplication id of ours.
        logical = message if message.id is not None else message.model_copy(update={"id": dedup_id})
        if delay_seconds <= MAX_DELAY_SECONDS:
            await self.queues.send(
                self.delay_queue_url,
                relay_body(logical, dedup_id),
                delay_seconds=max(0, math.ceil(delay_seconds)),
                attributes=trace_attributes(),
            )
            return
        await self._create_schedule(logical, dedup_id, delay_seconds)

    async def _create_schedule(self, message: InputMessage, dedup_id: str, delay_seconds: float) -> None:
        if not self.role_arn or not self.dead_letter_arn:
            raise QueueError(
                "timers over 15 minutes need STEPAGENT_SCHEDULER_ROLE_ARN and STEPAGENT_SCHEDULER_DLQ_ARN"
            )
        body = schedule_body(message)
        if len(body) > MAX_SCHEDULE_INPUT:
            raise PayloadTooLargeError(
                f"a timer message of {len(body)} characters exceeds {MAX_SCHEDULE_INPUT}"
            )
        due = self.clock() + timedelta(seconds=delay_seconds)
        due = due.replace(microsecond=0) + (timedelta(seconds=1) if due.microsecond else timedelta())
        name = schedule_name(message.group_id, dedup_id)
        try:
            target: TargetTypeDef = {
                "Arn": await self._input_queue_arn(),
                "RoleArn": self.role_arn,
                "Input": body,
                "SqsParameters": {"MessageGroupId": message.group_id},
                "DeadLetterConfig": {"Arn": self.dead_letter_arn},
                "RetryPolicy": _RETRY_POLICY.copy(),
            }
            scheduler = await self._scheduler()
            await scheduler.create_schedule(
                Name=name,
                ScheduleExpression=f"at({due.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S')})",
                ScheduleExpressionTimezone="UTC",
                FlexibleTimeWindow={"Mode": "OFF"},
                ActionAfterCompletion="DELETE",
                Description=f"stepagent wake-up for thread {message.group_id}"[:512],
                Target=target,
            )
        except ClientError as exc:
            if _code(exc) == "ConflictException":
                return  # a re-dispatch: the schedule made the first time stands
            raise QueueError(f"CreateSchedule {name} failed: {exc}") from exc
        except (BotoCoreError, OSError) as exc:
            raise QueueError(f"CreateSchedule {name} failed: {exc}") from exc
        logger.info("long timer scheduled", extra={"schedule": name, "due": due.isoformat()})

    async def _input_queue_arn(self) -> str:
        if self._input_arn is None:
            found = await self.queues.sqs.get_queue_attributes(
                QueueUrl=self.input_queue_url, AttributeNames=["QueueArn"]
            )
            self._input_arn = str(found["Attributes"]["QueueArn"])
        return self._input_arn


# ----------------------------------------------------------------------------------------------------------
# The timer relay


async def relay_record(record: SqsRecord, queues: SqsQueues, sender: SqsSender) -> None:
    """Forward one delay-queue record to the input queue."""
    record_format(record, "this timer message")
    body = await queues.resolve(str(record.get("body", "")))
    try:
        envelope = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedMessageError(f"timer envelope is not JSON: {exc}") from None
    if not isinstance(envelope, dict):
        raise MalformedMessageError("timer envelope must be a JSON object")
    check_version(envelope.get(FORMAT_FIELD), "this timer envelope")
    group_id, dedup_id, raw = envelope.get("group_id"), envelope.get("dedup_id"), envelope.get("message")
    if not isinstance(group_id, str) or not isinstance(dedup_id, str) or not dedup_id:
        raise MalformedMessageError("timer envelope needs string 'group_id' and 'dedup_id'")
    if not isinstance(raw, str | dict):
        raise MalformedMessageError("timer envelope needs a 'message' (an object, or a JSON string)")
    message = parse_input_message(raw)  # the reference relay nested it as a JSON string: both parse
    if message.group_id != group_id:
        raise MalformedMessageError(
            f"timer envelope group_id {group_id!r} != message group_id {message.group_id!r}"
        )
    # The wake-up continues the trace of the step that set the timer.
    with continuing(record_traceparent(record)):
        await sender.send(message, dedup_id)


async def handle_delay_batch(event: SqsEvent, queues: SqsQueues, sender: SqsSender) -> BatchResponse:
    """The timer relay: forward every record; report the ones that failed (they retry, then go to the
    delay queue's DLQ). Never raises for a partial failure."""
    failures: list[BatchItemFailure] = []
    for record in event.get("Records", []):
        message_id = str(record.get("messageId", ""))
        try:
            await relay_record(record, queues, sender)
        except Exception:  # one bad record must not block the others; it is reported, never dropped
            logger.exception("timer relay failed", extra={"message_id": message_id})
            failures.append({"itemIdentifier": message_id})
    return {"batchItemFailures": failures}


# ----------------------------------------------------------------------------------------------------------
# Firing schedules where nothing else does (moto)


def schedule_due(schedule: GetScheduleOutputTypeDef) -> datetime | None:
    """When a one-time ``at(...)`` schedule fires (aware), or ``None`` for other expressions."""
    match = _AT.match(str(schedule.get("ScheduleExpression", "")))
    if match is None:
        return None
    zone = ZoneInfo(str(schedule.get("ScheduleExpressionTimezone") or "UTC"))
    return datetime.fromisoformat(match.group(1)).replace(tzinfo=zone)


async def _queue_url(sqs: SQSClient, arn: str) -> str:
    parts = arn.split(":")
    if len(parts) != 6 or parts[2] != "sqs":
        raise MalformedMessageError(f"schedule target {arn!r} is not an SQS queue ARN")
    response = await sqs.get_queue_url(QueueName=parts[5], QueueOwnerAWSAccountId=parts[4])
    return str(response["QueueUrl"])


async def deliver_due_schedules(
    scheduler: EventBridgeSchedulerClient, sqs: SQSClient, now: datetime | None = None
) -> int:
    """Send the targets of every due ``stepagent-*`` schedule, then delete the schedule, as EventBridge
    Scheduler would with ``ActionAfterCompletion=DELETE``. Returns how many were delivered."""
    now = now or datetime.now(UTC)
    delivered = 0
    names: list[tuple[str, str]] = []
    async for page in scheduler.get_paginator("list_schedules").paginate(NamePrefix=SCHEDULE_PREFIX):
        names.extend((s["Name"], s.get("GroupName", "default")) for s in page.get("Schedules", []))
    for name, group in names:
        try:
            if await _deliver_if_due(scheduler, sqs, name, group, now):
                delivered += 1
        except (ClientError, BotoCoreError, MalformedMessageError):
            # Like Scheduler's own retries: this schedule stays and is tried again on the next call;
            # one broken target never blocks the others.
            logger.exception("could not deliver a due schedule", extra={"schedule": name})
    return delivered


async def _deliver_if_due(
    scheduler: EventBridgeSchedulerClient, sqs: SQSClient, name: str, group: str, now: datetime
) -> bool:
    schedule = await scheduler.get_schedule(Name=name, GroupName=group)
    due = schedule_due(schedule)
    if due is None or due > now:
        return False
    target = schedule["Target"]
    body = str(target.get("Input", ""))
    send: dict[str, Any] = {"QueueUrl": await _queue_url(sqs, str(target["Arn"])), "MessageBody": body}
    group_id = target.get("SqsParameters", {}).get("MessageGroupId")
    if group_id:
        # What content-based deduplication would compute, passed explicitly for stacks without it.
        send |= {
            "MessageGroupId": group_id,
            "MessageDeduplicationId": hashlib.sha256(body.encode()).hexdigest(),
        }
    await sqs.send_message(**send)
    try:
        await scheduler.delete_schedule(Name=name, GroupName=group)
    except ClientError as exc:
        if _code(exc) != "ResourceNotFoundException":
            raise
    return True
