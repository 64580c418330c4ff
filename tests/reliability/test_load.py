"""Concurrency and load on DynamoDB + SQS (moto) through the real worker handler: several pollers on one
input FIFO queue, each with its own runtime, like concurrent Lambda invocations of the worker.

What is shown:

- **Load, order preserved.** ``LOAD_THREADS`` threads x ``LOAD_STEPS`` user messages (10 x 5 in
  ``make test``; 50 x 20 with ``STEPAGENT_SOAK=1``, i.e. ``make soak``), every fifth one a function-tool
  round trip through the tool runner, all queued at once and interleaved across threads, handled by
  ``POLLERS`` concurrent pollers: every message is answered, each thread's inputs are in send order, no
  row is duplicated, every committed row's output event is on the output queue in row order, nothing is
  dead-lettered.
- **A poison thread does not delay the others.** Its commits always fail. As on Lambda, a failed record
  stays invisible until its visibility timeout expires, which blocks only its own message group: every
  healthy thread finishes while the poison message has been tried once; then, letting the timeouts
  expire, the worker gives up on each poison message on its maxReceiveCount-th attempt (DLQ copy, an
  ``error`` event with ``retrying: false`` and the attempts), each earlier attempt announced with its own
  ``error`` event (``retrying: true``, "attempt n of 5").
- **Two workers on one thread never corrupt it:** the same batch handled by two runtimes at once (both
  load the same head before either commits), and a visibility timeout expiring while the first worker
  is still inside the model, so a second worker processes the redelivered message first.

Where moto's semantics get in the way, and what the tests do instead:

- moto's FIFO queues keep a message group blocked while it has messages in flight, but the check is not
  atomic across concurrent ``ReceiveMessage`` calls (the moto server is threaded): two pollers receiving
  at the same moment can both get messages of one group, so one thread runs on two workers at once. (Seen
  here as unexpected ``WriteConflicts``, and then lost rows because of the next point.) SQS does not do
  that, so the pollers take turns to *receive* (one lock around ``ReceiveMessage``); handling the batches
  — the steps, their commits, the tool runs and the output sends — runs concurrently. The load tests
  assert that no write conflict happened at all.
- moto's ``TransactWriteItems`` is not isolated from concurrent requests (a cancelled transaction restores
  a copy of the table taken before it started, undoing another request's write), so where two workers
  race on one thread on purpose, the tests serialize commits at the client, as DynamoDB's own isolation
  would.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from stepagent.aws.runtime import AwsRuntime
from stepagent.errors import StoreError
from stepagent.history_items import AssistantText, ToolCallItem, UserItem
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent
from stepagent.providers.scripted import ScriptedProvider
from tests.integration.aws_helpers import FailsOnMessage, Stack, aws_stack, failed_ids
from tests.polling import eventually
from tests.reliability.scenarios import check_thread, expected_output_ids, snapshot

SOAK = os.environ.get("STEPAGENT_SOAK") == "1"
LOAD_THREADS, LOAD_STEPS = (50, 20) if SOAK else (10, 5)
POLLERS = 4

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "look it up",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"when": "^Sunny in Paris", "on": ["tool_result"], "reply": [{"text": "It is sunny."}]},
    ],
    "default": [{"text": "ok"}],
}


def message_text(step: int) -> str:
    return f"step {step}" + (", look it up" if step % 5 == 4 else "")


@dataclass
class Poller:
    """One concurrent "Lambda": receives batches from the input and tool queues and hands them to its
    runtime, then acknowledges like the event source (successes deleted; failures visible again at once,
    or — for groups in ``hold`` — left in flight until their visibility timeout, i.e. until released)."""

    stack: Stack
    runtime: AwsRuntime
    receive_lock: asyncio.Lock
    hold: set[str] = field(default_factory=set)
    held: list[tuple[str, str]] = field(default_factory=list)  # (group, receipt handle)
    failures: list[str] = field(default_factory=list)
    batches: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        handlers = [
            (self.stack.input_url, self.runtime.handle_sqs_batch),
            (self.stack.resources.tool_queue_url, self.runtime.handle_tool_batch),
        ]
        while not stop.is_set():
            busy = False
            for url, handler in handlers:
                async with self.receive_lock:  # see the module docstring: moto's FIFO groups need it
                    event = await self.stack.receive_event(url)
                if not event["Records"]:
                    continue
                busy = True
                self.batches += 1
                result = await handler(event)
                await self._ack(url, event, result)
            if not busy:
                await asyncio.sleep(0.02)

    async def _ack(self, url: str, event: dict[str, Any], result: dict[str, Any]) -> None:
        failed = set(failed_ids(result))
        for record in event["Records"]:
            handle = record["receiptHandle"]
            group = record["attributes"].get("MessageGroupId", "")
            if record["messageId"] not in failed:
                await self.stack.sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
            elif group in self.hold:
                self.held.append((group, handle))
            else:
                self.failures.append(group)
                await self.stack.sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0
                )


@dataclass
class Fleet:
    stack: Stack
    pollers: list[Poller]
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]]

    async def release_held(self) -> None:
        """The held records' visibility timeouts expire: they are delivered again."""
        for poller in self.pollers:
            held, poller.held = poller.held, []
            for _, handle in held:
                await self.stack.sqs.change_message_visibility(
                    QueueUrl=self.stack.input_url, ReceiptHandle=handle, VisibilityTimeout=0
                )


