"""The agent settings through the real worker on moto: a profile chosen by a root's metadata serves the root
and its children; ``turn_complete`` is published after the answer and re-published identically when its
step is redelivered; ``stepagent usage`` reads the totals; bad agent settings stop the cold start."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepagent.aws.runtime import AwsRuntime
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError, QueueError
from stepagent.messages import InputMessage
from stepagent.usage import thread_usage
from tests.conftest import aws_client, unique_name
from tests.engine.test_agents import SUPPORT_SCRIPT, Recording
from tests.integration.aws_helpers import _env_of, aws_stack, create_resources, delete_resources, script_file
from tests.integration.test_cli import ROOT, clean_env
from tests.integration.test_worker import tid


async def test_a_profile_selected_by_metadata_serves_the_root_and_its_children(tmp_path: Path) -> None:
    support_model = f"scripted:{script_file(SUPPORT_SCRIPT)}"
    (tmp_path / "support.md").write_text("You are the support agent of ACME.")
    profiles = {"support": {"system_prompt": "@support.md", "model": support_model, "max_tokens": 321}}
    (tmp_path / "profiles.json").write_text(json.dumps(profiles))
    env = {
        "STEPAGENT_PROFILES": f"@{tmp_path / 'profiles.json'}",
        "STEPAGENT_SYSTEM_PROMPT": "Default agent.",
    }
    async with aws_stack(env=env) as stack:
        runtime = stack.runtime
        assert set(runtime.profile_providers) == {support_model}  # built at cold start
        recording = runtime.profile_providers[support_model] = Recording(
            runtime.profile_providers[support_model]
        )
        root = tid("support")
        message = InputMessage.user_text(root, "please delegate", id="m1", metadata={"profile": "support"})
        await runtime.sender.send(message, "m1")
        await stack.pump()

        root_texts = await stack.texts(root)
        assert "support: child spawned" in root_texts and "support: the child finished" in root_texts
        [child] = [info.thread_id for info in await runtime.conversation.children(root)]
        assert "support child at work" in await stack.texts(child)
        assert recording.threads() == [root, child]  # every model call of the tree went to the profile
        for request in recording.requests:
            assert request.system.startswith("You are the support agent of ACME.")
            assert request.max_tokens == 321

        events = await stack.outputs()
        assert all(e["metadata"] == {"profile": "support"} and e["root_thread_id"] == root for e in events)
        assert {e["thread_id"] for e in events} == {root, child}
        done = [e for e in events if e["type"] == "turn_complete"]
        assert done and all(e["model"] == support_model and e["thread_id"] == root for e in done)
        usage = await thread_usage(runtime.conversation, root)
        assert usage is not None and list(usage.models) == [support_model]
        assert list(usage.threads) == [root, child] and usage.threads[child].completions > 0
        assert usage.total.completions == len(recording.requests)


async def test_an_unknown_profile_is_rejected_with_an_error_event_and_not_retried() -> None:
    async with aws_stack(env={"STEPAGENT_PROFILES": json.dumps({"support": {}})}) as stack:
        thread = tid()
        message = InputMessage.user_text(thread, "hi", id="m1", metadata={"profile": "sales"})
        await stack.runtime.sender.send(message, "m1")
        await stack.pump()
        [error] = await stack.outputs()
        assert error["type"] == "error" and error["retrying"] is False
        assert "'sales'" in error["message"] and "support" in error["message"]
        [copy] = await stack.receive(stack.resources.input_dlq_url)
        assert "'sales'" in copy["MessageAttributes"]["stepagent_error"]["StringValue"]
        assert await stack.runtime.conversation.get_thread(thread) is None


async def test_turn_complete_is_republished_identically_when_its_step_is_redelivered() -> None:
    thread = tid()
    async with aws_stack() as stack:
        publisher = stack.runtime.worker.publisher
        real_publish = publisher.publish
        failed: list[list[str]] = []

        async def lose_the_turn_complete_once(thread_id: str, events: Any, **options: Any) -> None:
            if not failed and any(e["type"] == "turn_complete" for e in events):
                failed.append([e["type"] for e in events])
                raise QueueError("injected output failure after the commit")
            await real_publish(thread_id, events, **options)

        publisher.publish = lose_the_turn_complete_once  # type: ignore[method-assign]
        await stack.send_user(thread, "what is the weather?", "m1")
        await stack.pump()
        first = [e for e in await stack.outputs() if e["type"] != "error"]
        records = [r async for r in stack.runtime.conversation.usage_records(thread)]
        first_model = stack.settings.model
    assert failed == [["tool_result", "text", "turn_complete"]]  # the answering step's events were lost
    async with aws_stack() as clean:
        await clean.send_user(thread, "what is the weather?", "m1")
        await clean.pump()
        second = await clean.outputs()
        second_model = clean.settings.model
    # (The lost tool_result row event is docs/reliability.md's known weakness 1; turn_complete is not lost.)
    assert [e["type"] for e in first][-2:] == ["text", "turn_complete"]
    [done] = [e for e in first if e["type"] == "turn_complete"]
    [clean_done] = [e for e in second if e["type"] == "turn_complete"]
    assert (done.pop("model"), clean_done.pop("model")) == (
        first_model,
        second_model,
    )  # each stack's script file
    assert done == clean_done  # the same id and the same usage: the redelivery replayed it exactly
    assert [e for e in first if e["type"] == "text"] == [e for e in second if e["type"] == "text"]
    last = records[-1]
    assert done["usage"] == {
        "input_tokens": last.input_tokens,
        "output_tokens": last.output_tokens,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert [r.turn_complete for r in records] == [False, True]


async def test_stepagent_usage_prints_a_thread_trees_totals() -> None:
    async with aws_stack() as stack:
        thread = tid()
        await stack.send_user(thread, "please delegate", "m1")
        await stack.pump()
        expected = await thread_usage(stack.runtime.conversation, thread)
        assert expected is not None and len(expected.threads) == 2
        env = clean_env(**_env_of(stack.settings))

        def usage(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "stepagent.cli", "usage", *args],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip

        as_json, human, missing = await asyncio.gather(
            asyncio.to_thread(usage, thread, "--json"),
            asyncio.to_thread(usage, thread),
            asyncio.to_thread(usage, "no-such-thread"),
        )
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == expected.as_dict()
    assert json.loads(as_json.stdout)["total"]["input_tokens"] == expected.total.input_tokens > 0
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].startswith(f"thread {thread} (2 threads): {expected.total.input_tokens:,} input tokens")
    model = stack.settings.model
    assert model is not None and any(line.strip().startswith(f"{model}: ") for line in lines)
    assert missing.returncode == 1 and "no thread 'no-such-thread'" in missing.stderr


async def test_bad_agent_settings_stop_the_cold_start_with_one_line_each() -> None:
    async with aws_client("sqs") as sqs, aws_client("s3") as s3, aws_client("dynamodb") as dynamodb:
        resources, settings = await create_resources(sqs, s3, dynamodb, unique_name("sa"))
        try:
            env = {
                **_env_of(settings),
                "STEPAGENT_MAX_TOKENS": "-3",
                "STEPAGENT_TEMPERATURE": "hot",
                "STEPAGENT_BUILTIN_TOOLS": "threads,sleepy",
                "STEPAGENT_SYSTEM_PROMPT": "@/nonexistent/prompt.md",
            }
            with pytest.raises(ConfigurationError) as caught:
                await AwsRuntime.create(Settings.from_env(env))
            lines = str(caught.value).splitlines()
            assert sorted(line.split("=")[0].split(" ")[0] for line in lines) == sorted(
                [
                    "STEPAGENT_MAX_TOKENS",
                    "STEPAGENT_TEMPERATURE",
                    "STEPAGENT_BUILTIN_TOOLS",
                    "STEPAGENT_SYSTEM_PROMPT",
                ]
            )
        finally:
            await delete_resources(sqs, dynamodb, resources, settings)
