"""The worker end to end on the moto server: real queues, tables and bucket, the scripted model, the
batch handlers fed by a test poller that behaves like Lambda's SQS event source."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stepagent.errors import PayloadTooLargeError, ProviderError, QueueError, StoreError
from stepagent.messages import InputMessage
from stepagent.outputs.build import event_id
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent, ToolCallComplete
from stepagent.providers.scripted import ScriptedProvider
from stepagent.senders.sqs import SqsSender
from tests.integration.aws_helpers import SCRIPT, FailsOnMessage, Stack, aws_stack, failed_ids

pytestmark = pytest.mark.asyncio


def tid(prefix: str = "conv") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def of_type(events: list[dict[str, Any]], kind: str, thread: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind and (thread is None or e["thread_id"] == thread)]


class FailingCommits:
    """Wraps the conversation store: ``commit`` for ``thread`` raises ``StoreError`` ``times`` times."""

    def __init__(self, inner: Any, thread: str, times: int = 1) -> None:
        self.inner, self.thread, self.times, self.failures = inner, thread, times, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, thread_id: str, commit: Any) -> Any:
        if thread_id == self.thread and self.failures < self.times:
            self.failures += 1
            raise StoreError(f"injected commit failure #{self.failures}")
        return await self.inner.commit(thread_id, commit)


async def test_user_text_gets_an_answer_as_a_text_event() -> None:
    async with aws_stack() as stack:
        thread = tid()
        await stack.runtime.state.set_metadata(thread, {"channel": "C1"})
        await stack.send_user(thread, "hello there", "m1")
        await stack.pump()
        assert await stack.texts(thread) == ["hello there", "ok"]
        text, done = await stack.outputs()
        assert text == {
            "type": "text",
            "event_id": event_id(thread, "2", "text"),
            "text": "ok",
            "thread_id": thread,
            "root_thread_id": thread,
            "metadata": {"channel": "C1"},
        }
        # Nothing is pending after the answer: the turn is complete, with the usage the commit stored.
        [record] = [r async for r in stack.runtime.conversation.usage_records(thread)]
        assert record.turn_complete and record.completions == 1 and record.output_tokens == 1  # "ok"
        assert done == {
            "type": "turn_complete",
            "event_id": event_id(thread, f"v{record.version}", "turn_complete"),
            "usage": {
                "input_tokens": record.input_tokens,
                "output_tokens": 1,
                "cache_read_tokens": 0,
                "cache_write_tokens": 0,
            },
            "model": stack.settings.model,  # the STEPAGENT_MODEL spelling
            "thread_id": thread,
            "root_thread_id": thread,
            "metadata": {"channel": "C1"},
        }
        assert record.input_tokens > 0
        counts = stack.runtime.metrics.counts  # type: ignore[attr-defined]
        assert counts["Steps"] == 1
        assert counts[f"InputTokens[model={stack.settings.model},profile=default]"] == record.input_tokens
        assert counts[f"OutputTokens[model={stack.settings.model},profile=default]"] == 1


async def test_tool_round_trip_through_the_tool_runner() -> None:
    async with aws_stack() as stack:
        thread = tid()
        await stack.send_user(thread, "what is the weather?", "m1")
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts == [
            "what is the weather?",
            "Let me check.",
            'get_weather({"city": "Paris"})',
            "Sunny in Paris",
            "It is sunny in Paris.",
        ]
        events = await stack.outputs()
        # The first step ends on an open call (no turn_complete); the second answers it and completes.
        assert [e["type"] for e in events] == ["text", "tool_call", "tool_result", "text", "turn_complete"]
        assert (
            events[2]["text"] == "Sunny in Paris" and events[2]["tool_call_id"] == events[1]["tool_call_id"]
        )
        call = events[1]
        assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
        assert call["tool_call_id"].startswith("call_")
        assert all(e["metadata"] == {} and e["root_thread_id"] == thread for e in events)


async def test_parent_and_child_threads_in_their_own_message_groups() -> None:
    async with aws_stack() as stack:
        parent = tid("parent")
        await stack.send_user(parent, "please delegate", "m1")
        await stack.pump()
        [child] = await stack.runtime.conversation.children(parent)
        child_texts = await stack.texts(child.thread_id)
        assert any("You are now INSIDE" in t for t in child_texts)
        parent_texts = await stack.texts(parent)
        assert "Got the report." in parent_texts and "Child finished." in parent_texts
        assert (await stack.runtime.conversation.get_thread(child.thread_id)).closed  # type: ignore[union-attr]
        groups = {
            record["attributes"]["MessageGroupId"]
            for url, event, _ in stack.handled
            for record in event["Records"]
            if url == stack.input_url
        }
        assert groups == {parent, child.thread_id}
        events = await stack.outputs()
        child_calls = of_type(events, "tool_call", child.thread_id)
        assert [c["name"] for c in child_calls] == ["report_to_parent", "close_thread"]
        assert all(e["root_thread_id"] == parent for e in events)


async def test_every_message_delivered_twice_leaves_identical_histories() -> None:
    thread = tid()
    histories = []
    outputs = []
    for twice in (False, True):
        async with aws_stack() as stack:
            await stack.send_user(thread, "please delegate", "m1")
            await stack.pump(twice=twice)
            await stack.send_user(thread, "what is the weather?", "m2")
            await stack.pump(twice=twice)
            [child] = await stack.runtime.conversation.children(thread)
            histories.append((await stack.history(thread), await stack.history(child.thread_id)))
            outputs.append(sorted(e["event_id"] for e in await stack.outputs()))
    assert histories[0] == histories[1]
    assert outputs[0] == outputs[1]


async def _batch(stack: Stack, expected: int) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    while len(records) < expected:
        event = await stack.receive_event(stack.input_url)
        assert event["Records"], f"only {len(records)} of {expected} records arrived"
        records.extend(event["Records"])
    return {"Records": records}


async def test_a_failing_thread_fails_only_its_own_records() -> None:
    async with aws_stack() as stack:
        bad, good = tid("bad"), tid("good")
        for n in (1, 2):
            await stack.send_user(bad, f"bad {n}", f"b{n}")
            await stack.send_user(good, f"good {n}", f"g{n}")
        event = await _batch(stack, 4)
        stack.runtime.system.conversation = FailingCommits(stack.runtime.system.conversation, bad)
        result = await stack.runtime.handle_sqs_batch(event)
        by_id = {r["messageId"]: json.loads(r["body"])["id"] for r in event["Records"]}
        assert sorted(by_id[i] for i in failed_ids(result)) == ["b1", "b2"]
        assert await stack.texts(good) == ["good 1", "good 2", "ok"]
        assert await stack.texts(bad) == []
        [error] = of_type(await stack.outputs(), "error", bad)
        assert error["retrying"] is True and "injected commit failure" in error["message"]
        await stack.ack(stack.input_url, event, result)
        await stack.pump()  # SQS redelivers the failed records; the fault is spent
        assert await stack.texts(bad) == ["bad 1", "bad 2", "ok"]


async def test_a_transient_failure_mid_thread_fails_that_record_and_the_later_ones() -> None:
    async with aws_stack() as stack:
        thread, other = tid(), tid("other")
        await stack.send_user(thread, "first", "t1")
        # Claim-checked by another process (a client), so the worker has to read it from S3.
        client = SqsSender(stack.sqs, stack.input_url, s3_client=stack.s3, bucket=stack.resources.bucket)
        await client.send(InputMessage.user_text(thread, "second " + "y" * 300_000, id="t2"), "t2")
        await stack.send_user(thread, "third", "t3")
        await stack.send_user(other, "unrelated", "o1")
        event = await _batch(stack, 4)
        blobs = stack.runtime.blobs
        assert blobs is not None
        real_s3 = blobs.s3

        class BrokenS3:
            def __getattr__(self, name: str) -> Any:
                return getattr(real_s3, name)

            async def get_object(self, **kwargs: Any) -> Any:
                raise QueueError("injected S3 outage")

        blobs.s3 = BrokenS3()
        result = await stack.runtime.handle_sqs_batch(event)
        blobs.s3 = real_s3
        ids = {r["messageId"]: r for r in event["Records"]}
        failed = [ids[i]["attributes"]["MessageDeduplicationId"] for i in failed_ids(result)]
        assert len(failed) == 2
        assert await stack.texts(thread) == ["first", "ok"]
        assert await stack.texts(other) == ["unrelated", "ok"]
        await stack.ack(stack.input_url, event, result)
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts[2].startswith("second yyy") and texts[3:] == ["third", "ok"]


async def test_malformed_body_and_group_mismatch_go_to_the_dlq_with_an_error_event() -> None:
    async with aws_stack() as stack:
        thread, mismatch, other = tid(), tid("mismatch"), tid("other")
        await stack.send_raw("{not json", thread, "raw-1")
        await stack.send_user(thread, "after the bad one", "t2")
        wrong = InputMessage.user_text("somebody-else", "hi", id="w1").to_json()
        await stack.send_raw(wrong, mismatch, "raw-2")
        await stack.send_user(other, "fine", "o1")
        event = await _batch(stack, 4)
        result = await stack.runtime.handle_sqs_batch(event)
        assert failed_ids(result) == []
        assert await stack.texts(thread) == ["after the bad one", "ok"]
        assert await stack.texts(other) == ["fine", "ok"]
        assert await stack.texts(mismatch) == []
        dlq = await stack.receive(stack.resources.input_dlq_url)
        copies = {m["Body"]: m["MessageAttributes"]["stepagent_error"]["StringValue"] for m in dlq}
        assert set(copies) == {"{not json", wrong}
        assert "not valid JSON" in copies["{not json"]
        assert "somebody-else" in copies[wrong] and mismatch in copies[wrong]
        events = await stack.outputs()
        [bad_json] = of_type(events, "error", thread)
        assert bad_json["retrying"] is False and "not valid JSON" in bad_json["message"]
        [bad_group] = of_type(events, "error", mismatch)
        assert bad_group["retrying"] is False
        assert stack.runtime.metrics.counts["BadInputs"] == 2  # type: ignore[attr-defined]
        # The error event precedes the answer to the later message of the same thread.
        thread_events = [e["type"] for e in events if e["thread_id"] == thread]
        assert thread_events == ["error", "text", "turn_complete"]


async def test_input_the_step_refuses_is_isolated_and_rejected_alone() -> None:
    async with aws_stack() as stack:
        thread = tid()
        for n in (1, 2, 3):
            await stack.send_user(thread, f"message {n}", f"m{n}")
        event = await _batch(stack, 3)
        stack.runtime.system.conversation = FailsOnMessage(
            stack.runtime.system.conversation, "m2", PayloadTooLargeError("message m2 is too large to store")
        )
        result = await stack.runtime.handle_sqs_batch(event)
        assert failed_ids(result) == []
        assert await stack.texts(thread) == ["message 1", "ok", "message 3", "ok"]
        [dead] = await stack.receive(stack.resources.input_dlq_url)
        assert json.loads(dead["Body"])["id"] == "m2"
        assert "too large" in dead["MessageAttributes"]["stepagent_error"]["StringValue"]
        [error] = of_type(await stack.outputs(), "error", thread)
        assert error["retrying"] is False and error["event_id"] == event_id(thread, "m2", "error")


async def _until_drained(stack: Stack, rounds: int = 10) -> list[list[str]]:
    """Hand the input queue to the worker until it is empty; the failed ids of each invocation."""
    failures = []
    for _ in range(rounds):
        event = await stack.receive_event(stack.input_url)
        if not event["Records"]:
            return failures
        result = await stack.runtime.handle_sqs_batch(event)
        failures.append(failed_ids(result))
        await stack.ack(stack.input_url, event, result)
    raise AssertionError("the input queue never drained")


async def test_a_poison_message_is_given_up_on_its_last_attempt() -> None:
    async with aws_stack() as stack:
        thread = tid("poison")
        stack.runtime.system.conversation = FailingCommits(
            stack.runtime.system.conversation, thread, times=99
        )
        await stack.send_user(thread, "never works", "p1")
        failures = await _until_drained(stack)
        # Four failed attempts; the fifth (maxReceiveCount) is the worker's: it gives up and acknowledges.
        assert [len(f) for f in failures] == [1, 1, 1, 1, 0]
        [dead] = await stack.receive(stack.resources.input_dlq_url)
        assert json.loads(dead["Body"])["id"] == "p1"
        attributes = dead["MessageAttributes"]
        assert attributes["stepagent_attempts"]["StringValue"] == "5"
        assert "after 5 attempts" in attributes["stepagent_error"]["StringValue"]
        errors = of_type(await stack.outputs(), "error", thread)
        assert [e["retrying"] for e in errors] == [True, True, True, True, False]
        assert [f"attempt {n} of 5" in e["message"] for n, e in enumerate(errors[:4], 1)] == [True] * 4
        final = errors[-1]
        assert final["attempts"] == 5 and "after 5 attempts" in final["message"]
        assert "retry" not in final["message"].lower().replace("injected commit failure", "")
        assert final["event_id"] == event_id(thread, "p1", "error")
        assert stack.runtime.metrics.counts["GaveUp"] == 1  # type: ignore[attr-defined]


async def test_a_poison_message_does_not_drag_its_threads_follow_ups_into_the_dlq() -> None:
    """FIFO makes the follow-up fail with the poison on every attempt, so its receive count climbs with
    the poison's; on the last attempt the worker isolates them: only the poison is dead-lettered."""
    async with aws_stack() as stack:
        thread, other = tid("poison"), tid("other")
        stack.runtime.system.conversation = FailsOnMessage(
            stack.runtime.system.conversation, "p1", StoreError("injected: message p1 always fails")
        )
        await stack.send_user(thread, "never works", "p1")
        await stack.send_user(thread, "but this is fine", "f1")
        await stack.send_user(other, "unrelated", "o1")
        failures = await _until_drained(stack)
        assert [len(f) for f in failures[:4]] == [2, 2, 2, 2] and failures[4:] == [[]]
        assert await stack.texts(thread) == ["but this is fine", "ok"]
        assert await stack.texts(other) == ["unrelated", "ok"]
        dead = await stack.receive(stack.resources.input_dlq_url)
        assert [json.loads(m["Body"])["id"] for m in dead] == ["p1"]
        events = [e for e in await stack.outputs() if e["thread_id"] == thread]
        final = [e for e in events if e["type"] == "error" and not e["retrying"]]
        assert len(final) == 1 and final[0]["attempts"] == 5 and "p1" in final[0]["message"]
        assert [e["text"] for e in of_type(events, "text")] == ["ok"]


