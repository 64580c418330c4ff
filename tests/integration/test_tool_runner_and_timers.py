"""The tool runner, the timers (delay queue, EventBridge Scheduler) and the Lambda entry points, on the
moto server."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stepagent.aws import lambda_entry
from stepagent.aws.runtime import WORKER
from stepagent.aws.timers import SCHEDULE_PREFIX, deliver_due_schedules, relay_body, schedule_name
from stepagent.aws.tool_runner import ToolCallMessage
from stepagent.messages import InputMessage, ToolResult, parse_input_message
from tests.conftest import aws_client, unique_name
from tests.integration.aws_helpers import (
    WEATHER_CALLS,
    Stack,
    aws_stack,
    create_resources,
    delete_resources,
    failed_ids,
    lambda_record,
)


def tid(prefix: str = "conv") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def input_messages(stack: Stack) -> list[InputMessage]:
    """Drain the input queue without processing (bodies parsed)."""
    out = []
    while messages := await stack.receive(stack.input_url):
        for message in messages:
            out.append(parse_input_message(await stack.runtime.queues.resolve(message["Body"])))
            await stack.sqs.delete_message(QueueUrl=stack.input_url, ReceiptHandle=message["ReceiptHandle"])
    return out


# ----------------------------------------------------------------------------------------------------------
# Tool runner


@pytest.mark.asyncio
async def test_a_redelivered_tool_message_reruns_the_function_but_the_thread_keeps_one_result() -> None:
    async with aws_stack() as stack:
        thread = tid()
        await stack.send_user(thread, "what is the weather?", "m1")
        event = await stack.receive_event(stack.input_url)
        await stack.ack(stack.input_url, event, await stack.runtime.handle_sqs_batch(event))
        tool_event = await stack.receive_event(stack.resources.tool_queue_url)
        [record] = tool_event["Records"]
        call = ToolCallMessage.parse(record["body"])
        assert (call.thread_id, call.tool_name, call.arguments) == (thread, "get_weather", {"city": "Paris"})
        assert call.thread_stack == [thread] and call.tool_call_id.startswith("call_")
        before = len(WEATHER_CALLS)
        for _ in range(2):  # the same tool message delivered twice
            result = await stack.runtime.handle_tool_batch(tool_event)
            assert failed_ids(result) == []
        assert len(WEATHER_CALLS) == before + 2
        await stack.ack(stack.resources.tool_queue_url, tool_event, {"batchItemFailures": []})
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts.count("Sunny in Paris") == 1
        assert texts[-1] == "It is sunny in Paris."


@pytest.mark.asyncio
async def test_an_unknown_tool_gets_an_error_result_and_a_bad_tool_message_is_reported() -> None:
    async with aws_stack() as stack:
        thread = tid()
        call = ToolCallMessage(thread, "call-1", "prov-1", "no_such_tool", {}, [thread])
        good = {"messageId": "t1", "body": call.to_json()}
        bad = {"messageId": "t2", "body": "{not json"}
        result = await stack.runtime.handle_tool_batch({"Records": [good, bad]})
        assert failed_ids(result) == ["t2"]
        [message] = await input_messages(stack)
        assert message.group_id == thread and message.id == "call-1"
        assert isinstance(message.content, ToolResult)
        assert message.content.call_id == "prov-1"
        assert message.content.joined_text().startswith("Error: no function tool named 'no_such_tool'")


@pytest.mark.asyncio
async def test_a_slow_tool_is_cut_off_by_the_remaining_lambda_time() -> None:
    async with aws_stack() as stack:
        thread = tid()
        call = ToolCallMessage(thread, "call-9", None, "get_weather", {"city": "Oslo"}, [thread])

        async def slow(**_: Any) -> str:
            await asyncio.sleep(5)
            return "late"

        tool = stack.runtime.function_tools["get_weather"]
        original = tool._untyped
        tool._untyped, tool._is_async = slow, True
        try:
            result = await stack.runtime.handle_tool_batch(
                {"Records": [{"messageId": "t1", "body": call.to_json()}]}, remaining_ms=lambda: 10_050
            )
        finally:
            tool._untyped, tool._is_async = original, False
        assert failed_ids(result) == []
        [message] = await input_messages(stack)
        assert isinstance(message.content, ToolResult)
        assert "did not finish within the tool runner's time limit" in message.content.joined_text()


# ----------------------------------------------------------------------------------------------------------
# Timers


@pytest.mark.asyncio
async def test_a_short_timer_goes_through_the_delay_queue_and_the_relay() -> None:
    async with aws_stack() as stack:
        thread = tid()
        await stack.send_user(thread, "take a nap", "m1")
        await stack.pump()
        [_, call, *_] = await stack.texts(thread)
        assert call == 'sleep({"seconds": 1})'
        found = await stack.sqs.get_queue_attributes(
            QueueUrl=stack.resources.delay_queue_url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
        )
        assert found["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
        await stack.wait_visible(stack.resources.delay_queue_url)
        [message] = await stack.receive(stack.resources.delay_queue_url)
        body = json.loads(message["Body"])
        assert set(body) == {"message", "group_id", "dedup_id"}
        assert body["group_id"] == thread and body["dedup_id"].startswith("call_")
        wake = parse_input_message(body["message"])
        assert wake.id == body["dedup_id"] and isinstance(wake.content, ToolResult)
        assert wake.content.joined_text() == "Slept for 1 seconds"
        event = {"Records": [lambda_record(message)]}
        for _ in range(2):  # a twice-delivered wake-up is absorbed
            assert failed_ids(await stack.runtime.handle_delay_batch(event)) == []
        await stack.ack(stack.resources.delay_queue_url, event, {"batchItemFailures": []})
        await stack.pump()
        texts = await stack.texts(thread)
        assert texts[-2:] == ["Slept for 1 seconds", "Awake."]


@pytest.mark.asyncio
async def test_a_long_timer_creates_one_schedule_that_delivers_and_deletes_itself() -> None:
    async with aws_stack() as stack:
        thread = tid()
        await stack.send_user(thread, "hibernate now", "m1")
        await stack.pump()
        call_id = json.loads((await stack.history(thread))[1][2])["call"]["id"]
        name = schedule_name(thread, call_id)
        schedule = await stack.scheduler.get_schedule(Name=name)
        target = schedule["Target"]
        arn = (await stack.sqs.get_queue_attributes(QueueUrl=stack.input_url, AttributeNames=["QueueArn"]))[
            "Attributes"
        ]["QueueArn"]
        assert target["Arn"] == arn
        assert target["SqsParameters"] == {"MessageGroupId": thread}
        assert target["RoleArn"] == stack.settings.scheduler_role_arn
        assert target["DeadLetterConfig"] == {"Arn": stack.resources.scheduler_dlq_arn}
        assert schedule["ActionAfterCompletion"] == "DELETE"
        assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
        assert schedule["ScheduleExpression"].startswith("at(")
        wake = parse_input_message(target["Input"])
        assert wake.group_id == thread and wake.id == call_id
        assert isinstance(wake.content, ToolResult) and wake.content.joined_text() == "Slept for 7200 seconds"
        # A re-dispatch finds the same schedule: success, nothing new.
        await stack.runtime.system.config.timers.schedule(wake, call_id, 7200)  # type: ignore[union-attr]
        now = datetime.now(UTC)
        assert await deliver_due_schedules(stack.scheduler, stack.sqs, now) == 0
        assert await stack.runtime.deliver_due_schedules(now + timedelta(hours=2, seconds=2)) == 1
        left = await stack.scheduler.list_schedules(NamePrefix=SCHEDULE_PREFIX)
        assert name not in [s["Name"] for s in left["Schedules"]]
        await stack.pump()
        assert (await stack.texts(thread))[-2:] == ["Slept for 7200 seconds", "Awake."]


@pytest.mark.asyncio
async def test_the_relay_reports_a_bad_envelope_and_forwards_the_rest() -> None:
    async with aws_stack() as stack:
        thread = tid()
        wake = InputMessage.tool_result(thread, ToolResult.text("call-x", "Slept for 3 seconds"))
        good = {"messageId": "d1", "body": relay_body(wake, "call-x")}
        mismatch = json.loads(relay_body(wake, "call-y")) | {"group_id": "elsewhere"}
        records = [
            good,
            {"messageId": "d2", "body": "nope"},
            {"messageId": "d3", "body": json.dumps(mismatch)},
        ]
        result = await stack.runtime.handle_delay_batch({"Records": records})
        assert failed_ids(result) == ["d2", "d3"]
        [message] = await input_messages(stack)
        assert message.id == "call-x" and message.group_id == thread


# ----------------------------------------------------------------------------------------------------------
# Lambda entry points (synchronous, their own persistent loop)


class FakeContext:
    aws_request_id = "req-1"
    function_name = "stepagent-worker"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:stepagent-worker"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def test_lambda_handlers_build_once_and_reuse_one_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from handlers import timer_relay, tool_runner, worker

    prefix = unique_name("sa")

    async def setup() -> tuple[Any, Any]:
        async with aws_client("sqs") as sqs, aws_client("s3") as s3, aws_client("dynamodb") as dynamodb:
            return await create_resources(sqs, s3, dynamodb, prefix)

    resources, settings = asyncio.run(setup())
    env = {
        "STEPAGENT_CONVERSATION_TABLE": str(settings.conversation_table),
        "STEPAGENT_STATE_TABLE": str(settings.state_table),
        "STEPAGENT_MODEL": str(settings.model),
        "STEPAGENT_TOOLS": str(settings.tools),
        "AWS_ENDPOINT_URL": str(settings.endpoint_url),
        **resources.env(),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    thread = tid()

    async def send_and_receive(url: str, body: str | None = None) -> dict[str, Any]:
        async with aws_client("sqs") as sqs:
            if body is not None:
                await sqs.send_message(
                    QueueUrl=url,
                    MessageBody=body,
                    MessageGroupId=thread,
                    MessageDeduplicationId=str(uuid.uuid4()),
                )
            response = await sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
            )
            for message in response.get("Messages", []):
                await sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            return {"Records": [lambda_record(m) for m in response.get("Messages", [])]}

    try:
        lambda_entry.reset()
        weather = InputMessage.user_text(thread, "what is the weather?", id="m1").to_json()
        event = asyncio.run(send_and_receive(resources.input_queue_url, weather))
        assert worker.handler(event, FakeContext()) == {"batchItemFailures": []}
        loop, built = lambda_entry.event_loop(), lambda_entry.runtime(WORKER)
        tool_event = asyncio.run(send_and_receive(resources.tool_queue_url))
        assert tool_runner.handler(tool_event, FakeContext()) == {"batchItemFailures": []}
        assert timer_relay.handler({"Records": []}, FakeContext()) == {"batchItemFailures": []}
        result_event = asyncio.run(send_and_receive(resources.input_queue_url))
        assert len(result_event["Records"]) == 1
        assert worker.handler(result_event, FakeContext()) == {"batchItemFailures": []}
        assert lambda_entry.event_loop() is loop and lambda_entry.runtime(WORKER) is built
        texts = lambda_entry.event_loop().run_until_complete(_texts(built, thread))
        assert texts[-1] == "It is sunny in Paris."
    finally:
        lambda_entry.reset()

        async def cleanup() -> None:
            async with aws_client("sqs") as sqs, aws_client("dynamodb") as dynamodb:
                await delete_resources(sqs, dynamodb, resources, settings)

        asyncio.run(cleanup())


async def _texts(runtime: Any, thread: str) -> list[str]:
    from tests.integration.aws_helpers import item_text

    return [item_text(row.item) async for row in runtime.conversation.load_rows(thread)]


def test_a_missing_setting_fails_the_cold_start_with_one_clear_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("STEPAGENT_"):
            monkeypatch.delenv(name)
    try:
        lambda_entry.reset()
        with pytest.raises(Exception, match=r"STEPAGENT_CONVERSATION_TABLE.*STEPAGENT_INPUT_QUEUE_URL"):
            lambda_entry.worker_handler({"Records": []}, FakeContext())
        assert WORKER not in lambda_entry._runtimes  # not cached: the next invocation retries
    finally:
        lambda_entry.reset()