@asynccontextmanager
async def fleet(
    stack: Stack,
    *,
    count: int = POLLERS,
    hold: set[str] | None = None,
    wrap: Callable[[Any], Any] | None = None,
) -> AsyncIterator[Fleet]:
    """``count`` pollers, each with its own runtime (a separate sandbox: own clients, own stores)."""
    runtimes = [
        await AwsRuntime.create(stack.settings, provider=ScriptedProvider(SCRIPT)) for _ in range(count)
    ]
    if wrap is not None:
        for runtime in runtimes:
            runtime.system.conversation = wrap(runtime.system.conversation)
    lock = asyncio.Lock()
    pollers = [Poller(stack, runtime, lock, hold=hold if hold is not None else set()) for runtime in runtimes]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(poller.run(stop)) for poller in pollers]
    try:
        yield Fleet(stack, pollers, stop, tasks)
    finally:
        stop.set()
        try:
            await asyncio.gather(*tasks)  # a poller that crashed fails the test here
        finally:
            for runtime in runtimes:
                await runtime.aclose()


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, *, guard: float = 600.0) -> None:
    """Poll ``check``; ``guard`` only stops a hung test (no pass/fail criterion depends on time)."""
    await eventually(check, what, within=guard, interval=0.1)


async def drained(stack: Stack) -> bool:
    """No message visible, in flight or delayed on the input and tool queues."""
    for url in (stack.input_url, stack.resources.tool_queue_url):
        found = await stack.sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )
        if any(int(value) for value in found["Attributes"].values()):
            return False
    return True


async def send_interleaved(stack: Stack, threads: list[str], steps: int) -> None:
    for step in range(steps):
        for thread in threads:
            await stack.send_user(thread, message_text(step), f"{thread}-m{step}")


def user_texts(items: list[Any]) -> list[str]:
    return [i.text or "" for i in items if isinstance(i, UserItem)]


# ---- load ----------------------------------------------------------------------------------------------


async def test_many_threads_on_concurrent_pollers_keep_per_thread_order() -> None:
    async with aws_stack() as stack:
        threads = [f"load-{n:02d}-{uuid.uuid4().hex[:6]}" for n in range(LOAD_THREADS)]
        await send_interleaved(stack, threads, LOAD_STEPS)
        async with fleet(stack) as running:
            await wait_until(lambda: drained(stack), "the queues never drained")
        assert [p.failures for p in running.pollers] == [[]] * POLLERS, "a record failed"
        assert sum(p.batches > 0 for p in running.pollers) >= 2, "the pollers did not share the work"
        assert not any(p.runtime.metrics.counts.get("WriteConflicts") for p in running.pollers)  # type: ignore[attr-defined]

        snap = await snapshot(stack.runtime.conversation, stack.runtime.state, threads)
        assert sorted(snap) == sorted(threads)
        problems = [p for thread, view in snap.items() for p in check_thread(thread, view)]
        for thread in threads:
            items = snap[thread].items
            if user_texts(items) != [message_text(step) for step in range(LOAD_STEPS)]:
                problems.append(f"{thread}: inputs out of order or missing: {user_texts(items)}")
            if not isinstance(items[-1], AssistantText):
                problems.append(f"{thread}: the last input was never answered")
            if len([i for i in items if isinstance(i, ToolCallItem)]) != LOAD_STEPS // 5:
                problems.append(f"{thread}: expected one tool round trip per fifth message")
        assert not problems, problems

        # Every committed row was published, and each thread's events arrive in row order.
        expected = expected_output_ids(snap)
        seen: dict[str, list[int]] = {}
        for event in await stack.outputs():
            where = expected.get(event["event_id"])
            if where is not None:
                seen.setdefault(where[0], []).append(where[1])
        assert sum(len(orders) for orders in seen.values()) == len(expected), "an output event is missing"
        assert all(orders == sorted(orders) for orders in seen.values()), "output events out of row order"
        assert not await stack.receive(stack.resources.input_dlq_url)


# ---- a poison thread -------------------------------------------------------------------------------------


