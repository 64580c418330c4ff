"""``STEPAGENT_MAX_RECEIVE_COUNT``: the worker's knowledge of the input queue's maxReceiveCount."""

from __future__ import annotations

import pytest

from stepagent.aws.settings import DEFAULT_MAX_RECEIVE_COUNT, Settings
from stepagent.errors import ConfigurationError


def test_max_receive_count_defaults_to_the_templates_and_reads_the_setting() -> None:
    assert Settings.from_env({}).max_receive_count == DEFAULT_MAX_RECEIVE_COUNT == 5
    assert Settings.from_env({"STEPAGENT_MAX_RECEIVE_COUNT": " 3 "}).max_receive_count == 3


@pytest.mark.parametrize("raw", ["0", "-2", "five", "2.5"])
def test_an_invalid_max_receive_count_fails_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigurationError, match=r"STEPAGENT_MAX_RECEIVE_COUNT=.*at least 1"):
        Settings.from_env({"STEPAGENT_MAX_RECEIVE_COUNT": raw})
