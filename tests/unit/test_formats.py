"""The format-version rule (absent is v1, newer is refused naming the version) and the configuration
fingerprint (stable across processes, changed by any change)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stepagent.agent_config import AgentConfig, AgentProfile
from stepagent.config_fingerprint import config_fingerprint
from stepagent.errors import NewerFormatError, classify
from stepagent.formats import READS_UP_TO, check_version, item_version, stamp_body
from stepagent.messages import parse_input_message


def test_a_missing_version_is_version_one_and_known_versions_read() -> None:
    assert check_version(None, "x") == 1
    assert item_version({"pk": {"S": "t"}}, "x") == 1
    assert item_version({"v": {"N": str(READS_UP_TO)}}, "x") == READS_UP_TO


@pytest.mark.parametrize("version", [READS_UP_TO + 1, "7", {"N": "9"}])
def test_a_newer_version_is_refused_naming_it(version: object) -> None:
    with pytest.raises(NewerFormatError) as raised:
        if isinstance(version, dict):
            item_version({"v": version}, "the head of thread t")
        else:
            check_version(version, "this input message")
    text = str(raised.value)
    assert (
        "written by a newer stepagent (format v" in text
        and f"this release reads up to v{READS_UP_TO}" in text
    )
    assert classify(raised.value) == "reject"  # dead-lettered, never retried into the same wall


@pytest.mark.parametrize("version", [0, -1, "x", True])
def test_a_version_no_release_writes_is_refused(version: object) -> None:
    with pytest.raises(NewerFormatError, match="which no stepagent release writes"):
        check_version(version, "this tool message")


def test_an_input_body_of_a_newer_format_is_refused_before_it_is_read() -> None:
    body = {"v": READS_UP_TO + 1, "content": {"type": "text", "text": "hi"}, "group_id": "g"}
    with pytest.raises(NewerFormatError, match="this input message was written by a newer stepagent"):
        parse_input_message(json.dumps(body))
    assert parse_input_message(json.dumps({**body, "v": 1})).group_id == "g"


def test_stamping_a_body_keeps_its_bytes_after_the_version() -> None:
    assert stamp_body('{"a":1}') == '{"v":1,"a":1}'
    assert stamp_body("{}") == '{"v":1}'
    assert stamp_body('{"v":2,"a":1}') == '{"v":2,"a":1}'
    assert stamp_body("[1]") == "[1]"


def test_the_configuration_fingerprint_is_stable_and_sees_every_change() -> None:
    agent = AgentConfig(system_prompt="Be brief.", builtin_tools="threads, sleep")
    base = config_fingerprint(agent, ["lookup", "transfer"], "scripted:x")
    assert base == config_fingerprint(agent, ["transfer", "lookup"], "scripted:x")
    assert base != config_fingerprint(
        AgentConfig(system_prompt="Be long."), ["lookup", "transfer"], "scripted:x"
    )
    assert base != config_fingerprint(agent, ["lookup"], "scripted:x")
    assert base != config_fingerprint(agent, ["lookup", "transfer"], "scripted:y")
    profiled = AgentConfig(system_prompt="Be brief.", profiles={"p": AgentProfile(name="p", temperature=0.5)})
    assert base != config_fingerprint(profiled, ["lookup", "transfer"], "scripted:x")
    # Sets are hashed in a per-process order: another process (another hash seed) gets the same one.
    code = (
        "from stepagent.agent_config import AgentConfig; from stepagent.config_fingerprint import "
        "config_fingerprint; print(config_fingerprint(AgentConfig(system_prompt='Be brief.', "
        "builtin_tools='threads, sleep'), ['lookup', 'transfer'], 'scripted:x'))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    )
    assert other.stdout.strip() == base
