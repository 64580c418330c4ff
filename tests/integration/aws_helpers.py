"""Helpers for the AWS runtime tests: a fresh stack (tables, queues, bucket) per test on the shared moto
server, a runtime built from real settings, and a test poller that behaves like Lambda's SQS event source
(Lambda-shaped records, only successes deleted, failures made visible again at once).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from stepagent.aws.queue_resources import LOCAL_SCHEDULER_ROLE_ARN, QueueResources, ensure_queues_and_bucket
from stepagent.aws.resources import ensure_tables
from stepagent.aws.runtime import AwsRuntime
from stepagent.aws.settings import Settings
from stepagent.blobs import ContentBlobs
from stepagent.history_items import (
    AssistantText,
    EventItem,
    HistoryItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    encode_item,
)
from stepagent.messages import InputMessage
from stepagent.senders.claim_check import unwrap_body
from stepagent.tools.functions import tool
from tests.conftest import REGION, aws_client, moto_endpoint, unique_name
from tests.polling import eventually

# ----------------------------------------------------------------------------------------------------------
# The agent under test: a scripted model and two function tools (loaded through STEPAGENT_TOOLS).

WEATHER_CALLS: list[str] = []


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    WEATHER_CALLS.append(city)
    return f"Sunny in {city}"


@tool
def big_result(size: int) -> str:
    """A result of ``size`` characters."""
    return "x" * size


TOOLS = [get_weather, big_result]
TOOLS_SPEC = "tests.integration.aws_helpers:TOOLS"

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "weather",
            "on": ["user"],
            "reply": [
                {"text": "Let me check."},
                {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {"when": "^Sunny in Paris", "on": ["tool_result"], "reply": [{"text": "It is sunny in Paris."}]},
        {
            "when": "big",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "big_result", "arguments": {"size": 5_000_000}}}],
        },
        {"when": "^x{1000}", "on": ["tool_result"], "reply": [{"text": "Got a big result."}]},
        {
            "when": "nap",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 1}}}],
        },
        {
            "when": "hibernate",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 7200}}}],
        },
        {"when": "^Slept for", "on": ["tool_result"], "reply": [{"text": "Awake."}]},
        {
            "when": "delegate",
            "on": ["user"],
            "reply": [
                {"text": "Delegating."},
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "count", "child_of": "{thread_stack}"},
                    }
                },
            ],
        },
        {"when": "successfully spawned", "reply": [{"text": "Spawned a child."}]},
        {
            "when": "You are now INSIDE",
            "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "three"}}}],
        },
        {
            "when": "Report sent to parent",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {"thread_id": "{thread_id}", "report_to_parent": "done"},
                    }
                }
            ],
        },
        {"when": "Report from child thread: three", "reply": [{"text": "Got the report."}]},
        {"when": "has shut down", "reply": [{"text": "Child finished."}]},
    ],
    "default": [{"text": "ok"}],
}


def item_text(item: HistoryItem) -> str:
    match item:
        case UserItem():
            return item.text or ""
        case AssistantText(text=text):
            return text
        case ToolCallItem(call=call):
            return f"{call.name}({json.dumps(call.arguments, sort_keys=True)})"
        case ToolResultItem(result=result) | EventItem(result=result):
            return result.joined_text()
    return ""


def script_file(script: dict[str, Any]) -> str:
    handle, path = tempfile.mkstemp(prefix="stepagent-script-", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump(script, out)
    return path


# ----------------------------------------------------------------------------------------------------------
# Lambda-shaped records


def lambda_record(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": {
            name: {"stringValue": value.get("StringValue"), "dataType": value.get("DataType", "String")}
            for name, value in message.get("MessageAttributes", {}).items()
        },
        "eventSource": "aws:sqs",
    }


def failed_ids(result: dict[str, Any]) -> list[str]:
    return [f["itemIdentifier"] for f in result["batchItemFailures"]]


Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class Stack:
    """A fresh set of resources, the runtime under test, and test-side clients."""

    settings: Settings
    resources: QueueResources
    runtime: AwsRuntime
    sqs: Any
    s3: Any
    dynamodb: Any
    scheduler: Any
    handled: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    @property
    def input_url(self) -> str:
        return self.resources.input_queue_url

    async def send_user(self, thread: str, text: str, message_id: str) -> None:
        await self.runtime.sender.send(InputMessage.user_text(thread, text, id=message_id), message_id)

    async def send_raw(self, body: str, group_id: str, dedup_id: str) -> None:
        await self.sqs.send_message(
            QueueUrl=self.input_url,
            MessageBody=body,
            MessageGroupId=group_id,
            MessageDeduplicationId=dedup_id,
        )

    async def receive(self, url: str, limit: int = 10) -> list[dict[str, Any]]:
        response = await self.sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=limit,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
            WaitTimeSeconds=0,
        )
        return list(response.get("Messages", []))

    async def receive_event(self, url: str, limit: int = 10) -> dict[str, Any]:
        return {"Records": [lambda_record(m) for m in await self.receive(url, limit)]}

    async def ack(self, url: str, event: dict[str, Any], result: dict[str, Any]) -> None:
        """Delete the successes; make the failures visible again at once (Lambda would wait for the
        visibility timeout). moto mis-orders FIFO groups on queues with visibility 0, hence this."""
        failures = set(failed_ids(result))
        for record in event["Records"]:
            if record["messageId"] in failures:
                await self.sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
                )
            else:
                await self.sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])

    def handlers(self) -> list[tuple[str, Handler]]:
        return [
            (self.resources.input_queue_url, self.runtime.handle_sqs_batch),
            (self.resources.tool_queue_url, self.runtime.handle_tool_batch),
            (self.resources.delay_queue_url, self.runtime.handle_delay_batch),
        ]

    async def pump(self, *, rounds: int = 60, twice: bool = False) -> None:
        """Feed every queue to its handler until all are empty (like the event sources). ``twice``
        hands every batch to the handler two times before acknowledging it (a duplicate invocation)."""
        for _ in range(rounds):
            busy = False
            for url, handler in self.handlers():
                event = await self.receive_event(url)
                if not event["Records"]:
                    continue
                busy = True
                result = await handler(event)
                if twice:
                    result = await handler(event)
                self.handled.append((url, event, result))
                await self.ack(url, event, result)
            if not busy:
                return
        raise AssertionError(f"the queues did not drain within {rounds} rounds")

    async def outputs(self) -> list[dict[str, Any]]:
        """Everything on the output queue (drained), bodies resolved."""
        out: list[dict[str, Any]] = []
        # A reader of its own, as an outside consumer of the queue: the runtime's cache does not help it.
        reader = ContentBlobs(self.s3, self.resources.bucket)
        while True:
            messages = await self.receive(self.resources.output_queue_url)
            if not messages:
                return out
            for message in messages:
                body = await unwrap_body(message["Body"], reader)
                out.append(json.loads(body))
                await self.sqs.delete_message(
                    QueueUrl=self.resources.output_queue_url, ReceiptHandle=message["ReceiptHandle"]
                )

    async def history(self, thread: str) -> list[tuple[int, str, str]]:
        """(order, message id, encoded item) of every committed row of ``thread``."""
        return [
            (row.order, row.message_id, encode_item(row.item))
            async for row in self.runtime.conversation.load_rows(thread)
        ]

    async def texts(self, thread: str) -> list[str]:
        """The text of each committed row (a tool call as ``name(args)``)."""
        return [item_text(row.item) async for row in self.runtime.conversation.load_rows(thread)]

    async def wait_visible(self, url: str, within: float = 5.0) -> None:
        """Poll (tiny sleeps) until ``url`` has a visible message."""

        async def visible() -> int:
            found = await self.sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
            )
            return int(found["Attributes"]["ApproximateNumberOfMessages"])

        await eventually(visible, f"a visible message on {url}", within=within, interval=0.05)


async def create_resources(sqs: Any, s3: Any, dynamodb: Any, prefix: str) -> tuple[QueueResources, Settings]:
    """Tables, queues and bucket (as defined for production), plus the settings naming them."""
    resources = await ensure_queues_and_bucket(sqs, s3, prefix=prefix, region=REGION)
    conversation_table, state_table = f"{prefix}-conversation", f"{prefix}-state"
    await ensure_tables(dynamodb, conversation_table, state_table)
    env = {
        **resources.env(),
        "STEPAGENT_CONVERSATION_TABLE": conversation_table,
        "STEPAGENT_STATE_TABLE": state_table,
        "STEPAGENT_MODEL": f"scripted:{script_file(SCRIPT)}",
        "STEPAGENT_TOOLS": TOOLS_SPEC,
        "AWS_ENDPOINT_URL": moto_endpoint(),
        "AWS_REGION": REGION,
    }
    return resources, Settings.from_env(env)


async def delete_resources(sqs: Any, dynamodb: Any, resources: QueueResources, settings: Settings) -> None:
    for url in resources.urls.values():
        await sqs.delete_queue(QueueUrl=url)
    for table in (settings.conversation_table, settings.state_table):
        await dynamodb.delete_table(TableName=table)


@asynccontextmanager
async def aws_stack(
    *, script: dict[str, Any] | None = None, env: dict[str, str] | None = None, **runtime_options: Any
) -> AsyncIterator[Stack]:
    """A fresh stack and a runtime built from its settings (``script`` replaces the default script, ``env``
    adds settings, e.g. the agent settings)."""
    async with AsyncExitStack() as stack:
        sqs = await stack.enter_async_context(aws_client("sqs"))
        s3 = await stack.enter_async_context(aws_client("s3"))
        dynamodb = await stack.enter_async_context(aws_client("dynamodb"))
        scheduler = await stack.enter_async_context(aws_client("scheduler"))
        resources, settings = await create_resources(sqs, s3, dynamodb, unique_name("sa"))
        if script is not None:
            settings = Settings.from_env(
                {**_env_of(settings), "STEPAGENT_MODEL": f"scripted:{script_file(script)}"}
            )
        if env:
            settings = Settings.from_env({**_env_of(settings), **env})
        runtime = await AwsRuntime.create(settings, **runtime_options)
        stack.push_async_callback(delete_resources, sqs, dynamodb, resources, settings)
        stack.push_async_callback(runtime.aclose)
        yield Stack(settings, resources, runtime, sqs, s3, dynamodb, scheduler)


def _env_of(settings: Settings) -> dict[str, str]:
    names = {
        "conversation_table": "STEPAGENT_CONVERSATION_TABLE",
        "state_table": "STEPAGENT_STATE_TABLE",
        "input_queue_url": "STEPAGENT_INPUT_QUEUE_URL",
        "output_queue_url": "STEPAGENT_OUTPUT_QUEUE_URL",
        "delay_queue_url": "STEPAGENT_DELAY_QUEUE_URL",
        "tool_queue_url": "STEPAGENT_TOOL_QUEUE_URL",
        "blob_bucket": "STEPAGENT_BLOB_BUCKET",
        "model": "STEPAGENT_MODEL",
        "tools": "STEPAGENT_TOOLS",
        "scheduler_role_arn": "STEPAGENT_SCHEDULER_ROLE_ARN",
        "scheduler_dlq_arn": "STEPAGENT_SCHEDULER_DLQ_ARN",
        "endpoint_url": "AWS_ENDPOINT_URL",
        "region": "AWS_REGION",
    }
    values = {env: str(getattr(settings, attr)) for attr, env in names.items() if getattr(settings, attr)}
    return {**values, **settings.agent_settings}


__all__ = [
    "LOCAL_SCHEDULER_ROLE_ARN",
    "SCRIPT",
    "TOOLS",
    "WEATHER_CALLS",
    "Stack",
    "aws_stack",
    "create_resources",
    "delete_resources",
    "failed_ids",
    "lambda_record",
]


class FailsOnMessage:
    """Wraps a conversation store: every commit that holds message ``message_id`` raises ``error``;
    everything else passes through. ``failures`` counts the refused commits."""

    def __init__(self, inner: Any, message_id: str, error: BaseException) -> None:
        self.inner, self.message_id, self.error, self.failures = inner, message_id, error, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, thread_id: str, commit: Any) -> Any:
        if self.message_id in commit.processed_message_ids:
            self.failures += 1
            raise self.error
        return await self.inner.commit(thread_id, commit)