@pytest.mark.parametrize(
    ("error", "rejected"),
    [
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), True),
        (RecursionError("maximum recursion depth exceeded"), True),
        (ProviderError("the request was refused", retryable=False), True),
        (RuntimeError("something flaky"), False),
        (ProviderError("overloaded", retryable=True), False),
    ],
    ids=["unicode", "recursion", "provider-refused", "unknown", "provider-overloaded"],
)
async def test_the_worker_classifies_every_failure_through_the_error_tree(
    error: BaseException, rejected: bool
) -> None:
    """One rule (``errors.classify``): what only bad input raises is dead-lettered on its first attempt,
    with a final error event; anything else fails the record for a retry and says so."""
    async with aws_stack() as stack:
        thread = tid("classify")
        stack.runtime.system.conversation = FailsOnMessage(stack.runtime.system.conversation, "x1", error)
        await stack.send_user(thread, "this one fails", "x1")
        await stack.send_user(thread, "this one is fine", "x2")
        url = stack.resources.input_queue_url
        event = await stack.receive_event(url)  # one invocation, on the records' first attempt
        result = await stack.runtime.handle_sqs_batch(event)
        await stack.ack(url, event, result)
        failed = [f["itemIdentifier"] for f in result.get("batchItemFailures", [])]
        assert len(failed) == (0 if rejected else 2)
        events = [e for e in await stack.outputs() if e["type"] == "error"]
        assert len(events) == 1 and events[0]["retrying"] is (not rejected), events
        dead = await stack.receive(stack.resources.input_dlq_url)
        assert [json.loads(m["Body"])["id"] for m in dead] == (["x1"] if rejected else [])
        if rejected:
            assert await stack.texts(thread) == ["this one is fine", "ok"]