class FailingCommits:
    """Wraps a conversation store: every commit of ``thread`` raises a transient ``StoreError``."""

    def __init__(self, inner: Any, thread: str, attempts: list[str]) -> None:
        self.inner, self.thread, self.attempts = inner, thread, attempts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, thread_id: str, commit: Any) -> Any:
        if thread_id == self.thread:
            self.attempts.append(thread_id)
            raise StoreError("injected: this thread's commits always fail")
        return await self.inner.commit(thread_id, commit)


async def test_a_poison_thread_does_not_delay_the_others() -> None:
    async with aws_stack() as stack:
        poison = f"poison-{uuid.uuid4().hex[:6]}"
        healthy = [f"healthy-{n:02d}-{uuid.uuid4().hex[:6]}" for n in range(LOAD_THREADS)]
        for step in range(3):
            await stack.send_user(poison, f"poison {step}", f"{poison}-m{step}")
        await send_interleaved(stack, healthy, 3)
        attempts: list[str] = []

        async def healthy_done() -> bool:
            for thread in healthy:
                items = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
                if len(user_texts(items)) < 3 or not isinstance(items[-1], AssistantText):
                    return False
            return True

        wrap = lambda inner: FailingCommits(inner, poison, attempts)  # noqa: E731
        async with fleet(stack, hold={poison}, wrap=wrap) as running:
            await wait_until(healthy_done, "the healthy threads never finished")
            # Every healthy thread is done, and the poison group was tried exactly once: its failed
            # record is in flight (invisible until its visibility timeout), blocking only its own group.
            assert attempts == [poison]
            assert [p.failures for p in running.pollers] == [[]] * POLLERS
            assert not any(p.runtime.metrics.counts.get("WriteConflicts") for p in running.pollers)  # type: ignore[attr-defined]
            assert sum(len(p.held) for p in running.pollers) >= 1

            # Now let the timeouts expire, and every later failure come back at once.
            for poller in running.pollers:
                poller.hold.clear()
            await running.release_held()
            await wait_until(lambda: drained(stack), "the poison messages never left the queue")

        dead = await stack.receive(stack.resources.input_dlq_url)
        assert sorted(json.loads(m["Body"])["id"] for m in dead) == [f"{poison}-m{n}" for n in range(3)]
        assert [row async for row in stack.runtime.conversation.load_rows(poison)] == []
        errors = [e for e in await stack.outputs() if e["type"] == "error"]
        assert errors and all(e["thread_id"] == poison for e in errors)
        assert len({e["event_id"] for e in errors}) == len(errors)  # one event per input and attempt
        # The worker gave up on each on its last attempt (maxReceiveCount) and said so, once per input.
        final = [e for e in errors if not e["retrying"]]
        assert sorted(e["message"].split()[5] for e in final) == [f"{poison}-m{n}" for n in range(3)]
        assert all(e["attempts"] == 5 for e in final)


async def test_a_poison_message_with_follow_ups_on_concurrent_pollers() -> None:
    """One message of a thread always fails; its thread's later messages fail with it on every attempt
    (FIFO), so their receive counts climb with its own. On the last allowed attempt the worker gives up on
    the poison alone: the follow-ups are answered, in order, and only the poison is dead-lettered."""
    async with aws_stack() as stack:
        thread = f"poisoned-{uuid.uuid4().hex[:6]}"
        healthy = [f"healthy-{n:02d}-{uuid.uuid4().hex[:6]}" for n in range(LOAD_THREADS)]
        poison = f"{thread}-m0"
        for step in range(4):
            await stack.send_user(thread, f"message {step}", f"{thread}-m{step}")
        await send_interleaved(stack, healthy, 2)
        failure = StoreError(f"injected: message {poison} always fails")
        wrap = lambda inner: FailsOnMessage(inner, poison, failure)  # noqa: E731
        async with fleet(stack, wrap=wrap) as running:
            await wait_until(lambda: drained(stack), "the queues never drained")
        gave_up = sum(p.runtime.metrics.counts.get("GaveUp", 0) for p in running.pollers)  # type: ignore[attr-defined]
        assert gave_up == 1
        dead = await stack.receive(stack.resources.input_dlq_url)
        assert [json.loads(m["Body"])["id"] for m in dead] == [poison]
        snap = await snapshot(stack.runtime.conversation, stack.runtime.state, [thread, *healthy])
        assert user_texts(snap[thread].items) == [f"message {step}" for step in (1, 2, 3)]
        problems = [p for name, view in snap.items() for p in check_thread(name, view)]
        assert not problems, problems
        final = [e for e in await stack.outputs() if e["type"] == "error" and not e["retrying"]]
        assert [(e["thread_id"], e["attempts"]) for e in final] == [(thread, 5)]


# ---- two workers on one thread --------------------------------------------------------------------------


class SerializedCommits:
    """Commits from several runtimes never overlap in time (DynamoDB isolates transactions; moto does
    not, see the module docstring)."""

    def __init__(self, inner: Any, lock: asyncio.Lock) -> None:
        self.inner, self.lock = inner, lock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, thread_id: str, commit: Any) -> Any:
        async with self.lock:
            return await self.inner.commit(thread_id, commit)


