"""The README's commands, run as a user runs them: `stepagent run --say`, `infra create`, `send`,
`history`. Each runs in a subprocess with a clean environment (no real credentials, no settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.conftest import moto_endpoint

ROOT = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("STEPAGENT_", "AWS_", "ANTHROPIC_", "OPENAI_"))
    }
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    env.update(extra)
    return env


def stepagent(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepagent.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_run_say_shows_the_offline_demo_with_a_tool_round_trip_and_a_child_thread() -> None:
    result = stepagent("run", "--say", "what time is it?", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert "DEMO" in result.stderr
    out = result.stdout
    assert "you > what time is it?" in out
    assert "agent ⚙ get_time()" in out
    assert "agent ⚙ spawn_thread(" in out
    assert "[child " in out and "report_to_parent(" in out
    assert "has finished and shut down" in out
    assert out.index("get_time()") < out.index("spawn_thread(") < out.index("shut down")


def test_infra_create_send_and_history_against_an_existing_endpoint() -> None:
    endpoint = moto_endpoint()
    prefix = f"cli-{uuid.uuid4().hex[:8]}"
    created = stepagent("infra", "create", "--endpoint-url", endpoint, "--prefix", prefix, env=clean_env())
    assert created.returncode == 0, created.stderr
    settings = dict(line.split("=", 1) for line in created.stdout.splitlines() if "=" in line)
    assert settings["STEPAGENT_CONVERSATION_TABLE"] == f"{prefix}-conversation"
    assert settings["AWS_ENDPOINT_URL"] == endpoint
    for key in ("STEPAGENT_INPUT_QUEUE_URL", "STEPAGENT_OUTPUT_QUEUE_URL", "STEPAGENT_BLOB_BUCKET"):
        assert settings[key]

    # Each command needs only its own resources: send the input queue, history the tables.
    tables = ("STEPAGENT_CONVERSATION_TABLE", "STEPAGENT_STATE_TABLE")
    queue_only = clean_env(**{k: v for k, v in settings.items() if k not in tables})
    sent = stepagent("send", "t-cli", "hello there", env=queue_only)
    assert sent.returncode == 0, sent.stderr
    assert "sent to thread t-cli" in sent.stdout

    no_queue = clean_env(**{k: v for k, v in settings.items() if k != "STEPAGENT_INPUT_QUEUE_URL"})
    missing = stepagent("history", "t-cli", "--json", env=no_queue)
    assert missing.returncode == 1  # nothing has processed the message: the thread does not exist yet
    assert "no thread 't-cli'" in missing.stderr

    thread = f"t-{uuid.uuid4().hex[:6]}"
    ran = stepagent("run", "--say", "hi", "--thread", thread, env=clean_env(AWS_ENDPOINT_URL=endpoint))
    assert ran.returncode == 0, ran.stderr
    history = stepagent("history", thread, "--json", env=clean_env(**{**settings, **_local_tables()}))
    assert history.returncode == 0, history.stderr
    items = json.loads(history.stdout)
    root = [i for i in items if i["thread_id"] == thread]
    children = [i for i in items if i["thread_id"] != thread]
    assert root[0] == {"thread_id": thread, "order": 1, "kind": "user", "text": "hi"}
    assert [i["order"] for i in root] == list(range(1, len(root) + 1))
    assert any(i["kind"] == "tool_call" and i["name"] == "get_time" for i in root)
    assert any(i["kind"] == "event" and "shut down" in i["text"] for i in root)
    assert children and children[0]["order"] == 1 and children[0]["kind"] == "tool_result"

    text = stepagent("history", thread, env=clean_env(**{**settings, **_local_tables()}))
    assert f"── thread {thread} (root)" in text.stdout and "⚙ get_time()" in text.stdout


def _local_tables() -> dict[str, str]:
    return {
        "STEPAGENT_CONVERSATION_TABLE": "stepagent-local-conversation",
        "STEPAGENT_STATE_TABLE": "stepagent-local-state",
        "STEPAGENT_BLOB_BUCKET": "stepagent-local-blobs",
    }


def test_bad_settings_fail_with_one_clear_line() -> None:
    result = stepagent("send", "t", "hi", env=clean_env())
    assert result.returncode == 2
    assert result.stderr.strip().startswith("stepagent: missing required setting STEPAGENT_INPUT_QUEUE_URL")
    assert "Traceback" not in result.stderr


def test_send_and_history_find_a_deployment_by_stack_name() -> None:
    """`--stack NAME` reads the stack's outputs (the names template.yaml exports) instead of settings."""
    import boto3

    endpoint = moto_endpoint()
    prefix = f"stk-{uuid.uuid4().hex[:8]}"
    created = stepagent("infra", "create", "--endpoint-url", endpoint, "--prefix", prefix, env=clean_env())
    assert created.returncode == 0, created.stderr
    settings = dict(line.split("=", 1) for line in created.stdout.splitlines() if "=" in line)
    outputs = {
        "InputQueueUrl": settings["STEPAGENT_INPUT_QUEUE_URL"],
        "OutputQueueUrl": settings["STEPAGENT_OUTPUT_QUEUE_URL"],
        "ConversationTableName": settings["STEPAGENT_CONVERSATION_TABLE"],
        "StateTableName": settings["STEPAGENT_STATE_TABLE"],
        "BlobBucketName": settings["STEPAGENT_BLOB_BUCKET"],
    }
    # A stack whose outputs name the resources, as a deployed stepagent stack's do.
    template = {
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": f"{prefix}-marker"}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    cloudformation = boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1")
    cloudformation.create_stack(StackName=prefix, TemplateBody=json.dumps(template))

    env = clean_env(AWS_ENDPOINT_URL=endpoint)
    sent = stepagent("send", "t-stack", "hello", "--stack", prefix, env=env)
    assert sent.returncode == 0, sent.stderr
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    body = sqs.receive_message(QueueUrl=outputs["InputQueueUrl"])["Messages"][0]["Body"]
    assert json.loads(body)["content"]["text"] == "hello"
    history = stepagent("history", "t-stack", "--stack", prefix, env=env)
    assert history.returncode == 1 and outputs["ConversationTableName"] in history.stderr

    unknown = stepagent("send", "t", "x", "--stack", "no-such-stack", env=env)
    assert unknown.returncode == 2
    assert "could not read the outputs of stack 'no-such-stack'" in unknown.stderr