async def test_a_5mb_tool_result_round_trips_through_the_claim_check() -> None:
    async with aws_stack() as stack:
        thread = tid()
        await stack.send_user(thread, "something big please", "m1")
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts[0] == "something big please"
        assert texts[1] == 'big_result({"size": 5000000})'
        assert texts[2] == "x" * 5_000_000
        assert texts[3:] == ["Got a big result."]
        tool_results = [
            r
            for url, event, _ in stack.handled
            if url == stack.input_url
            for r in event["Records"]
            if "stepagent_claim_check" in r["body"]
        ]
        assert len(tool_results) == 1 and len(tool_results[0]["body"]) < 1000


class BarrierProvider:
    """The scripted model, except that the first ``parties`` streams wait until all of them started:
    both workers have loaded the same head before either commits."""

    def __init__(self, barrier: asyncio.Barrier) -> None:
        self.inner = ScriptedProvider(SCRIPT)
        self.barrier = barrier
        self.calls = 0

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.calls == 1:
            await asyncio.wait_for(self.barrier.wait(), 10)
        async for event in self.inner.stream(request):
            yield event


class SerializedCommits:
    """Wraps a conversation store so commits from several runtimes never overlap in time. DynamoDB
    transactions are isolated; moto's are not when two arrive at once (a failed one restores a copy of the
    table taken before the other committed), so the test serialises them as DynamoDB would."""

    def __init__(self, inner: Any, lock: asyncio.Lock) -> None:
        self.inner, self.lock = inner, lock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, thread_id: str, commit: Any) -> Any:
        async with self.lock:
            return await self.inner.commit(thread_id, commit)


