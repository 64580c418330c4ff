"""The agent settings: their syntax, validation (one line per bad value, naming the setting), ``@path``
files found where a deployment ships them, profiles, and the one typed object that carries them."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepagent.agent_config import (
    ALL_BUILTINS,
    AgentConfig,
    AgentProfile,
    agent_config_from_env,
    parse_builtin_tools,
    profile_name,
    search_roots,
)
from stepagent.aws.settings import Settings, warn_unknown_names
from stepagent.errors import ConfigurationError
from stepagent.tools.builtins import BUILTIN_GROUPS, BUILTIN_TOOL_NAMES, builtin_tools
from stepagent.tools.sleep import Sleep, SleepUntil

THREADS = {"spawn_thread", "report_to_parent", "close_thread", "send_message_to_child"}


def test_the_builtin_names_are_the_builtin_tools() -> None:
    tools = [*builtin_tools(), Sleep(), SleepUntil()]
    assert list(BUILTIN_TOOL_NAMES) == [t.name for t in tools]
    assert all(t.builtin for t in tools)
    assert set(BUILTIN_GROUPS["threads"]) == THREADS


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all", set(BUILTIN_TOOL_NAMES)),
        ("none", set()),
        ("threads", THREADS),
        ("threads, timers", THREADS | {"sleep", "sleep_until"}),
        ("all,-timers", set(BUILTIN_TOOL_NAMES) - {"sleep", "sleep_until"}),
        ("-send_message_to_child", set(BUILTIN_TOOL_NAMES) - {"send_message_to_child"}),
        ("spawn_thread,report_to_parent", {"spawn_thread", "report_to_parent"}),
        ("threads,-threads,sleep", {"sleep"}),
        (" Subscriptions ", {"cancel_subscription", "sleep_until_event_or_input"}),
    ],
)
def test_builtin_tools_syntax(spec: str, expected: set[str]) -> None:
    assert parse_builtin_tools(spec) == expected


@pytest.mark.parametrize("spec", ["", " , ", "threadz", "all,-nope"])
def test_bad_builtin_tools_name_the_setting_and_the_valid_entries(spec: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_builtin_tools(spec)
    message = str(caught.value)
    assert message.startswith("STEPAGENT_BUILTIN_TOOLS")
    if spec.strip(" ,"):
        assert "threads" in message and "spawn_thread" in message  # says what is valid


def test_agent_config_defaults_and_normalisation() -> None:
    config = AgentConfig()
    assert config.builtin_tools == ALL_BUILTINS and config.compaction_threshold == 0.75
    assert config.system_prompt is config.max_tokens is config.temperature is config.context_window is None
    assert AgentConfig(builtin_tools="threads").builtin_tools == THREADS  # a string is parsed


def test_every_bad_value_is_one_line_naming_its_setting() -> None:
    with pytest.raises(ConfigurationError) as caught:
        AgentConfig(
            max_tokens=0, temperature=3.5, context_window=-1, compaction_threshold=1.5, builtin_tools="x"
        )
    lines = str(caught.value).splitlines()
    assert [line.split("=")[0].split(" ")[0] for line in lines] == [
        "STEPAGENT_MAX_TOKENS",
        "STEPAGENT_CONTEXT_WINDOW",
        "STEPAGENT_TEMPERATURE",
        "STEPAGENT_COMPACTION_THRESHOLD",
        "STEPAGENT_BUILTIN_TOOLS",
    ]


def test_from_env_reports_every_bad_value_at_once() -> None:
    env = {
        "STEPAGENT_MAX_TOKENS": "lots",
        "STEPAGENT_TEMPERATURE": "warm",
        "STEPAGENT_CONTEXT_WINDOW": "0",
        "STEPAGENT_COMPACTION_THRESHOLD": "nan",
        "STEPAGENT_PROFILES": "{not json",
        "STEPAGENT_SYSTEM_PROMPT": "@missing-prompt.md",
    }
    with pytest.raises(ConfigurationError) as caught:
        agent_config_from_env(env, roots=[])
    lines = str(caught.value).splitlines()
    named = [line.split("=")[0].split(" ")[0].rstrip(":") for line in lines]
    assert sorted(named) == sorted(env)  # one line per bad value, each naming its setting


def test_from_env_values() -> None:
    config = agent_config_from_env(
        {
            "STEPAGENT_SYSTEM_PROMPT": "You file expense reports.",
            "STEPAGENT_MAX_TOKENS": "2_048",
            "STEPAGENT_TEMPERATURE": "0.2",
            "STEPAGENT_CONTEXT_WINDOW": "65536",
            "STEPAGENT_COMPACTION_THRESHOLD": "0.6",
            "STEPAGENT_BUILTIN_TOOLS": "none",
            "STEPAGENT_MODEL": "ignored:here",
        },
        roots=[],
    )
    assert config == AgentConfig(
        system_prompt="You file expense reports.",
        max_tokens=2048,
        temperature=0.2,
        context_window=65536,
        compaction_threshold=0.6,
        builtin_tools=frozenset(),
    )
    assert agent_config_from_env({"STEPAGENT_MAX_TOKENS": "  "}, roots=[]) == AgentConfig()  # empty = unset


# ---- @path files ---------------------------------------------------------------------------------------


@pytest.fixture
def tools_package(tmp_path: Path) -> Iterator[Path]:
    """A tools project installed on the import path: site/agentpkg/{__init__,tools}.py + prompts."""
    site = tmp_path / "site"
    package = site / "agentpkg"
    (package / "prompts").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text("toolset = []\n")
    (package / "prompts" / "system.md").write_text("You are the packaged agent.\n")
    sys.path.insert(0, str(site))
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("agentpkg", None)


def test_a_prompt_file_shipped_inside_the_tools_package_is_found(
    tools_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # not where the file is
    roots = search_roots("agentpkg.tools:toolset", {})
    assert tools_package in roots and tools_package / "agentpkg" in roots
    assert "agentpkg" not in sys.modules  # found without importing the user's code
    for spec in ("@agentpkg/prompts/system.md", "@prompts/system.md"):
        env = {"STEPAGENT_TOOLS": "agentpkg.tools:toolset", "STEPAGENT_SYSTEM_PROMPT": spec}
        assert agent_config_from_env(env).system_prompt == "You are the packaged agent.\n"


def test_a_prompt_file_is_found_in_the_current_directory_and_the_task_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_root, work = tmp_path / "task", tmp_path / "work"
    task_root.mkdir()
    work.mkdir()
    (task_root / "prompt.txt").write_text("from the task root")
    (work / "local.txt").write_text("from the current directory")
    monkeypatch.chdir(work)
    env = {"LAMBDA_TASK_ROOT": str(task_root)}
    assert agent_config_from_env({**env, "STEPAGENT_SYSTEM_PROMPT": "@prompt.txt"}).system_prompt == (
        "from the task root"
    )
    assert agent_config_from_env({**env, "STEPAGENT_SYSTEM_PROMPT": "@local.txt"}).system_prompt == (
        "from the current directory"
    )
    absolute = str(task_root / "prompt.txt")
    assert agent_config_from_env({"STEPAGENT_SYSTEM_PROMPT": f"@{absolute}"}).system_prompt == (
        "from the task root"
    )


def test_a_missing_prompt_file_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        agent_config_from_env({"STEPAGENT_SYSTEM_PROMPT": "@nope.md"}, roots=[tmp_path / "a", tmp_path / "b"])
    message = str(caught.value)
    assert message.startswith("STEPAGENT_SYSTEM_PROMPT='@nope.md'")
    assert str(tmp_path / "a" / "nope.md") in message and str(tmp_path / "b" / "nope.md") in message


# ---- profiles ------------------------------------------------------------------------------------------


def test_profiles_from_a_file_with_a_prompt_next_to_it(tmp_path: Path) -> None:
    folder = tmp_path / "agents"
    folder.mkdir()
    (folder / "support.md").write_text("You are support.")
    profiles = {
        "support": {
            "system_prompt": "@support.md",
            "model": "anthropic:claude-haiku-4-5",
            "tools": ["crm_*", "lookup"],
            "builtin_tools": "threads",
            "max_tokens": 1000,
            "temperature": 0,
            "context_window": 100_000,
        },
        "terse": {"system_prompt": "Answer in one word."},
    }
    (folder / "profiles.json").write_text(json.dumps(profiles))
    config = agent_config_from_env({"STEPAGENT_PROFILES": "@agents/profiles.json"}, roots=[tmp_path])
    assert config.profiles["support"] == AgentProfile(
        name="support",
        system_prompt="You are support.",
        model="anthropic:claude-haiku-4-5",
        tools=("crm_*", "lookup"),
        builtin_tools=frozenset(THREADS),
        max_tokens=1000,
        temperature=0,
        context_window=100_000,
    )
    assert config.profiles["terse"] == AgentProfile(name="terse", system_prompt="Answer in one word.")
    inline = agent_config_from_env({"STEPAGENT_PROFILES": json.dumps({"terse": profiles["terse"]})}, roots=[])
    assert inline.profiles == {"terse": config.profiles["terse"]}


def test_bad_profiles_are_reported_one_line_each() -> None:
    profiles = {
        "ok": {},
        "bad key": {"prompt": "x"},
        "odd": {"prompt": "x", "model": "no-colon"},
        "numbers": {"max_tokens": -5, "temperature": "hot", "builtin_tools": "everything"},
    }
    with pytest.raises(ConfigurationError) as caught:
        agent_config_from_env({"STEPAGENT_PROFILES": json.dumps(profiles)}, roots=[])
    lines = str(caught.value).splitlines()
    assert all(line.startswith("STEPAGENT_PROFILES") for line in lines)
    assert any("'bad key'" in line and "unknown key" in line for line in lines)
    assert any("'odd': unknown key 'prompt'; allowed: system_prompt," in line for line in lines)
    assert any("'odd': model 'no-colon' is not <provider>:<model id>" in line for line in lines)
    assert any("'numbers': max_tokens=-5" in line for line in lines)
    assert any("'numbers': temperature='hot'" in line for line in lines)
    assert any("'numbers': builtin_tools" in line for line in lines)
    assert len(lines) == 7  # the bad name, then each bad value of each profile, once


def test_a_profiles_json_shape_is_checked_with_every_value_reported() -> None:
    profiles = {
        "shape": {
            "tools": "crm",
            "approval": 3,
            "builtin_tools": ["threads", 2],
            "system_prompt": 7,
            "compaction_threshold": 0.5,
            "max_conversation_cost_usd": 0,
        },
        "listed": [],
    }
    with pytest.raises(ConfigurationError) as caught:
        agent_config_from_env({"STEPAGENT_PROFILES": json.dumps(profiles)}, roots=[])
    where = "STEPAGENT_PROFILES: profile 'shape': "
    assert str(caught.value).splitlines() == [
        f"{where}system_prompt=7 is invalid: text (or @path to a UTF-8 file)",
        f"{where}max_conversation_cost_usd=0 is invalid: dollars, a number greater than 0 (e.g. 2.50)",
        f"{where}tools: must be a list, got a string",
        f"{where}builtin_tools[1]: must be a string, got a number",
        f"{where}approval: must be a string or a list, got a number",
        f"{where}unknown key 'compaction_threshold'; allowed: system_prompt, max_tokens, context_window, "
        "temperature, max_model_calls_per_turn, max_conversation_tokens, max_conversation_cost_usd, model, "
        "tools, builtin_tools, output_schema, approval",
        "STEPAGENT_PROFILES: profile 'listed': must be a JSON object, got a list",
    ]


def test_the_profile_is_read_from_the_metadata_key_profile() -> None:
    assert profile_name({"profile": "support", "user_id": "u1"}) == "support"
    assert profile_name({"user_id": "u1"}) is None
    assert profile_name(None) is None and profile_name(["profile"]) is None
    assert profile_name({"profile": 7}) == "7"  # reported as an unknown profile, never ignored


# ---- settings ------------------------------------------------------------------------------------------


def test_settings_keep_the_agent_settings_and_read_files_only_when_asked(tmp_path: Path) -> None:
    settings = Settings.from_env({"STEPAGENT_SYSTEM_PROMPT": "@later.md", "STEPAGENT_MAX_TOKENS": "10"})
    assert settings.agent_settings == {"STEPAGENT_SYSTEM_PROMPT": "@later.md", "STEPAGENT_MAX_TOKENS": "10"}
    with pytest.raises(ConfigurationError, match="STEPAGENT_SYSTEM_PROMPT"):
        settings.agent_config(roots=[tmp_path])
    (tmp_path / "later.md").write_text("Now it exists.")
    assert settings.agent_config(roots=[tmp_path]) == AgentConfig(
        system_prompt="Now it exists.", max_tokens=10
    )


def test_an_unknown_setting_is_warned_about_with_the_closest_name(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="stepagent.aws.settings"):
        unknown = warn_unknown_names({"STEPAGENT_MAX_TOKEN": "5", "STEPAGENT_MODEL": "x:y", "HOME": "/"})
        Settings.from_env({"STEPAGENT_SYSTEMPROMPT": "hi"})
    assert unknown == ["STEPAGENT_MAX_TOKEN"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("STEPAGENT_MAX_TOKEN " in m and "did you mean STEPAGENT_MAX_TOKENS?" in m for m in messages)
    assert any("did you mean STEPAGENT_SYSTEM_PROMPT?" in m for m in messages)


# ---- one model per input ----------------------------------------------------------------------------------


def test_the_configuration_fingerprint_is_what_it_was_before_the_models() -> None:
    """Threads record the fingerprint they last stepped under: the models must give the same one."""
    from stepagent.config_fingerprint import config_fingerprint

    profile = AgentProfile(
        name="p",
        temperature=0.5,
        model="openai:gpt-4o",
        tools=("a", "b*"),
        max_tokens=100,
        builtin_tools="none",
        approval=("x",),
    )
    agent = AgentConfig(
        system_prompt="Be brief.",
        builtin_tools="threads, sleep",
        approval="send_*",
        max_conversation_cost_usd=2.5,
        output_schema={"type": "object"},
        prompt_cache_ttl="1h",
        profiles={"p": profile},
    )
    # Computed with the dataclasses this configuration used to be.
    assert config_fingerprint(agent, ["lookup", "transfer"], "scripted:x") == "b5d05afaffdc"
    assert config_fingerprint(AgentConfig(), [], None) == "17a1ef983d8e"


def test_a_profile_built_in_python_is_checked_as_one_read_from_json() -> None:
    with pytest.raises(ConfigurationError) as caught:
        AgentProfile(name="p", tools="crm", model=5, max_tokens=0, approval=3)
    assert str(caught.value).splitlines() == [
        "STEPAGENT_PROFILES: profile 'p': max_tokens=0 is invalid: a positive whole number of tokens",
        "STEPAGENT_PROFILES: profile 'p': model: must be a string, got a number",
        "STEPAGENT_PROFILES: profile 'p': tools: must be a list, got a string",
        "STEPAGENT_PROFILES: profile 'p': approval: must be a string or a list, got a number",
    ]
    with pytest.raises(ConfigurationError, match=r"^STEPAGENT_PROFILES: profile name 'a b' is invalid"):
        AgentProfile(name="a b")
    with pytest.raises(ConfigurationError) as caught:
        AgentConfig(profiles={"p": AgentProfile(name="q")})
    assert str(caught.value) == "STEPAGENT_PROFILES: entry 'p' must be an AgentProfile named 'p'"


def test_a_profile_whose_files_cannot_be_read_is_an_error_not_a_profile_without_them(tmp_path: Path) -> None:
    profiles = {"support": {"system_prompt": "@missing.md"}, "strict": {"output_schema": "{not json"}}
    with pytest.raises(ConfigurationError) as caught:
        agent_config_from_env({"STEPAGENT_PROFILES": json.dumps(profiles)}, roots=[tmp_path])
    lines = str(caught.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        "STEPAGENT_PROFILES: profile 'support': system_prompt='@missing.md': no such file"
    )
    assert lines[1].startswith("STEPAGENT_PROFILES: profile 'strict': output_schema is not valid JSON")


def test_a_misshapen_value_given_in_python_still_names_its_setting() -> None:
    with pytest.raises(ConfigurationError) as caught:
        AgentConfig(approval=["send_email", 1], builtin_tools=3, max_tokens=True)
    assert str(caught.value).splitlines() == [
        "STEPAGENT_MAX_TOKENS=True is invalid: a positive whole number of tokens",
        "STEPAGENT_BUILTIN_TOOLS: must be a string or a list, got a number",
        "STEPAGENT_APPROVAL[1]: must be a string, got a number",
    ]
