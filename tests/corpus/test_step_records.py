"""Each commit records the release that made it and the agent configuration it ran, and ``stepagent
configs`` tells which open threads last stepped under another configuration (after a deploy, those whose
next step will run the new prompt and tools)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepagent.aws.runtime import AwsRuntime
from stepagent.aws.settings import Settings
from stepagent.cli import main
from stepagent.formats import running_release
from tests.corpus import record
from tests.corpus.scenarios import AGENT_ENV, SCRIPT
from tests.integration.aws_helpers import Stack, _env_of, aws_stack


async def head(stack: Stack, thread: str) -> dict[str, Any]:
    items = await record.scan(stack, stack.settings.conversation_table)
    [found] = [i for i in items if i["pk"]["S"] == thread and i["sk"]["S"] == "HEAD"]
    return found


async def test_commits_record_release_and_configuration_and_configs_lists_the_older_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with aws_stack(script=SCRIPT, env=AGENT_ENV) as stack:
        await stack.send_user("t-old", "pay the bill", "m1")  # left waiting for approval
        await stack.send_user("t-both", "look up the tides", "m2")
        await stack.pump()
        first = await head(stack, "t-both")
        assert first["rel"] == {"S": running_release()}
        config_1 = first["cfg"]["S"]
        assert first["cfg0"]["S"] == config_1 and len(config_1) == 12
        usage = [
            i
            for i in await record.scan(stack, stack.settings.conversation_table)
            if i["sk"]["S"].startswith("U#")
        ]
        assert usage and all(i["rel"] == {"S": running_release()} for i in usage)

        # A deploy with another prompt: the next step records the new configuration, the start stays.
        old = stack.runtime
        settings = Settings.from_env({**_env_of(old.settings), "STEPAGENT_SYSTEM_PROMPT": "Be brief."})
        stack.runtime = await AwsRuntime.create(settings)
        await old.aclose()
        await stack.send_user("t-both", "look up the tides", "m3")
        await stack.pump()
        second = await head(stack, "t-both")
        config_2 = second["cfg"]["S"]
        assert config_2 != config_1 and second["cfg0"]["S"] == config_1
        assert (await head(stack, "t-old"))["cfg"]["S"] == config_1

        monkeypatch.setenv("STEPAGENT_CONVERSATION_TABLE", str(stack.settings.conversation_table))
        monkeypatch.setenv("STEPAGENT_STATE_TABLE", str(stack.settings.state_table))
        monkeypatch.setenv("AWS_ENDPOINT_URL", str(stack.settings.endpoint_url))
        capsys.readouterr()
        assert await _run(["configs", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["current"] == config_2
        assert [t["thread_id"] for t in report["threads"]] == ["t-old"]
        [waiting] = report["threads"]
        assert (
            waiting["waiting"] and waiting["config"] == config_1 and waiting["release"] == running_release()
        )
        assert await _run(["configs"]) == 0
        text = capsys.readouterr().out
        assert "1 of 2 open threads last stepped under another one" in text and "t-old" in text


async def _run(argv: list[str]) -> int:
    import asyncio

    return await asyncio.to_thread(main, argv)
