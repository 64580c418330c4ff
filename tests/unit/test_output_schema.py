"""Structured output: schemas from dicts and pydantic classes, validation, settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, field_validator

from stepagent.agent_config import AgentConfig, AgentProfile, agent_config_from_env, load_profiles
from stepagent.errors import ConfigurationError
from stepagent.output_schema import OutputSchema, output_feedback

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}


class Weather(BaseModel):
    city: str
    temp_c: float

    @field_validator("city")
    @classmethod
    def capitalised(cls, value: str) -> str:
        if not value[:1].isupper():
            raise ValueError("city must be capitalised")
        return value


def test_a_valid_answer_gives_its_value() -> None:
    schema = OutputSchema.of(WEATHER)
    assert schema.check('{"city": "Paris", "temp_c": 21}').value == {"city": "Paris", "temp_c": 21}
    fenced = schema.check('```json\n{"city": "Paris", "temp_c": 21.5}\n```')
    assert fenced.ok and fenced.value["temp_c"] == 21.5


def test_invalid_answers_name_every_problem_in_a_stable_order() -> None:
    schema = OutputSchema.of(WEATHER)
    check = schema.check('{"city": 3, "extra": true}')
    assert not check.ok and check.value is None
    assert check.errors == [
        "at (root): 'temp_c' is a required property",
        "at (root): Additional properties are not allowed ('extra' was unexpected)",
        "at city: 3 is not of type 'string'",
    ]
    assert schema.check("It is sunny").errors[0].startswith("the answer is not JSON")
    assert "- at city: 3 is not of type 'string'" in output_feedback(check.errors)


def test_a_pydantic_class_validates_with_its_own_rules() -> None:
    schema = OutputSchema.of(Weather)
    assert schema.schema["required"] == ["city", "temp_c"]
    assert schema.check('{"city": "Paris", "temp_c": "21"}').value == {"city": "Paris", "temp_c": 21.0}
    assert schema.check('{"city": "paris", "temp_c": 1}').errors == [
        "at city: Value error, city must be capitalised"
    ]


def test_a_broken_schema_fails_at_configuration() -> None:
    with pytest.raises(
        ConfigurationError, match="STEPAGENT_OUTPUT_SCHEMA is not a valid JSON Schema at type"
    ):
        AgentConfig(output_schema={"type": "objekt"})
    with pytest.raises(ConfigurationError, match="must be a JSON Schema"):
        AgentConfig(output_schema=42)


def test_settings_read_the_schema_inline_or_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "weather.json").write_text('{"type": "object", "required": ["city"]}')
    env = {
        "STEPAGENT_OUTPUT_SCHEMA": "@weather.json",
        "STEPAGENT_OUTPUT_RETRIES": "0",
        "STEPAGENT_MAX_MODEL_CALLS_PER_TURN": "7",
        "STEPAGENT_MAX_CONVERSATION_TOKENS": "100_000",
        "STEPAGENT_MAX_CONVERSATION_COST_USD": "$2.50",
    }
    config = agent_config_from_env(env, roots=[tmp_path])
    assert isinstance(config.output_schema, OutputSchema)
    assert config.output_schema.schema == {"type": "object", "required": ["city"]}
    assert (config.output_retries, config.max_model_calls_per_turn) == (0, 7)
    assert (config.max_conversation_tokens, config.max_conversation_cost_usd) == (100_000, 2.5)
    assert agent_config_from_env({}).max_model_calls_per_turn == 50


def test_bad_limit_and_schema_settings_are_all_reported() -> None:
    env = {
        "STEPAGENT_OUTPUT_SCHEMA": "[1]",
        "STEPAGENT_OUTPUT_RETRIES": "-1",
        "STEPAGENT_MAX_MODEL_CALLS_PER_TURN": "0",
        "STEPAGENT_MAX_CONVERSATION_TOKENS": "lots",
        "STEPAGENT_MAX_CONVERSATION_COST_USD": "-3",
    }
    with pytest.raises(ConfigurationError) as caught:
        agent_config_from_env(env, roots=[])
    message = str(caught.value)
    for expected in (
        "STEPAGENT_OUTPUT_SCHEMA must be a JSON Schema object",
        "STEPAGENT_MAX_CONVERSATION_TOKENS='lots' is invalid",
        "STEPAGENT_OUTPUT_RETRIES=-1 is invalid",
        "STEPAGENT_MAX_MODEL_CALLS_PER_TURN=0 is invalid",
        "STEPAGENT_MAX_CONVERSATION_COST_USD=-3.0 is invalid",
    ):
        assert expected in message


def test_profiles_set_limits_and_a_schema() -> None:
    profiles = load_profiles(
        '{"support": {"max_model_calls_per_turn": 3, "max_conversation_cost_usd": 0.5,'
        ' "output_schema": {"type": "object"}}}',
        roots=[],
    )
    support = profiles["support"]
    assert support.max_model_calls_per_turn == 3 and support.max_conversation_cost_usd == 0.5
    assert isinstance(support.output_schema, OutputSchema)
    with pytest.raises(ConfigurationError, match="profile 'bad': max_conversation_tokens=0 is invalid"):
        AgentProfile(name="bad", max_conversation_tokens=0)
