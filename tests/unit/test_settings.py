"""``STEPAGENT_MAX_RECEIVE_COUNT`` (the worker's knowledge of the input queue's maxReceiveCount) and
``STEPAGENT_MCP_SERVERS`` (every bad value reported at once)."""

from __future__ import annotations

import json
import re

import pytest

from stepagent.aws.settings import DEFAULT_MAX_RECEIVE_COUNT, Settings
from stepagent.errors import ConfigurationError
from stepagent.tools.mcp_config import McpServer


def test_max_receive_count_defaults_to_the_templates_and_reads_the_setting() -> None:
    assert Settings.from_env({}).max_receive_count == DEFAULT_MAX_RECEIVE_COUNT == 5
    assert Settings.from_env({"STEPAGENT_MAX_RECEIVE_COUNT": " 3 "}).max_receive_count == 3


@pytest.mark.parametrize("raw", ["0", "-2", "five", "2.5"])
def test_an_invalid_max_receive_count_fails_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigurationError, match=r"STEPAGENT_MAX_RECEIVE_COUNT=.*at least 1"):
        Settings.from_env({"STEPAGENT_MAX_RECEIVE_COUNT": raw})


def test_mcp_servers_report_every_bad_value_one_line_each() -> None:
    raw = json.dumps(
        [
            {"name": "files", "command": "mcp-files", "args": ["--root", 7], "env": {"TOKEN": 1}, "cwd": "/"},
            {"name": "", "url": "https://mcp.example"},
            {"name": "both", "command": "x", "url": "https://mcp.example"},
            "search",
        ]
    )
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"STEPAGENT_MCP_SERVERS": raw})
    assert str(caught.value).splitlines() == [
        "STEPAGENT_MCP_SERVERS[0].args[1]: must be a string, got a number",
        "STEPAGENT_MCP_SERVERS[0].env.TOKEN: must be a string, got a number",
        "STEPAGENT_MCP_SERVERS[0]: unknown key 'cwd'; allowed: name, command, args, env, url, headers, auth, client_id, scopes",
        "STEPAGENT_MCP_SERVERS[1].name: must not be empty",
        "STEPAGENT_MCP_SERVERS[2]: needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)",
        "STEPAGENT_MCP_SERVERS[3]: must be a JSON object, got a string",
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[{", "STEPAGENT_MCP_SERVERS is not valid JSON"),
        ('{"name": "a"}', "STEPAGENT_MCP_SERVERS: must be a list, got an object"),
        (
            '[{"name": "a", "command": "x"}, {"name": "a", "url": "http://h"}]',
            "STEPAGENT_MCP_SERVERS names more than one server 'a'",
        ),
    ],
)
def test_mcp_servers_shape_errors(raw: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Settings.from_env({"STEPAGENT_MCP_SERVERS": raw})


def test_mcp_servers_parse_into_typed_entries() -> None:
    raw = '[{"name": "files", "command": "mcp-files", "args": ["-v"], "env": {"K": "V"}}, {"name": "web", "url": "https://mcp.example", "headers": {"Authorization": "Bearer t"}}]'
    assert Settings.from_env({"STEPAGENT_MCP_SERVERS": raw}).mcp_servers == (
        McpServer(name="files", command="mcp-files", args=("-v",), env={"K": "V"}),
        McpServer(name="web", url="https://mcp.example", headers={"Authorization": "Bearer t"}),
    )


def test_every_bad_setting_is_reported_at_once_one_line_each() -> None:
    env = {
        "STEPAGENT_MODEL": "claude",
        "STEPAGENT_TOOLS": "myapp.tools",
        "STEPAGENT_RAP_SERVERS": "https://ok.example, ftp://files.example",
        "STEPAGENT_THREAD_CACHE_BYTES": "lots",
        "STEPAGENT_MAX_RECEIVE_COUNT": "0",
        "STEPAGENT_MCP_SERVERS": '[{"name": "a"}]',
        "STEPAGENT_LIVE_TEXT": "maybe",
        "STEPAGENT_PRICES": "[1]",
        "STEPAGENT_MCP_INPUT_WAIT": "-1",
    }
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env(env)
    lines = str(caught.value).splitlines()
    assert [re.split(r"[=\[ ]", line)[0] for line in lines] == list(env)  # one line each, in order
    assert lines[0].startswith("STEPAGENT_MODEL='claude' is invalid: expected <provider>:<model id>, e.g. ")
    assert lines[2] == "STEPAGENT_RAP_SERVERS contains 'ftp://files.example', which is not an http(s) URL"
    assert lines[5] == (
        "STEPAGENT_MCP_SERVERS[0]: needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)"
    )
    assert lines[6] == "STEPAGENT_LIVE_TEXT='maybe' is invalid: expected on or off"
    # Good values alongside are read as before.
    assert (
        Settings.from_env({"STEPAGENT_MODEL": "openai:gpt-4o", "STEPAGENT_LIVE_TEXT": "off"}).live_text
        is False
    )


def test_an_mcp_server_built_in_python_is_checked_as_one_read_from_the_setting() -> None:
    with pytest.raises(ConfigurationError) as caught:
        McpServer(name="both", command="x", url="https://mcp.example")
    assert str(caught.value) == "needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)"
    with pytest.raises(ConfigurationError, match=r"^args\[0\]: must be a string, got a number$"):
        McpServer(name="files", command="mcp-files", args=[1])
    assert McpServer(name="files", command="mcp-files", args=["-v"]).args == ("-v",)


def test_an_oauth_server_parses_with_its_client_id_and_scopes() -> None:
    raw = '[{"name": "gh", "url": "https://mcp.example/mcp", "auth": "oauth", "client_id": "c1", "scopes": ["repo"]}]'
    assert Settings.from_env({"STEPAGENT_MCP_SERVERS": raw}).mcp_servers == (
        McpServer(name="gh", url="https://mcp.example/mcp", auth="oauth", client_id="c1", scopes=("repo",)),
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"name": "files", "command": "mcp-files", "auth": "oauth"},
            'STEPAGENT_MCP_SERVERS[0]: "auth": "oauth" needs an HTTP server (\'url\'); a stdio server has no sign-in',
        ),
        (
            {"name": "gh", "url": "https://h/mcp", "auth": "oauth", "headers": {"authorization": "Bearer t"}},
            'STEPAGENT_MCP_SERVERS[0]: "auth": "oauth" sends each user\'s own token: remove the '
            "'Authorization' header",
        ),
        ({"name": "gh", "url": "https://h/mcp", "auth": "basic"}, "STEPAGENT_MCP_SERVERS[0].auth: 'basic'"),
        (
            {"name": "gh", "url": "https://h/mcp", "client_id": "c1"},
            "STEPAGENT_MCP_SERVERS[0]: 'client_id' and 'scopes' need \"auth\": \"oauth\"",
        ),
    ],
)
def test_an_oauth_entry_that_cannot_work_is_a_config_error(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"STEPAGENT_MCP_SERVERS": json.dumps([entry])})
    assert str(caught.value).startswith(message)
