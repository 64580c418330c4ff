"""The command line as a new user meets it: tools from the current directory, --version,
warnings for misspelled settings, a pipe that closes early, missing credentials, help for every flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from stepagent.errors import ConfigurationError
from stepagent.tools.functions import load_toolset
from stepagent.transcript import format_transcript, item_line
from tests.conftest import moto_endpoint
from tests.integration.test_cli import clean_env, stepagent

CONSOLE_SCRIPT = Path(sys.executable).with_name("stepagent")


def console(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The installed ``stepagent`` console script (not ``python -m``, which would add the cwd itself)."""
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_tools_load_from_the_current_directory_and_history_survives_a_closed_pipe(tmp_path: Path) -> None:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tools.py").write_text(
        textwrap.dedent(
            '''
            from stepagent import tool

            @tool
            def shout(text: str) -> str:
                """Upper-case the text."""
                return text.upper()

            toolset = [shout]
            '''
        )
    )
    endpoint = moto_endpoint()
    thread = f"cwd-{uuid.uuid4().hex[:6]}"
    env = clean_env(AWS_ENDPOINT_URL=endpoint, STEPAGENT_TOOLS="myapp.tools:toolset")
    env.pop("PYTHONPATH", None)
    ran = console("run", "--say", "hi", "--thread", thread, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "not found" not in ran.stderr

    tables = {
        "STEPAGENT_CONVERSATION_TABLE": "stepagent-local-conversation",
        "STEPAGENT_STATE_TABLE": "stepagent-local-state",
        "STEPAGENT_BLOB_BUCKET": "stepagent-local-blobs",
        "AWS_ENDPOINT_URL": endpoint,
    }
    reader = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "history", thread],
        env=clean_env(**tables),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    with reader.stderr:
        reader.stdout.readline()
        reader.stdout.close()  # `| head -1`
        stderr = reader.stderr.read().decode()
    assert reader.wait(timeout=60) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


