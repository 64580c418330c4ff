"""``dlq redrive`` and :class:`stepagent.client.Client` under transient AWS failures (throttling, 5xx), on
moto with the faults injected in front of the real clients (tests/faults.py): each call that failed is
tried again through the one backoff rule, nothing is lost and nothing arrives twice. And the tool runner's
retry decision, which is ``errors.classify``'s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from stepagent.aws.dlq import redrive
from stepagent.aws.settings import Settings
from stepagent.aws.tool_runner import ToolCallMessage, handle_tool_batch
from stepagent.backoff import Backoff
from stepagent.client import Client
from stepagent.errors import QueueError, ToolError
from stepagent.messages import InputMessage
from stepagent.senders.sqs import SqsQueues, SqsSender
from tests.conftest import DynamoEnv, aws_client, moto_endpoint, unique_name
from tests.faults import Faults


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # Same rule, shorter waits: the point is which calls are tried again, not how long the pauses are.
    monkeypatch.setattr("stepagent.aws.transient.TRANSIENT_BACKOFF", Backoff(attempts=5, base=0.01))


@pytest.fixture
async def sqs() -> AsyncIterator[Any]:
    async with aws_client("sqs") as client:
        yield client


async def fifo_queue(sqs: Any) -> str:
    name = unique_name("retry") + ".fifo"
    created = await sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})
    return str(created["QueueUrl"])


async def drain(sqs: Any, url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        got = await sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], WaitTimeSeconds=0
        )
        if not got.get("Messages"):
            return found
        for message in got["Messages"]:
            found.append(message)
            await sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


async def test_a_redrive_rides_out_throttled_sends_and_deletes(sqs: Any) -> None:
    source, dlq = await fifo_queue(sqs), await fifo_queue(sqs)
    for n in range(3):
        await sqs.send_message(
            QueueUrl=dlq,
            MessageBody=f'{{"n": {n}}}',
            MessageGroupId="conv-1",
            MessageDeduplicationId=f"m-{n}",
        )
    faults = Faults(
        {"ReceiveMessage": 1, "SendMessage": 2, "DeleteMessage": 1}, code="ServiceUnavailable", status=503
    ).attach(sqs)
    moved = await redrive(sqs, dlq, source, "input")
    assert faults.injected == 4 and len(moved) == 3
    back = await drain(sqs, source)
    assert [json.loads(m["Body"])["n"] for m in back] == [0, 1, 2]  # each once, in the thread's order
    assert {m["Attributes"]["MessageGroupId"] for m in back} == {"conv-1"}
    assert await drain(sqs, dlq) == []


async def test_a_redrive_under_lasting_throttling_moves_nothing_it_could_not_send(sqs: Any) -> None:
    source, dlq = await fifo_queue(sqs), await fifo_queue(sqs)
    await sqs.send_message(QueueUrl=dlq, MessageBody="{}", MessageGroupId="g", MessageDeduplicationId="m")
    Faults({"SendMessage": 100}).attach(sqs)
    with pytest.raises(Exception, match="ThrottlingException"):
        await redrive(sqs, dlq, source, "input")
    # The letter is still in the DLQ (held until its visibility timeout ends), not lost.
    attributes = await sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["All"])
    counts = attributes["Attributes"]
    assert (
        int(counts["ApproximateNumberOfMessages"]) + int(counts["ApproximateNumberOfMessagesNotVisible"]) == 1
    )


async def test_the_client_sends_and_reads_through_throttling(dynamo: DynamoEnv, sqs: Any) -> None:
    queue = await fifo_queue(sqs)
    settings = Settings.from_env(
        {
            "STEPAGENT_CONVERSATION_TABLE": dynamo.conversation_table,
            "STEPAGENT_STATE_TABLE": dynamo.state_table,
            "STEPAGENT_INPUT_QUEUE_URL": queue,
            "AWS_ENDPOINT_URL": moto_endpoint(),
        }
    )
    # Without the retry, one throttled send is the caller's error.
    bare = SqsSender(sqs, queue)
    Faults({"SendMessage": 1}).attach(sqs)
    with pytest.raises(QueueError, match="ThrottlingException"):
        await bare.send(InputMessage.user_text("conv-x", "hi", id="m-0"), "m-0")

    async with Client(settings) as client:
        # The snapshot before the send reads the tree (GetItem, Query) and the heads (BatchGetItem).
        faults = Faults({"GetItem": 1, "Query": 1, "BatchGetItem": 1, "SendMessage": 2}, status=400)
        faults.attach(client.sender.queues.sqs)
        faults.attach(client.stores[0]._io.client)
        message_id = await client.send("conv-x", "hello")
        assert await client.history("conv-x") == []
        assert faults.injected == 5
    sent = await drain(sqs, queue)
    assert [json.loads(m["Body"])["id"] for m in sent] == [message_id]  # once, despite two failed tries


class Broken:
    """A tool runner entry whose run fails outside the error tree (a bug, a lost connection)."""

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        raise ConnectionResetError("peer reset")


class Refusing:
    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        raise ToolError("the city is unknown")


async def test_the_tool_runner_retries_a_failed_run_alone_and_answers_the_rest(sqs: Any) -> None:
    queue = await fifo_queue(sqs)
    records = [
        {
            "messageId": "t-broken",
            "body": ToolCallMessage("conv-b", "call-b", None, "broken", {}, []).to_json(),
        },
        {
            "messageId": "t-refusing",
            "body": ToolCallMessage("conv-r", "call-r", None, "refusing", {}, []).to_json(),
        },
    ]
    result = await handle_tool_batch(
        {"Records": records},
        {"broken": Broken(), "refusing": Refusing()},
        SqsQueues(sqs),
        SqsSender(sqs, queue),
    )
    # classify: a ConnectionResetError is "retry" (the record goes back), a ToolError is the model's result.
    assert result == {"batchItemFailures": [{"itemIdentifier": "t-broken"}]}
    [answered] = await drain(sqs, queue)
    assert (
        "Error: the city is unknown" in answered["Body"]
        and json.loads(answered["Body"])["group_id"] == "conv-r"
    )
