"""``template.yaml`` keeps every production property it promises (so a later edit cannot drop one silently).

cfn-lint and ``sam validate --lint`` run in ``make lint-template``; this reads the template itself and
evaluates it for a few parameter sets, as CloudFormation would.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from stepagent.agent_config import AGENT_SETTING_NAMES, AgentConfig
from stepagent.aws.settings import Settings
from tests.artifact.template_env import Evaluator, load_template

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ("WorkerFunction", "ToolRunnerFunction", "TimerRelayFunction", "RapReceiverFunction")


class Physical(dict[str, str]):
    """Physical values, with a placeholder for any resource a check does not care about."""

    def __missing__(self, name: str) -> str:
        return f"<{name}>"


PHYSICAL = Physical(
    {
        "ConversationTable": "conv",
        "StateTable": "state",
        "InputQueue": "https://sqs/input.fifo",
        "OutputQueue": "https://sqs/output.fifo",
        "DelayQueue": "https://sqs/delay",
        "ToolQueue": "https://sqs/tool",
        "BlobBucket": "bucket",
        "CallbackSecret": "arn:aws:secretsmanager:us-east-1:123456789012:secret:cb-abcdef",
        "SchedulerRole.Arn": "arn:aws:iam::123456789012:role/s",
        "DelayDeadLetterQueue.Arn": "arn:aws:sqs:us-east-1:123456789012:delay-dlq",
        "RapReceiverFunctionUrl.FunctionUrl": "https://receiver.lambda-url.us-east-1.on.aws/",
        "InputDeadLetterQueue.QueueName": "input-dlq.fifo",
        "ToolDeadLetterQueue.QueueName": "tool-dlq",
        "InputQueue.QueueName": "input.fifo",
        "WorkerFunction": "worker-fn",
        "WorkerLogGroup": "worker-logs",
        "ToolRunnerLogGroup": "tool-logs",
        "TimerRelayLogGroup": "relay-logs",
        "RapReceiverLogGroup": "receiver-logs",
    }
)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def evaluate(template: dict[str, Any], region: str = "us-east-1", **parameters: str) -> Evaluator:
    return Evaluator(template, PHYSICAL, parameters, region=region)


def resources_of(template: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def test_every_function_logs_to_its_own_group_with_the_retention_parameter(template: dict[str, Any]) -> None:
    groups = resources_of(template, "AWS::Logs::LogGroup")
    assert template["Parameters"]["LogRetentionDays"]["Default"] == 30
    for name in FUNCTIONS:
        group = template["Resources"][name]["Properties"]["LoggingConfig"]["LogGroup"]
        assert group["Ref"] in groups
        assert groups[group["Ref"]]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_alarms_watch_the_dlqs_worker_errors_and_input_age(template: dict[str, Any]) -> None:
    watched = set()
    for name, alarm in resources_of(template, "AWS::CloudWatch::Alarm").items():
        props = alarm["Properties"]
        dimension = props["Dimensions"][0]["Value"]
        target = dimension.get("Fn::GetAtt", [dimension.get("Ref")])[0]
        watched.add((props["MetricName"], target))
        with_topic = evaluate(template, AlarmTopicArn="arn:aws:sns:us-east-1:1:ops").value(props)
        assert with_topic["AlarmActions"] == ["arn:aws:sns:us-east-1:1:ops"], name
        assert "AlarmActions" not in evaluate(template).value(props), name
    assert {
        ("ApproximateNumberOfMessagesVisible", "InputDeadLetterQueue"),
        ("ApproximateNumberOfMessagesVisible", "ToolDeadLetterQueue"),
        ("Errors", "WorkerFunction"),
        ("ApproximateAgeOfOldestMessage", "InputQueue"),
    } <= watched


def test_fan_out_is_bounded(template: dict[str, Any]) -> None:
    worker = template["Resources"]["WorkerFunction"]["Properties"]
    scaling = worker["Events"]["Inputs"]["Properties"]["ScalingConfig"]
    assert scaling == {"MaximumConcurrency": {"Ref": "WorkerMaxConcurrency"}}
    receiver = template["Resources"]["RapReceiverFunction"]["Properties"]
    assert receiver["FunctionUrlConfig"]["AuthType"] == "NONE"
    assert evaluate(template).value(receiver["ReservedConcurrentExecutions"]) == "5"
    assert (
        evaluate(template, ReceiverReservedConcurrency="0").value(
            {"x": receiver["ReservedConcurrentExecutions"]}
        )
        == {}
    )


def test_conversations_survive_deleting_the_stack_unless_opted_out(template: dict[str, Any]) -> None:
    assert template["Parameters"]["DataDeletionPolicy"]["Default"] == "Retain"
    for name in ("ConversationTable", "StateTable", "BlobBucket"):
        resource = template["Resources"][name]
        assert resource["DeletionPolicy"] == {"Ref": "DataDeletionPolicy"}, name
        assert resource["UpdateReplacePolicy"] == {"Ref": "DataDeletionPolicy"}, name
    assert "AWS::LanguageExtensions" in template["Transform"]  # makes a parameter valid there


def test_each_function_gets_only_its_environment_and_no_secret_values(template: dict[str, Any]) -> None:
    common = {
        "STEPAGENT_INPUT_QUEUE_URL",
        "STEPAGENT_BLOB_BUCKET",
        "POWERTOOLS_SERVICE_NAME",
        "POWERTOOLS_METRICS_NAMESPACE",
        "OTEL_SERVICE_NAME",  # harmless alone: tracing is off without an OTLP endpoint
    }
    env = {name: evaluate(template).environment(name) for name in FUNCTIONS}
    assert set(env["TimerRelayFunction"]) == common
    # The state table: an older MCP server's held call reads the person's answer to its question there.
    assert set(env["ToolRunnerFunction"]) == common | {
        "STEPAGENT_TOOLS",
        "STEPAGENT_MCP_SERVERS",
        "STEPAGENT_STATE_TABLE",
        "STEPAGENT_MCP_INPUT_WAIT",
        # "auth": "oauth" MCP servers: users' tokens sealed with the stack's key; sign-ins return to the API.
        "STEPAGENT_OAUTH_KEY_ID",
        "STEPAGENT_API_URL",
    }
    assert set(env["RapReceiverFunction"]) == common | {
        "STEPAGENT_OUTPUT_QUEUE_URL",
        "STEPAGENT_CONVERSATION_TABLE",
        "STEPAGENT_STATE_TABLE",
        "STEPAGENT_CALLBACK_SECRET_ID",
    }
    assert set(env["WorkerFunction"]) == common | {
        "STEPAGENT_CONVERSATION_TABLE",
        "STEPAGENT_STATE_TABLE",
        "STEPAGENT_OUTPUT_QUEUE_URL",
        "STEPAGENT_DELAY_QUEUE_URL",
        "STEPAGENT_TOOL_QUEUE_URL",
        "STEPAGENT_MODEL",
        "STEPAGENT_TOOLS",
        "STEPAGENT_RAP_SERVERS",
        "STEPAGENT_MCP_SERVERS",
        "STEPAGENT_CALLBACK_URL",
        "STEPAGENT_CALLBACK_SECRET_ID",
        "STEPAGENT_SCHEDULER_ROLE_ARN",
        "STEPAGENT_SCHEDULER_DLQ_ARN",
        "STEPAGENT_MAX_RECEIVE_COUNT",
        "STEPAGENT_PRICES",
        *AGENT_SETTING_NAMES,  # the agent settings go to the worker only
        "STEPAGENT_LIVE_TEXT",
    }
    assert env["WorkerFunction"]["STEPAGENT_LIVE_TEXT"] == "on"
    assert evaluate(template, LiveText="off").environment("WorkerFunction")["STEPAGENT_LIVE_TEXT"] == "off"
    for name, variables in env.items():
        for forbidden in ("STEPAGENT_CALLBACK_SECRET", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
            assert forbidden not in variables, f"{name} carries {forbidden} as a plain value"
    with_key = evaluate(template, Model="anthropic:claude-sonnet-4-6", ProviderApiKeySecret="anthropic-key")
    assert with_key.environment("WorkerFunction")["STEPAGENT_PROVIDER_API_KEY_ID"] == "anthropic-key"
    assert "STEPAGENT_PROVIDER_API_KEY_ID" not in env["WorkerFunction"]


def test_agent_settings_are_worker_parameters_passed_unchanged(template: dict[str, Any]) -> None:
    parameters = {
        "SystemPrompt": "@prompts/support.md",
        "MaxTokens": "2048",
        "Temperature": "0.2",
        "ContextWindow": "65536",
        "CompactionThreshold": "0.6",
        "BuiltinTools": "threads,-send_message_to_child",
        "Profiles": "@profiles.json",
        "MaxModelCallsPerTurn": "20",
        "MaxConversationTokens": "1000000",
        "MaxConversationCostUsd": "2.50",
        "OutputSchema": "@schemas/answer.json",
        "OutputRetries": "1",
        "Approval": "send_email,crm_*",
        "PromptCacheTtl": "1h",
    }
    worker = evaluate(template, **parameters).environment("WorkerFunction")
    assert {name: worker[name] for name in AGENT_SETTING_NAMES} == dict(
        zip(AGENT_SETTING_NAMES, parameters.values(), strict=True)
    )
    defaults = evaluate(template).environment("WorkerFunction")
    assert all(defaults[name] == "" for name in AGENT_SETTING_NAMES)  # empty = the documented default
    # Empty values are the defaults for the settings too, so an undeployed parameter changes nothing.
    assert Settings.from_env(defaults).agent_config(roots=[]) == AgentConfig()
    assert Settings.from_env(worker).agent_settings["STEPAGENT_MAX_TOKENS"] == "2048"


def policies(template: dict[str, Any], function: str, **parameters: str) -> str:
    return repr(
        evaluate(template, **parameters).value(template["Resources"][function]["Properties"]["Policies"])
    )


def test_secrets_are_readable_only_by_the_functions_that_use_them(template: dict[str, Any]) -> None:
    secret = template["Resources"]["CallbackSecret"]
    assert secret["Type"] == "AWS::SecretsManager::Secret" and "GenerateSecretString" in secret["Properties"]
    for name in ("WorkerFunction", "RapReceiverFunction"):
        assert "AWSSecretsManagerGetSecretValuePolicy" in policies(template, name)
    for name in ("ToolRunnerFunction", "TimerRelayFunction"):
        assert "secretsmanager" not in policies(template, name).lower()
    by_name = policies(template, "WorkerFunction", ProviderApiKeySecret="anthropic-key", Model="anthropic:x")
    assert "secret:anthropic-key-??????" in by_name


def test_bedrock_permissions_only_for_a_bedrock_model(template: dict[str, Any]) -> None:
    default = policies(template, "WorkerFunction")
    assert "bedrock:InvokeModelWithResponseStream" in default
    assert ":inference-profile/*" in default and "::foundation-model/*" in default
    assert "bedrock:" not in policies(template, "WorkerFunction", Model="anthropic:claude-sonnet-4-6")
    assert "bedrock:Invoke" in policies(template, "WorkerFunction", Model="bedrock:amazon.nova-pro-v1:0")
    for name in ("ToolRunnerFunction", "TimerRelayFunction", "RapReceiverFunction"):
        assert "bedrock" not in policies(template, name)


@pytest.mark.parametrize(
    ("region", "profile"),
    [("us-west-2", "us"), ("eu-west-1", "eu"), ("ap-northeast-1", "apac"), ("sa-east-1", "global")],
)
def test_the_default_model_is_an_inference_profile_for_the_region(
    template: dict[str, Any], region: str, profile: str
) -> None:
    model = evaluate(template, region=region).environment("WorkerFunction")["STEPAGENT_MODEL"]
    assert model == f"bedrock:{profile}.anthropic.claude-sonnet-4-5-20250929-v1:0"
    chosen = evaluate(template, Model="openai:gpt-4.1").environment("WorkerFunction")["STEPAGENT_MODEL"]
    assert chosen == "openai:gpt-4.1"


def test_the_worker_knows_the_receive_limit_and_the_architecture_is_one_parameter(
    template: dict[str, Any],
) -> None:
    redrive = template["Resources"]["InputQueue"]["Properties"]["RedrivePolicy"]
    assert redrive["maxReceiveCount"] == {"Ref": "InputMaxReceiveCount"}
    worker_env = template["Resources"]["WorkerFunction"]["Properties"]["Environment"]["Variables"]
    assert worker_env["STEPAGENT_MAX_RECEIVE_COUNT"] == {"Ref": "InputMaxReceiveCount"}
    assert template["Globals"]["Function"]["Architectures"] == [{"Ref": "Architecture"}]
    layer = template["Resources"]["RuntimeLayer"]
    assert layer["Properties"]["CompatibleArchitectures"] == [{"Ref": "Architecture"}]
    assert set(template["Parameters"]["Architecture"]["AllowedValues"]) == {"x86_64", "arm64"}


def test_sam_build_does_not_copy_the_virtual_environments() -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    assert config["default"]["build"]["parameters"]["build_in_source"] is True
    assert "CAPABILITY_AUTO_EXPAND" in config["default"]["deploy"]["parameters"]["capabilities"]


def test_tracing_is_opentelemetry_only_and_off_without_an_endpoint(template: dict[str, Any]) -> None:
    assert "Tracing" not in template["Globals"]["Function"]  # no X-Ray SDK segments
    off = {name: evaluate(template).environment(name) for name in FUNCTIONS}
    assert not any("OTEL_EXPORTER_OTLP_ENDPOINT" in env for env in off.values())
    on = evaluate(template, OtlpEndpoint="http://localhost:4318", OtlpHeadersSecret="otlp-headers")
    for name in FUNCTIONS:
        env = on.environment(name)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4318"
        assert env["STEPAGENT_OTLP_HEADERS_SECRET_ID"] == "otlp-headers"  # the secret's name, never its value


def test_the_dashboard_charts_every_metric_the_runtime_publishes(template: dict[str, Any]) -> None:
    from stepagent.aws import metrics

    body = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    published = [
        metrics.INPUT_TOKENS,
        metrics.OUTPUT_TOKENS,
        metrics.CACHE_READ_TOKENS,
        metrics.CACHE_WRITE_TOKENS,
        metrics.MODEL_LATENCY,
        metrics.MODEL_ERRORS,
        metrics.TOOL_LATENCY,
        "Steps",
        "StepFailures",
    ]
    assert all(f'\\"{name}\\"' in body or f'"{name}"' in body for name in published)
    for alarm in ("InputDeadLetterAlarm", "ToolDeadLetterAlarm", "WorkerErrorsAlarm", "InputAgeAlarm"):
        assert "${" + alarm + ".Arn}" in body