def test_version_and_help_for_every_import_limit(tmp_path: Path) -> None:
    version = console("--version", env=clean_env(), cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("stepagent ")
    helped = console("import", "--help", env=clean_env(), cwd=tmp_path)
    options = helped.stdout.split("options:", 1)[1]
    for flag in ("--max-line-bytes", "--max-rows", "--max-threads"):
        described = options.split(flag, 1)[1].split("\n  -", 1)[0]
        assert "refuse a file" in described, flag


def test_a_misspelled_setting_is_named_with_the_closest_valid_one(tmp_path: Path) -> None:
    result = stepagent("send", "t", "hi", env=clean_env(STEPAGENT_MODLE="scripted:x.json"))
    assert "unknown setting STEPAGENT_MODLE is ignored; did you mean STEPAGENT_MODEL?" in result.stderr


def test_infra_create_without_credentials_says_any_dummy_keys_work(tmp_path: Path) -> None:
    env = clean_env()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(name)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    result = stepagent("infra", "create", "--endpoint-url", moto_endpoint(), env=env)
    assert result.returncode == 2, result.stderr
    assert "moto and LocalStack accept any dummy keys" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_wrong_toolset_object_is_described_in_plain_english(monkeypatch: pytest.MonkeyPatch) -> None:
    module = type(sys)("wrong_tools")
    module.toolset = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wrong_tools", module)
    with pytest.raises(ConfigurationError, match=r"got an int$"):
        load_toolset("wrong_tools:toolset")


def test_the_text_transcript_marks_closed_threads() -> None:
    items = [
        {"thread_id": "root", "order": 1, "kind": "user", "text": "hi"},
        {"thread_id": "child", "order": 1, "kind": "assistant", "text": "done"},
    ]
    lines = format_transcript(items, root_id="root", closed={"child"})
    assert lines[0] == "── thread root (root)" and "── thread child (closed)" in lines


def test_history_text_uses_the_glyphs_the_chat_shows() -> None:
    """One rendering: `stepagent history` marks each kind as the chat does, results shown whole."""
    long_result = "line one\nline two " + "x" * 400
    items = [
        {"thread_id": "root", "order": 1, "kind": "user", "text": "hi"},
        {"thread_id": "root", "order": 2, "kind": "tool_call", "name": "send", "args": {"to": "b"}},
        {"thread_id": "root", "order": 3, "kind": "tool_result", "text": long_result},
        {"thread_id": "root", "order": 4, "kind": "event", "text": "report"},
        {"thread_id": "root", "order": 5, "kind": "assistant", "text": "done"},
        {"thread_id": "root", "order": 6, "kind": "reasoning", "text": "hmm"},
    ]
    items[1]["approval"] = "approved"
    lines = format_transcript(items, root_id="root")
    assert lines[1:] == [
        "   1 user: hi",
        '   2 ⚙ send({"to": "b"})  ✔ approved',
        f"   3 ← {long_result}",
        "   4 ✉ report",
        "   5 > done",
        "   6 reasoning: hmm",
    ]
    assert item_line(items[1], "root") == 'agent ⚙ send({"to": "b"})'
    assert item_line(items[3], "root") == "agent ✉ report"


def test_os_environ_is_untouched() -> None:
    assert "STEPAGENT_MODLE" not in os.environ


def test_run_uses_the_resources_infra_create_printed() -> None:
    endpoint = moto_endpoint()
    prefix = f"ls-{uuid.uuid4().hex[:8]}"
    created = stepagent("infra", "create", "--endpoint-url", endpoint, "--prefix", prefix, env=clean_env())
    settings = dict(line.split("=", 1) for line in created.stdout.splitlines() if "=" in line)
    thread = f"ls-{uuid.uuid4().hex[:6]}"
    ran = stepagent("run", "--say", "hi", "--thread", thread, env=clean_env(**settings))
    assert ran.returncode == 0, ran.stderr
    assert "using the tables, queues and bucket named by the STEPAGENT_* settings" in ran.stderr
    history = stepagent("history", thread, "--json", env=clean_env(**settings))
    assert history.returncode == 0, history.stderr  # the thread is in the printed tables

    partial = {k: v for k, v in settings.items() if k != "STEPAGENT_TOOL_QUEUE_URL"}
    refused = stepagent("run", "--say", "hi", env=clean_env(**partial))
    assert refused.returncode == 2 and "but not STEPAGENT_TOOL_QUEUE_URL" in refused.stderr
    no_endpoint = {k: v for k, v in settings.items() if k != "AWS_ENDPOINT_URL"}
    refused = stepagent("run", "--say", "hi", env=clean_env(**no_endpoint))
    assert refused.returncode == 2 and "AWS_ENDPOINT_URL is not" in refused.stderr


def test_run_reports_configuration_errors_before_starting_the_stack() -> None:
    for env, expected in (
        (clean_env(STEPAGENT_TOOLS="no_such_module.tools:toolset"), "no_such_module"),
        (clean_env(STEPAGENT_MODEL="anthropic:claude-sonnet-4-6"), "ANTHROPIC_API_KEY"),
        (clean_env(STEPAGENT_MCP_SERVERS="[{"), "STEPAGENT_MCP_SERVERS"),
    ):
        result = stepagent("run", "--say", "hi", env=env)
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr
        assert "starting the embedded local stack" not in result.stderr


def test_a_conversation_survives_restarts_with_a_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # One reply per message (not the demo's tool call and child thread): the point is what is kept.
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [{"when": ".", "on": ["user"], "reply": [{"text": "noted"}]}]}))
    env = clean_env(STEPAGENT_MODEL=f"scripted:{script}")
    first = stepagent("run", "--say", "hi", "--thread", "kept", "--state-dir", str(state), env=env)
    assert first.returncode == 0, first.stderr
    assert f"saved the local state to {state}" in first.stderr
    second = stepagent("run", "--say", "hello again", "--thread", "kept", "--state-dir", str(state), env=env)
    assert second.returncode == 0, second.stderr
    assert "restored the local state" in second.stderr

    history = stepagent("history", "kept", "--json", env=clean_env(STEPAGENT_STATE_DIR=str(state)))
    assert history.returncode == 0, history.stderr
    users = [
        i["text"] for i in json.loads(history.stdout) if i["thread_id"] == "kept" and i["kind"] == "user"
    ]
    assert users == ["hi", "hello again"]

    rewound = stepagent("rewind", "kept", "--to", "1", "--state-dir", str(state), env=env)
    assert rewound.returncode == 0, rewound.stderr
    after = stepagent("history", "kept", "--json", "--state-dir", str(state), env=env)
    assert [i["order"] for i in json.loads(after.stdout) if i["thread_id"] == "kept"] == [1]

    empty = stepagent("history", "kept", "--state-dir", str(tmp_path / "nothing"), env=env)
    assert empty.returncode == 2 and "holds no local state" in empty.stderr


def test_run_says_when_it_gave_up_and_exits_non_zero() -> None:
    """An unreachable model: the last allowed attempt ends in a final error line that does not say
    "retrying", and ``run --say`` exits 1 because an error was shown (it never gives up silently)."""
    env = clean_env(
        STEPAGENT_MODEL="openai:gpt-4o",
        OPENAI_API_KEY="unused",
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",  # nothing listens on the discard port
        STEPAGENT_MAX_RECEIVE_COUNT="1",
    )
    result = stepagent("run", "--say", "hello", env=env)
    assert result.returncode == 1, result.stderr
    final = [line for line in result.stdout.splitlines() if " ! " in line]
    assert final and "Gave up on input message" in final[-1] and "after 1 attempt:" in final[-1]
    assert "retrying" not in final[-1]
