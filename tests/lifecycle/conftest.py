"""Fixtures of the lifecycle tests."""

from __future__ import annotations

import pytest

from tests.conftest import DynamoEnv, moto_endpoint


@pytest.fixture
def settings_env(dynamo: DynamoEnv, monkeypatch: pytest.MonkeyPatch) -> DynamoEnv:
    """The ``dynamo`` tables, bucket and endpoint as the ``STEPAGENT_*`` settings a CLI command reads."""
    monkeypatch.setenv("STEPAGENT_CONVERSATION_TABLE", dynamo.conversation_table)
    monkeypatch.setenv("STEPAGENT_STATE_TABLE", dynamo.state_table)
    monkeypatch.setenv("STEPAGENT_BLOB_BUCKET", dynamo.bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint())
    return dynamo