async def test_a_second_concurrent_worker_loses_its_write_and_nothing_is_lost() -> None:
    barrier, lock = asyncio.Barrier(2), asyncio.Lock()
    async with aws_stack(provider=BarrierProvider(barrier)) as stack:
        thread = tid()
        await stack.send_user(thread, "hello", "m1")
        event = await _batch(stack, 1)
        second = BarrierProvider(barrier)
        other = await type(stack.runtime).create(stack.settings, provider=second)
        for runtime in (stack.runtime, other):
            runtime.system.conversation = SerializedCommits(runtime.system.conversation, lock)
        try:
            results = await asyncio.gather(
                stack.runtime.handle_sqs_batch(event), other.handle_sqs_batch(event)
            )
        finally:
            await other.aclose()
        assert [failed_ids(r) for r in results] == [[], []]
        assert second.calls == 1  # both workers reached the model on the same loaded head
        conflicts = [rt.metrics.counts.get("WriteConflicts", 0) for rt in (stack.runtime, other)]  # type: ignore[attr-defined]
        assert sorted(conflicts) == [0, 1]  # exactly one lost the conditional write, then re-ran
        assert await stack.texts(thread) == ["hello", "ok"]
        info = await stack.runtime.conversation.get_thread(thread)
        assert info is not None and info.version == 1  # one commit: the loser's was refused, not merged
        assert [e["type"] for e in await stack.outputs()] == ["text", "turn_complete"]


