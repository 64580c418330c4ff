"""`stepagent dlq list|show|redrive` on moto: what failed and why, without consuming it; redrive puts a
message back on its queue in its thread's group and removes it from the DLQ."""

from __future__ import annotations

import json
import uuid

import boto3

from tests.conftest import moto_endpoint
from tests.integration.test_cli import clean_env, stepagent


def test_list_show_and_redrive_dead_letters() -> None:
    endpoint = moto_endpoint()
    prefix = f"dlq-{uuid.uuid4().hex[:8]}"
    created = stepagent("infra", "create", "--endpoint-url", endpoint, "--prefix", prefix, env=clean_env())
    assert created.returncode == 0, created.stderr
    settings = dict(line.split("=", 1) for line in created.stdout.splitlines() if "=" in line)
    env = clean_env(**settings)
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")

    def dlq_of(url: str) -> str:
        policy = json.loads(
            sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"][
                "RedrivePolicy"
            ]
        )
        return sqs.get_queue_url(QueueName=policy["deadLetterTargetArn"].rsplit(":", 1)[1])["QueueUrl"]

    input_dlq, tool_dlq = (
        dlq_of(settings["STEPAGENT_INPUT_QUEUE_URL"]),
        dlq_of(settings["STEPAGENT_TOOL_QUEUE_URL"]),
    )
    bad = sqs.send_message(
        QueueUrl=input_dlq,
        MessageBody='{"content": 42}',
        MessageGroupId="conv-7",
        MessageDeduplicationId="m-1",
        MessageAttributes={
            "stepagent_error": {"DataType": "String", "StringValue": "content: not an object"}
        },
    )["MessageId"]
    tool_body = json.dumps(
        {"v": 1, "thread_id": "conv-8", "tool_call_id": "call_1", "tool_name": "slow", "arguments": {}}
    )
    sqs.send_message(QueueUrl=tool_dlq, MessageBody=tool_body)

    listed = stepagent("dlq", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    letters = {letter["queue"]: letter for letter in json.loads(listed.stdout)}
    assert (
        letters["input"]["thread_id"] == "conv-7" and letters["input"]["reason"] == "content: not an object"
    )
    assert letters["tool"]["thread_id"] == "conv-8" and letters["tool"]["reason"] is None
    again = json.loads(stepagent("dlq", "list", "--json", env=env).stdout)
    assert len(again) == 2, "listing must not consume the messages"

    shown = stepagent("dlq", "show", bad, env=env)
    assert shown.returncode == 0 and '{"content": 42}' in shown.stdout and "conv-7" in shown.stdout

    refused = stepagent("dlq", "redrive", env=env)
    assert refused.returncode == 2 and "--all" in refused.stderr
    moved = stepagent("dlq", "redrive", bad, env=env)
    assert moved.returncode == 0 and "input: redrove 1 message(s)" in moved.stdout, moved.stderr
    back = sqs.receive_message(
        QueueUrl=settings["STEPAGENT_INPUT_QUEUE_URL"], MessageSystemAttributeNames=["All"]
    )["Messages"]
    assert [m["Body"] for m in back] == ['{"content": 42}']
    assert back[0]["Attributes"]["MessageGroupId"] == "conv-7"

    moved_all = stepagent("dlq", "redrive", "--all", "--queue", "tool", env=env)
    assert moved_all.returncode == 0 and "tool: redrove 1 message(s)" in moved_all.stdout
    assert stepagent("dlq", "list", env=env).stdout.strip() == "the input and tool DLQs are empty"
    unknown = stepagent("dlq", "show", "nope", env=env)
    assert unknown.returncode == 1 and "no message 'nope'" in unknown.stderr
