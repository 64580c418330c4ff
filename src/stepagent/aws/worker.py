"""The worker: one SQS FIFO batch (Lambda event) → one step per thread → output events.

Guarantees (bad input is isolated, never retried; a transient failure is retried by the queue, in order):

- Routing is by each record's ``MessageGroupId`` (a record without one, e.g. a direct invocation, is
  routed by its body). The logical message id is the body's ``id``, else the record's
  ``MessageDeduplicationId``, else its ``messageId``. Claim-checked bodies are resolved first.
- Deterministic bad input (unparseable body, schema violation, body ``group_id`` disagreeing with the
  group, an unresolvable claim check, a payload the step rejects as too large) is never retried: the raw
  body is copied unchanged to the input DLQ with the reason in the ``stepagent_error`` message attribute,
  an ``error`` event (``retrying: false``) goes to the thread, and the record is acknowledged so the
  thread's later records proceed. If that disposal itself fails, the record fails like a transient one.
- A transient failure fails the record and every later record of the same thread in the batch (they are
  all in ``batchItemFailures``, so SQS redelivers them in order), with an ``error`` event
  (``retrying: true``, "attempt n of max"); other threads proceed. ``handle`` never raises for a partial
  failure.
- On a record's last allowed attempt (``ApproximateReceiveCount`` >= ``max_receive_count``, the input
  queue's maxReceiveCount) a transient failure is not passed on to SQS, whose redrive would also take the
  thread's valid later records (FIFO makes them fail with it, so their receive counts climb with it).
  The worker re-runs the thread's records one at a time, gives up on exactly the ones that still fail —
  DLQ copy with the reason in ``stepagent_error``, an ``error`` event with ``retrying: false`` and the
  attempts made — and lets the others proceed.
- A lost conditional write (:class:`~stepagent.errors.ConcurrentWriteError`: another worker advanced the
  thread) is retried at once from a fresh load; the dedup by logical id makes that re-run absorb whatever
  the other writer already did, so nothing is lost or doubled.
- Each step continues the trace its records arrived with (their ``traceparent`` message attribute, else a
  ``traceparent`` field of the body): see :func:`stepagent.modes.step_mode.trace_of`.
- Output events are sent after the step, before the records are acknowledged, with the root id and root
  metadata the step itself loaded (and committed, if it changed them): publishing reads nothing. If a previous attempt
  committed but did not publish (a crash, a failed send), the redelivery (``ApproximateReceiveCount`` > 1)
  re-publishes the rows that step made for the redelivered inputs, with the same event ids (consumers
  may see an event twice, never two ids for one event).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from stepagent.agent_config import profile_name
from stepagent.aws.lambda_events import BatchResponse, SqsEvent, SqsRecord, SqsRecordAttributes
from stepagent.aws.live import LiveText
from stepagent.aws.log_keys import append_keys
from stepagent.aws.metrics import ModelTiming, publish_usage
from stepagent.aws.outputs import OutputPublisher, replay_rows, replay_turn_complete
from stepagent.backoff import Backoff
from stepagent.core.step import StepInput, ThreadStep
from stepagent.errors import (
    ConcurrentWriteError,
    GroupMismatchError,
    MalformedMessageError,
    RetriesExhaustedError,
    StepagentError,
    TransientError,
    classify,
)
from stepagent.events import AgentEvent, CompletionFinished
from stepagent.messages import InputMessage, parse_input_message
from stepagent.modes.step_mode import AgentSystem
from stepagent.outputs.build import StepEvents, error_event, row_events, step_events
from stepagent.senders.sqs import (
    FORMAT_ATTRIBUTE,
    SqsQueues,
    record_attribute,
    record_format,
    record_traceparent,
)
from stepagent.stores.dynamodb.quotas import SubjectCounters
from stepagent.tracing import TRACEPARENT

logger = logging.getLogger(__name__)


def rejection(error: BaseException) -> StepagentError | None:
    """``error`` as the reason to reject its input (:func:`~stepagent.errors.classify` says "reject"), or
    ``None`` when the input must be retried."""
    if classify(error) != "reject":
        return None
    if isinstance(error, StepagentError):
        return error
    return MalformedMessageError(f"the input cannot be processed: {type(error).__name__}: {error}")


def body_traceparent(body: str) -> str | None:
    """A top-level ``traceparent`` field of a message body (what a Scheduler-delivered wake-up carries)."""
    try:
        found = json.loads(body).get(TRACEPARENT)
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


#: Runs per thread when another writer keeps winning the head-version race (three), a short jittered
#: wait apart so two workers that collided do not collide again at once.
RACE_BACKOFF = Backoff(attempts=3, base=0.05, cap=0.5)
_MAX_ATTRIBUTE_CHARS = 4_000
_UNROUTABLE_GROUP = "stepagent-unroutable"
#: Log field: the line's content also went to the thread as an ``error`` event (a chat at a terminal,
#: which prints that event, leaves the line out: ``devstack/terminal_logs.py``).
REPORTED_TO_THREAD = "reported_to_thread"


class MetricsSink(Protocol):
    """What the worker needs from a metrics backend (:class:`~stepagent.aws.metrics.EmfMetrics` adapts
    powertools ``Metrics``)."""

    def add_metric(self, name: str, unit: str, value: float) -> Any: ...

    def add_dimensioned_metric(
        self, name: str, unit: str, value: float, dimensions: Mapping[str, str]
    ) -> Any: ...


@dataclass(slots=True)
class CountingMetrics:
    """A ``MetricsSink`` that only counts (tests, the local stack); a dimensioned metric is counted under
    ``name`` and under ``name[key=value,...]``."""

    counts: dict[str, float]

    def __init__(self) -> None:
        self.counts = {}

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def add_dimensioned_metric(
        self, name: str, unit: str, value: float, dimensions: Mapping[str, str]
    ) -> None:
        self.add_metric(name, unit, value)
        labels = ",".join(f"{key}={dimensions[key]}" for key in sorted(dimensions))
        self.add_metric(f"{name}[{labels}]", unit, value)


@dataclass(slots=True)
class Record:
    """One SQS record, parsed: ``message`` (good input), ``rejected`` (bad input; also set on a good
    record the step later refuses) or ``failed`` (could not be read now)."""

    record_id: str
    group_id: str | None
    raw_body: str
    receive_count: int
    logical_id: str
    message: InputMessage | None = None
    #: The W3C trace context the message arrived with (its ``traceparent`` attribute or body field).
    traceparent: str | None = None
    rejected: StepagentError | None = None  # never retried: DLQ copy + error event
    failed: Exception | None = None  # transient (e.g. the claim check's S3 read)
    #: The record's ``stepagent_format`` attribute, kept on its DLQ copy so a redrive keeps the label.
    format_version: str | None = None


class Worker:
    """Handles SQS batches for one :class:`~stepagent.modes.step_mode.AgentSystem`."""

    def __init__(
        self,
        system: AgentSystem,
        queues: SqsQueues,
        publisher: OutputPublisher,
        input_dlq_url: Callable[[], Awaitable[str]],
        metrics: MetricsSink,
        *,
        live: LiveText | None = None,
        max_receive_count: int = 5,
        counters: SubjectCounters | None = None,
    ) -> None:
        self.system = system
        self.queues = queues
        self.publisher = publisher
        self.input_dlq_url = input_dlq_url
        self.metrics = metrics
        self.live = live if live is not None else LiveText.disabled()
        self.max_receive_count = max_receive_count
        #: Where each step's model cost is added to its conversation owner's daily spend (the HTTP API's
        #: STEPAGENT_API_MAX_COST_USD_PER_DAY reads it); None: not counted.
        self.counters = counters
        #: Wall-clock seconds: the day a step's cost counts for.
        self.clock: Callable[[], float] = time.time

    async def handle(self, event: SqsEvent) -> BatchResponse:
        records = list(await asyncio.gather(*(self._parse(raw) for raw in event.get("Records", []))))
        threads: dict[str, list[Record]] = {}
        for record in records:
            key = record.group_id if record.group_id is not None else f"\x00{record.record_id}"
            threads.setdefault(key, []).append(record)
        failed = await asyncio.gather(*(self._thread(key, items) for key, items in threads.items()))
        failed_ids = {record_id for ids in failed for record_id in ids}
        return {
            "batchItemFailures": [
                {"itemIdentifier": r.record_id} for r in records if r.record_id in failed_ids
            ]
        }

    # ---- parsing -----------------------------------------------------------------------------------------

    async def _parse(self, raw: SqsRecord) -> Record:
        attributes: SqsRecordAttributes = raw.get("attributes") or {}
        record_id = str(raw.get("messageId", ""))
        body = raw.get("body")
        group = attributes.get("MessageGroupId")
        record = Record(
            record_id=record_id,
            group_id=str(group) if group else None,
            raw_body=body if isinstance(body, str) else "",
            receive_count=int(attributes.get("ApproximateReceiveCount") or 1),
            logical_id=str(attributes.get("MessageDeduplicationId") or record_id),
            traceparent=record_traceparent(raw),
            format_version=record_attribute(raw, FORMAT_ATTRIBUTE),
        )
        try:
            record_format(raw, "this input message")  # a newer release's message is rejected, not guessed at
            if not isinstance(body, str):
                raise MalformedMessageError("the SQS record has no body")
            resolved = await self.queues.resolve(body)
        except Exception as error:
            # Bad input is rejected; anything else (S3 unreachable, ...) fails the record for a retry.
            record.rejected = rejection(error)
            if record.rejected is None:
                record.failed = error
            return record
        try:
            message = parse_input_message(resolved)
            if record.group_id is not None and message.group_id != record.group_id:
                raise GroupMismatchError(
                    f"body group_id {message.group_id!r} disagrees with MessageGroupId {record.group_id!r}"
                )
        except Exception as error:
            # Parsing is a pure function of the body: whatever it raises, retrying cannot help.
            record.rejected = rejection(error) or MalformedMessageError(
                f"the message body cannot be parsed: {type(error).__name__}: {error}"
            )
            return record
        record.message = message
        if record.traceparent is None and f'"{TRACEPARENT}"' in resolved:
            record.traceparent = body_traceparent(resolved)
        record.group_id = record.group_id or message.group_id
        record.logical_id = message.id or record.logical_id
        return record

    # ---- one thread ----------------------------------------------------------------------------------------

    async def _thread(self, thread_id: str, records: list[Record]) -> list[str]:
        """Process one thread's records in order; return the ids of those that must be retried."""
        # Each thread runs in its own task (gather), so these log keys stay with it.
        append_keys(thread_id=None if thread_id.startswith("\x00") else thread_id)
        for record in records:
            if record.failed is not None and self._last_attempt(record):
                record.rejected, record.failed = self._give_up(record, record.failed), None
        cut = next((i for i, r in enumerate(records) if r.failed is not None), len(records))
        active, doomed = records[:cut], records[cut:]
        for record in doomed[:1]:
            await self._report_failure(thread_id, record, record.failed)
        # Leading bad input first, so its error event precedes the step's output.
        start = 0
        while start < len(active) and active[start].rejected is not None:
            if not await self._reject(active[start]):
                return [r.record_id for r in records[start:]]
            start += 1
        rest = active[start:]
        good = [r for r in rest if r.message is not None]
        failed_at = len(rest)
        if good:
            first_failed = await self._step_records(thread_id, good)
            if first_failed is not None:
                failed_at = next(i for i, r in enumerate(rest) if r is good[first_failed])
        for index, record in enumerate(rest[:failed_at]):
            if record.rejected is not None and not await self._reject(record):
                failed_at = index
                break
        return [r.record_id for r in rest[failed_at:] + doomed]

    def _last_attempt(self, record: Record) -> bool:
        return record.receive_count >= self.max_receive_count

    def _give_up(self, record: Record, error: BaseException) -> RetriesExhaustedError:
        self.metrics.add_metric("GaveUp", "Count", 1)
        return RetriesExhaustedError(
            f"gave up on input message {record.logical_id} after {record.receive_count} "
            f"attempt{'' if record.receive_count == 1 else 's'}: "
            f"{type(error).__name__}: {error}",
            attempts=record.receive_count,
        )

    async def _step_records(self, thread_id: str, good: list[Record]) -> int | None:
        """Step ``good`` records; the index of the first that must be retried, or ``None``."""
        try:
            await self._step_and_publish(thread_id, good)
            return None
        except Exception as error:
            reason = rejection(error)
            if reason is not None:
                if len(good) == 1:
                    good[0].rejected = reason
                    return None
                logger.warning("isolating rejected input", extra={"error": str(reason)})
            elif not any(self._last_attempt(r) for r in good):
                await self._report_failure(thread_id, good[0], error)
                return 0
            elif len(good) == 1:
                good[0].rejected = self._give_up(good[0], error)
                return None
            else:
                logger.warning(
                    "last attempt failed; isolating the failing input", extra={"error": str(error)}
                )
        # Some input is unacceptable (e.g. too large to store), or a record on its last attempt keeps failing.
        # Steps are atomic and idempotent, so the records are re-run one at a time to single out the culprit.
        for index, record in enumerate(good):
            try:
                await self._step_and_publish(thread_id, [record])
            except Exception as error:
                record.rejected = rejection(error)
                if record.rejected is not None:
                    continue
                if self._last_attempt(record):
                    record.rejected = self._give_up(record, error)
                    continue
                await self._report_failure(thread_id, record, error)
                return index
        return None

    async def _step_and_publish(self, thread_id: str, records: Sequence[Record]) -> None:
        inputs = [StepInput(r.message, r.logical_id, r.traceparent) for r in records if r.message is not None]
        append_keys(message_ids=[i.message_id for i in inputs])
        observer = StepEvents()
        timing = ModelTiming(observer)
        steps: list[ThreadStep] = []
        # A lost head-version race means another writer advanced the thread: re-run from a fresh load;
        # the logical-id dedup absorbs whatever that writer already did.
        for attempt in range(1, RACE_BACKOFF.attempts + 1):
            observer = StepEvents()
            live = self.live.step(thread_id)  # the partial text clients poll (aws/live.py)
            timing = ModelTiming(live.observing(observer))

            def started(step: ThreadStep, attach: Callable[[ThreadStep], None] = live.attach) -> None:
                steps.append(step)
                attach(step)

            try:
                await self.system.step_thread(thread_id, inputs, timing, on_start=started)
                break
            except ConcurrentWriteError:
                self.metrics.add_metric("WriteConflicts", "Count", 1)
                delay = RACE_BACKOFF.delay(attempt)
                if not RACE_BACKOFF.allows(attempt, delay):
                    raise
                logger.warning("lost the thread's head-version race; re-running")
            finally:
                await live.close()
            await asyncio.sleep(delay)
        history = steps[-1].history if steps else None
        profile = profile_name(history.metadata) if history is not None else None
        publish_usage(
            self.metrics,
            observer.events,
            profile=profile,
            latency_ms=timing.latency_ms,
            prices=self.system.config.prices,
        )
        if history is not None:
            await self._count_spend(history.root_thread_id, observer.events)
        events = step_events(thread_id, observer.events, inputs)
        redelivered = [r.logical_id for r in records if r.receive_count > 1 and r.message is not None]
        if redelivered:
            # An earlier attempt may have committed without publishing: report its rows again (same
            # event ids), before this run's own rows; then its turn_complete, if it had one.
            fresh = {row.order for row in observer.committed_rows}
            conversation = self.publisher.conversation
            replayed = await replay_rows(conversation, thread_id, redelivered)
            done = await replay_turn_complete(conversation, thread_id, redelivered, events)
            events = row_events(thread_id, [r for r in replayed if r.order not in fresh]) + done + events
        # The step loaded the root and its metadata and committed any change to it: the events carry those.
        context = (history.root_thread_id, history.metadata) if history is not None else None
        await self.publisher.publish(thread_id, events, context=context)
        self.metrics.add_metric("Steps", "Count", 1)
        logger.info("step done", extra={"events": len(events)})

    async def _count_spend(self, root_id: str, events: Sequence[AgentEvent]) -> None:
        """Add the step's model cost (as its usage record stores it) to the owner's spend of the day. Only
        model calls this run made are counted (a redelivery that re-runs nothing adds nothing); a failure
        here is logged, never fails the committed step (the quota then undercounts that step)."""
        if self.counters is None:
            return
        prices = self.system.config.prices
        cost = sum(
            prices.cost(e.model, e.step_usage) or 0.0
            for e in events
            if isinstance(e, CompletionFinished) and e.step_usage is not None
        )
        if cost <= 0:
            return
        try:
            await self.counters.add_spend(root_id, cost, self.clock())
        except TransientError as error:
            logger.warning(
                "could not add the step's cost to its owner's daily spend", extra={"error": str(error)}
            )

    # ---- failure and rejection --------------------------------------------------------------------------

    async def _report_failure(self, thread_id: str, record: Record, error: BaseException | None) -> None:
        self.metrics.add_metric("StepFailures", "Count", 1)
        published = False
        if record.group_id is not None:  # an unroutable record has no thread to tell
            attempt = f"attempt {record.receive_count} of {self.max_receive_count}"
            message = f"Processing failed ({attempt}) and will be retried: {type(error).__name__}: {error}"[
                :_MAX_ATTRIBUTE_CHARS
            ]
            # One event per attempt (the text names it), each with its own stable id.
            event = error_event(thread_id, message, True, record.logical_id, attempt=record.receive_count)
            try:
                await self.publisher.publish(thread_id, [event])
                published = True
            except Exception:  # the record is retried anyway; the event is a courtesy
                logger.exception("could not publish the retrying error event")
        logger.error(
            "thread failed; its records will be retried",
            extra={
                "message_id": record.logical_id,
                "error": f"{type(error).__name__}: {error}",
                REPORTED_TO_THREAD: published,
            },
        )

    async def _reject(self, record: Record) -> bool:
        """Copy a bad record to the input DLQ and tell its thread. ``False`` if that failed."""
        error: StepagentError | None = record.rejected
        reason = str(error)
        summary = "gave up on input" if isinstance(error, RetriesExhaustedError) else "rejected bad input"
        fields = {"message_id": record.logical_id, "reason": reason}
        attributes = {
            "stepagent_error": reason[:_MAX_ATTRIBUTE_CHARS],
            "stepagent_message_id": record.record_id,
        }
        if isinstance(error, RetriesExhaustedError):
            attributes["stepagent_attempts"] = str(error.attempts)
        if record.group_id is not None:
            attributes["stepagent_message_group_id"] = record.group_id
        if record.format_version is not None:
            attributes[FORMAT_ATTRIBUTE] = record.format_version
        try:
            await self.queues.send(
                await self.input_dlq_url(),
                record.raw_body or "(empty body)",
                group_id=record.group_id or _UNROUTABLE_GROUP,
                # The SQS message id is stable across redeliveries: a re-run copies once.
                dedup_id=hashlib.sha256(f"dlq\x1f{record.record_id}".encode()).hexdigest(),
                attributes=attributes,
                claim_check=False,
            )
            if record.group_id is not None:
                if isinstance(error, RetriesExhaustedError):
                    text = reason[0].upper() + reason[1:]
                    event = error_event(
                        record.group_id, text, False, record.logical_id, attempts=error.attempts
                    )
                else:
                    text = f"Rejected input message {record.logical_id}: {reason}"
                    event = error_event(record.group_id, text, False, record.logical_id)
                await self.publisher.publish(record.group_id, [event])
        except Exception:
            logger.warning(summary, extra=fields)
            logger.exception("could not dispose of bad input; it will be retried")
            return False
        logger.warning(summary, extra={**fields, REPORTED_TO_THREAD: record.group_id is not None})
        self.metrics.add_metric("BadInputs", "Count", 1)
        return True
