"""Secrets are read by id at cold start (Secrets Manager or SSM on moto); the layer refuses the wrong
architecture with one clear message."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from stepagent.aws.layer_check import MARKER, check_layer
from stepagent.aws.secrets import provider_environment, resolve_secrets
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError
from tests.conftest import REGION, aws_client, aws_session, moto_endpoint


def settings(**env: str) -> Settings:
    return Settings.from_env({"AWS_ENDPOINT_URL": moto_endpoint(), "AWS_REGION": REGION, **env})


async def test_secrets_come_from_secrets_manager_and_ssm() -> None:
    name = f"key-{uuid.uuid4().hex[:8]}"
    async with aws_client("secretsmanager") as secrets, aws_client("ssm") as ssm:
        created = await secrets.create_secret(Name=name, SecretString="callback-key-" + "x" * 40)
        await ssm.put_parameter(Name=f"/{name}/api", Value="sk-ant-123", Type="SecureString")
    resolved = await resolve_secrets(
        settings(
            STEPAGENT_CALLBACK_SECRET_ID=created["ARN"],
            STEPAGENT_PROVIDER_API_KEY_ID=f"ssm:/{name}/api",
            STEPAGENT_MODEL="anthropic:claude-sonnet-4-6",
        ),
        aws_session(),
    )
    assert resolved.callback_secret == "callback-key-" + "x" * 40
    assert resolved.provider_api_key == "sk-ant-123"
    environ = provider_environment(resolved, {"PATH": "/bin"})
    assert environ == {"PATH": "/bin", "ANTHROPIC_API_KEY": "sk-ant-123"}
    by_name = await resolve_secrets(settings(STEPAGENT_CALLBACK_SECRET_ID=name), aws_session())
    assert by_name.callback_secret == resolved.callback_secret


async def test_a_missing_secret_fails_start_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="STEPAGENT_CALLBACK_SECRET_ID='nope' could not be read"):
        await resolve_secrets(settings(STEPAGENT_CALLBACK_SECRET_ID="nope"), aws_session())
    with pytest.raises(ConfigurationError, match="only one of STEPAGENT_CALLBACK_SECRET and"):
        await resolve_secrets(
            settings(STEPAGENT_CALLBACK_SECRET="a" * 32, STEPAGENT_CALLBACK_SECRET_ID="x"), aws_session()
        )


def test_an_api_key_secret_for_a_model_without_keys_is_refused() -> None:
    resolved = Settings(model="bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0", provider_api_key="k")
    with pytest.raises(ConfigurationError, match="takes no API key"):
        provider_environment(resolved, {})
    assert provider_environment(Settings(model="openai:gpt-4.1"), {}) is None


def test_the_layer_refuses_another_architecture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / MARKER).write_text(json.dumps({"architecture": "x86_64", "python": running}))
    check_layer([str(tmp_path)], machine="aarch64")  # outside Lambda: nothing to check
    monkeypatch.setenv("LAMBDA_TASK_ROOT", str(tmp_path))
    check_layer([str(tmp_path)], machine="x86_64")
    with pytest.raises(ConfigurationError, match=r"built for x86_64 but this function runs on arm64"):
        check_layer([str(tmp_path)], machine="aarch64")
    check_layer(["/nonexistent"], machine="aarch64")  # a development install has no marker