class GatedProvider:
    """The load script's model; each thread's first stream waits at that thread's gate."""

    def __init__(self, gate: Callable[[str], Awaitable[None]]) -> None:
        self.inner = ScriptedProvider(SCRIPT)
        self.gate = gate
        self.started: set[str] = set()

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        thread = request.thread_stack[-1]
        if thread not in self.started:
            self.started.add(thread)
            await self.gate(thread)
        async for event in self.inner.stream(request):
            yield event


async def _finish(stack: Stack) -> None:
    """Drain what the racing invocations left (tool calls, results) with one ordinary worker."""
    async with fleet(stack, count=1) as running:
        await wait_until(lambda: drained(stack), "the follow-up work never drained")
    assert running.pollers[0].failures == []


async def test_the_same_batch_on_two_workers_at_once_is_applied_once() -> None:
    async with aws_stack() as stack:
        threads = [f"race-{n}-{uuid.uuid4().hex[:6]}" for n in range(5)]
        for thread in threads:
            await stack.send_user(thread, message_text(4), f"{thread}-m0")  # a tool round trip each
        records: list[dict[str, Any]] = []
        while len(records) < len(threads):
            records += (await stack.receive_event(stack.input_url))["Records"]
        event = {"Records": records}
        barriers = {thread: asyncio.Barrier(2) for thread in threads}

        async def meet(thread: str) -> None:
            await asyncio.wait_for(barriers[thread].wait(), 30)

        lock = asyncio.Lock()
        workers = [await AwsRuntime.create(stack.settings, provider=GatedProvider(meet)) for _ in range(2)]
        try:
            for worker in workers:
                worker.system.conversation = SerializedCommits(worker.system.conversation, lock)
            results = await asyncio.gather(*(worker.handle_sqs_batch(event) for worker in workers))
            conflicts = sum(w.metrics.counts.get("WriteConflicts", 0) for w in workers)  # type: ignore[attr-defined]
        finally:
            for worker in workers:
                await worker.aclose()
        assert [failed_ids(r) for r in results] == [[], []]
        assert conflicts == len(threads)  # per thread, exactly one worker lost the race and re-ran
        await stack.ack(stack.input_url, event, results[0])
        await _finish(stack)

        snap = await snapshot(stack.runtime.conversation, stack.runtime.state, threads)
        for thread in threads:
            view = snap[thread]
            assert check_thread(thread, view) == []
            kinds = [type(i).__name__ for i in view.items]
            assert kinds == ["UserItem", "ToolCallItem", "ToolResultItem", "AssistantText"], (thread, kinds)
            assert view.info.version == 2  # the loser's commit was refused, not merged


async def test_a_visibility_timeout_expiring_mid_step_does_not_corrupt_the_thread() -> None:
    async with aws_stack() as stack:
        thread = f"expiry-{uuid.uuid4().hex[:6]}"
        await stack.send_user(thread, "hello", f"{thread}-m0")
        inside, release = asyncio.Event(), asyncio.Event()

        async def stall(_: str) -> None:
            inside.set()
            await release.wait()

        first = await AwsRuntime.create(stack.settings, provider=GatedProvider(stall))
        second = await AwsRuntime.create(stack.settings, provider=ScriptedProvider(SCRIPT))
        try:
            event_a = await stack.receive_event(stack.input_url)
            running = asyncio.create_task(first.handle_sqs_batch(event_a))
            await asyncio.wait_for(inside.wait(), 30)
            # The first worker is inside the model when its visibility timeout runs out.
            [record] = event_a["Records"]
            await stack.sqs.change_message_visibility(
                QueueUrl=stack.input_url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
            )
            event_b = await stack.receive_event(stack.input_url)
            assert event_b["Records"][0]["attributes"]["ApproximateReceiveCount"] == "2"
            result_b = await second.handle_sqs_batch(event_b)
            await stack.ack(stack.input_url, event_b, result_b)
            release.set()
            result_a = await asyncio.wait_for(running, 30)
            conflicts = first.metrics.counts.get("WriteConflicts", 0)  # type: ignore[attr-defined]
        finally:
            await first.aclose()
            await second.aclose()
        assert failed_ids(result_a) == failed_ids(result_b) == []
        assert conflicts == 1  # the stale worker lost its conditional write, re-ran and absorbed it
        items = [row.item async for row in stack.runtime.conversation.load_rows(thread)]
        assert items == [items[0], AssistantText("ok")] and user_texts(items) == ["hello"]
        info = await stack.runtime.conversation.get_thread(thread)
        assert info is not None and info.version == 1
        assert [e["type"] for e in await stack.outputs()] == ["text", "turn_complete"]  # one of each
