"""The terminal's questions from a tool (MCP elicitation): the ``?`` line with the form's fields, the typed
answers (a JSON object, a one-field form's value, ``n``, ``c``; ``y`` for a page to open), and
``stepagent run --say`` answering a real loopback MCP server's question from standard input, for a
2026-07-28 server and an older one."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from stepagent.client.api import Client
from stepagent.client.terminal import Activity, Chat, Screen, input_hint, parse_input_answer
from stepagent.rap.server import serve_in_background
from stepagent.transcript import Item
from tests.integration.test_cli import ROOT, clean_env
from tests.mcp.fixtures.eras import Recorder, build, recording

ASKED: Item = {
    "thread_id": "conv",
    "kind": "input",
    "tool_call_id": "c1",
    "text": "Why should I delete it?",
    "requested_schema": {
        "type": "object",
        "properties": {"reason": {"type": "string"}},
        "required": ["reason"],
    },
}


def test_the_question_and_the_typed_answers() -> None:
    assert input_hint(ASKED).startswith("  {reason: string}")
    assert parse_input_answer("it is old", ASKED) == ("accept", {"reason": "it is old"})
    assert parse_input_answer('{"reason": "x"}', ASKED) == ("accept", {"reason": "x"})
    assert parse_input_answer("n", ASKED) == ("decline", None)
    assert parse_input_answer(" cancel ", ASKED) == ("cancel", None)
    counted: Item = {**ASKED, "requested_schema": {"properties": {"n": {"type": "integer"}}}}
    assert parse_input_answer("3", counted) == ("accept", {"n": 3})
    with pytest.raises(ValueError, match="n must be a integer"):
        parse_input_answer("three", counted)
    two: Item = {**ASKED, "requested_schema": {"properties": {"a": {}, "b": {}}}}
    with pytest.raises(ValueError, match="JSON object"):
        parse_input_answer("just text", two)
    page: Item = {
        "thread_id": "conv",
        "kind": "input",
        "tool_call_id": "c2",
        "text": "Pay",
        "url": "https://p",
    }
    assert parse_input_answer("y", page) == ("accept", None)
    assert "open https://p" in input_hint(page)


def test_chat_asks_and_a_result_ends_the_question() -> None:
    out = io.StringIO()
    chat = Chat(cast(Client, None), "conv", Screen(out, interactive=False), Activity("conv"))
    chat.show(cast(dict[str, Any], ASKED))
    assert "agent ? Why should I delete it?" in out.getvalue() and chat.activity.asking == ASKED
    assert "waiting for your answer" in str(chat.activity.status(80))
    chat.show({"thread_id": "conv", "kind": "tool_result", "tool_call_id": "c1", "text": "done"})
    assert chat.activity.asking is None


SCRIPT = {
    "rules": [
        {
            "when": "delete",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "web__confirm_delete", "arguments": {"path": "a.txt"}}}],
        },
        {"when": "^deleted", "on": ["tool_result"], "reply": [{"text": "Done."}]},
        {"when": "^kept", "on": ["tool_result"], "reply": [{"text": "Left it."}]},
    ],
    "default": [{"text": "ok"}],
}


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "older"])
@pytest.mark.parametrize(
    ("typed", "result"), [("it is old", "deleted a.txt because it is old"), ("n", "kept a.txt")]
)
async def test_run_say_answers_a_servers_question_from_standard_input(
    tmp_path: Path, legacy: bool, typed: str, result: str
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    app = recording(build().streamable_http_app(), Recorder(), legacy=legacy)
    async with serve_in_background(app) as base:
        env = clean_env(
            STEPAGENT_MODEL=f"scripted:{script}",
            STEPAGENT_MCP_SERVERS=json.dumps([{"name": "web", "url": f"{base}/mcp"}]),
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "stepagent.cli",
            "run",
            "--say",
            "delete a.txt",
            env=env,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(f"{typed}\n".encode()), 180)
    shown = out.decode()
    assert process.returncode == 0, shown + err.decode()
    assert "agent ? Why should I delete it?" in shown and "{reason: string}" in shown
    assert f"you > {typed}" in shown
    assert f"agent ← {result}" in shown