async def test_output_event_ids_are_stable_when_a_step_is_re_run() -> None:
    thread = tid()
    async with aws_stack() as stack:
        publisher = stack.runtime.worker.publisher
        real_publish = publisher.publish
        calls = 0

        async def publish_fails_once(thread_id: str, events: Any, **options: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise QueueError("injected output failure after the commit")
            await real_publish(thread_id, events, **options)

        publisher.publish = publish_fails_once  # type: ignore[method-assign]
        await stack.send_user(thread, "what is the weather?", "m1")
        await stack.pump()
        first = await stack.outputs()
    async with aws_stack() as clean:
        await clean.send_user(thread, "what is the weather?", "m1")
        await clean.pump()
        second = await clean.outputs()
    texts = [e for e in first if e["type"] != "error"]
    assert [e["event_id"] for e in texts] == [e["event_id"] for e in second]
    assert [e["type"] for e in texts] == ["text", "tool_call", "tool_result", "text", "turn_complete"]
    assert texts[0]["event_id"] == event_id(thread, "2", "text")


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


async def test_deterministic_bad_input_is_rejected_at_the_boundary_not_retried() -> None:
    """Deep nesting, a lone surrogate, a noncharacter, NaN, an id too long for a DynamoDB key: each is
    copied to the DLQ with the reason and announced (``retrying: false``); the thread's next message runs."""
    bad = {
        "deep-metadata": '{"content":{"type":"text","text":"hi"},"group_id":"%s","metadata":'
        + '{"a":' * 40_000
        + "1"
        + "}" * 40_000
        + "}",
        "deep-content": '{"content":{"type":"text","text":"hi","x":' + _deep(40_000) + '},"group_id":"%s"}',
        "shallow-but-too-deep": '{"content":{"type":"text","text":"hi"},"group_id":"%s","metadata":'
        + _deep(70)
        + "}",
        "surrogate": '{"content":{"type":"text","text":"bad \\ud800 text"},"group_id":"%s"}',
        "noncharacter": '{"content":{"type":"text","text":"bad \\uffff"},"group_id":"%s"}',
        "nan": '{"content":{"type":"text","text":"hi"},"group_id":"%s","metadata":{"x":NaN}}',
        "long-id": '{"content":{"type":"text","text":"hi"},"group_id":"%s","id":"' + "i" * 2000 + '"}',
    }
    reasons = {
        "deep-metadata": "nested deeper",
        "deep-content": "nested deeper",
        "shallow-but-too-deep": "nested deeper than 64",
        "surrogate": "lone surrogate (U+D800)",
        "noncharacter": "noncharacter (U+FFFF)",
        "nan": "NaN",
        "long-id": "longer than 512 bytes",
    }
    async with aws_stack() as stack:
        threads = {name: tid(name) for name in bad}
        for name, body in bad.items():
            await stack.send_raw(body % threads[name], threads[name], f"raw-{name}")
        await stack.send_user(threads["surrogate"], "after the bad one", "next")
        event = await _batch(stack, len(bad) + 1)
        result = await stack.runtime.handle_sqs_batch(event)
        assert failed_ids(result) == []
        assert await stack.texts(threads["surrogate"]) == ["after the bad one", "ok"]
        for name in bad:
            if name != "surrogate":
                assert await stack.texts(threads[name]) == [], name
        dlq = [m for _ in range(3) for m in await stack.receive(stack.resources.input_dlq_url)]
        by_group = {
            m["MessageAttributes"]["stepagent_message_group_id"]["StringValue"]: m["MessageAttributes"][
                "stepagent_error"
            ]["StringValue"]
            for m in dlq
        }
        assert sorted(by_group) == sorted(threads.values())
        for name, reason in reasons.items():
            assert reason in by_group[threads[name]], (name, by_group[threads[name]])
        events = await stack.outputs()
        for name, thread in threads.items():
            [error] = of_type(events, "error", thread)
            assert error["retrying"] is False, name


class FixedToolCallIds:
    """The scripted model, except that every tool call it makes carries the id ``tool_call_id`` (an
    OpenAI-compatible server that repeats ids, or ``""`` for one that omits them)."""

    def __init__(self, tool_call_id: str) -> None:
        self.inner = ScriptedProvider(SCRIPT)
        self.tool_call_id = tool_call_id

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        async for event in self.inner.stream(request):
            if isinstance(event, ToolCallComplete):
                event = ToolCallComplete(event.call.model_copy(update={"id": self.tool_call_id}))
            yield event


@pytest.mark.parametrize("reused", ["call_1", ""], ids=["repeated-id", "empty-id"])
async def test_a_model_that_reuses_or_omits_tool_call_ids_loses_no_work(reused: str) -> None:
    async with aws_stack(provider=FixedToolCallIds(reused)) as stack:
        thread = tid()
        for n in (1, 2):
            await stack.send_user(thread, f"what is the weather? ({n})", f"w{n}")
            await stack.pump()
        texts = await stack.texts(thread)
        assert texts.count("It is sunny in Paris.") == 2, texts  # the second result was not absorbed
        assert texts[-1] == "It is sunny in Paris."
        calls = [e for e in await stack.outputs() if e["type"] == "tool_call"]
        ids = [c["tool_call_id"] for c in calls]
        assert len(set(ids)) == 2 and all(ids)


@pytest.mark.parametrize("reused", ["call_1", ""], ids=["repeated-id", "empty-id"])
async def test_two_spawns_with_one_provider_tool_call_id_are_two_children(reused: str) -> None:
    async with aws_stack(provider=FixedToolCallIds(reused)) as stack:
        parent = tid("parent")
        for n in (1, 2):
            await stack.send_user(parent, f"please delegate ({n})", f"d{n}")
            await stack.pump()
        children = await stack.runtime.conversation.children(parent)
        assert len(children) == 2 and len({c.spawn_tool_call_id for c in children}) == 2
        assert (await stack.texts(parent)).count("Got the report.") == 2


async def test_the_answer_after_a_rewind_gets_a_new_event_id_and_reaches_the_output_queue() -> None:
    """After ``stepagent rewind``, new rows take the dropped rows' orders. Their events must not reuse the
    dropped rows' ids: consumers dedup by ``event_id``, and so does the output FIFO queue (5 minutes)."""
    from stepagent.lifecycle.rewind import rewind_thread

    again = {"when": "again", "on": ["user"], "reply": [{"text": "Welcome back."}]}
    async with aws_stack(script={**SCRIPT, "rules": [again, *SCRIPT["rules"]]}) as stack:
        thread = tid()
        for n in (1, 2):
            await stack.send_user(thread, f"hello {n}", f"m{n}")
            await stack.pump()
        dropped = [e for e in await stack.outputs() if e["type"] == "text"]
        assert [e["event_id"] for e in dropped] == [
            event_id(thread, "2", "text"),
            event_id(thread, "4", "text"),
        ]
        result = await rewind_thread(stack.runtime.conversation, stack.runtime.state, thread, 2)
        assert result.dropped_rows == 2
        await stack.send_user(thread, "hello again", "m3")
        await stack.pump()
        assert await stack.texts(thread) == ["hello 1", "ok", "hello again", "Welcome back."]
        [answer] = [e for e in await stack.outputs() if e["type"] == "text"]  # delivered, with a new id
        assert answer["text"] == "Welcome back." and answer["event_id"] != dropped[1]["event_id"]
        # Stable across redelivery: re-publishing the same rows gives the same id.
        rows = [row async for row in stack.runtime.conversation.load_rows(thread)]
        from stepagent.outputs.build import row_events

        assert row_events(thread, rows[3:])[0]["event_id"] == answer["event_id"]
        assert row_events(thread, rows[1:2])[0]["event_id"] == dropped[0]["event_id"]  # kept rows keep theirs
