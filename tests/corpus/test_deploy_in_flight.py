"""A deploy while threads are in flight.

Some two hundred threads of the corpus agent (:mod:`tests.corpus.scenarios`) are left at every waiting
point — a queued tool, an approval, a short timer, a long timer, a child thread, a claim-checked result —
by one instance of the worker, tool runner and timer relay. Those are then replaced by new instances (a
deploy: every Lambda container is new), once with the same configuration and once with a configuration
that changes the agent's prompt and adds a tool, and the threads are driven to their end: none stuck,
none answered twice, none dead-lettered. With the changed configuration, every model call after the
deploy sees the new prompt and tools: a deploy applies them from each thread's next step.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stepagent.aws.runtime import AwsRuntime
from stepagent.aws.settings import Settings
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent
from stepagent.providers.scripted import ScriptedProvider
from stepagent.tools.functions import tool
from tests.corpus import record, replay
from tests.corpus.scenarios import AGENT_ENV, SCRIPT, TOOLS, WAITING
from tests.integration.aws_helpers import Stack, aws_stack, lambda_record

pytestmark = pytest.mark.slow

#: Threads per waiting point (six points: 180 threads, plus 30 children).
PER_POINT = 30
NEW_PROMPT = "You are the agent of the new release."


@tool
def lookup_v2(topic: str) -> str:
    """Data on a topic, from the new release's source.

    Args:
        topic: The topic.
    """
    return f"Data on {topic}: 43"


class Recording:
    """The scripted model, noting the system prompt and tool names of every request."""

    def __init__(self, script: dict[str, Any]) -> None:
        self.inner = ScriptedProvider(script)
        self.requests: list[tuple[str, frozenset[str]]] = []

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append((request.system, frozenset(t.name for t in request.tools)))
        async for event in self.inner.stream(request):
            yield event


def threads() -> list[tuple[str, str, str]]:
    """(thread, user text, text it ends with) of every thread started."""
    return [(f"{w.thread}-{n}", w.say, w.ends_with) for w in WAITING for n in range(PER_POINT)]


async def leave_all_waiting(stack: Stack) -> None:
    for thread, say, _ in threads():
        await stack.send_user(thread, say, f"{thread}-1")
    await record.pump_queue(stack, "input")
    # Only the big results run: they wait on the input queue, claim-checked; every other call stays queued.
    tool_url = record.queue_url(stack, "tool")
    while messages := await stack.receive(tool_url):
        big = [m for m in messages if json.loads(m["Body"]).get("tool_name") == "big_payload"]
        for message in big:  # one at a time: moto's S3 mishandles concurrent puts of one key
            event = {"Records": [lambda_record(message)]}
            await stack.ack(tool_url, event, await stack.runtime.handle_tool_batch(event))
        if len(big) == len(messages):
            continue
        for message in messages:
            if message not in big:
                await stack.sqs.change_message_visibility(
                    QueueUrl=tool_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )
        break


async def deploy(stack: Stack, env: dict[str, str], provider: Recording, tools: list[Any]) -> None:
    """Replace the worker, tool runner and timer relay with new instances (new containers)."""
    old = stack.runtime
    settings = Settings.from_env({**_env(old.settings), **env})
    stack.runtime = await AwsRuntime.create(settings, provider=provider, tools=tools)
    await old.aclose()


def _env(settings: Settings) -> dict[str, str]:
    from tests.integration.aws_helpers import _env_of

    return _env_of(settings)


async def test_two_deploys_with_threads_waiting_at_every_point() -> None:
    before = Recording(SCRIPT)
    async with aws_stack(script=SCRIPT, env=AGENT_ENV, provider=before) as stack:
        await leave_all_waiting(stack)
        await stack.wait_visible(record.queue_url(stack, "delay"))
        assert not await replay.dead_letters(stack)

        # Deploy 1, the same configuration: the new instances take over mid-flight (one batch per queue)...
        same = Recording(SCRIPT)
        await deploy(stack, {}, same, list(TOOLS))
        for url, handler in reversed(stack.handlers()):  # delay, tool, then input: results get answered
            event = await stack.receive_event(url)
            await stack.ack(url, event, await handler(event))

        # ...deploy 2 changes the prompt and adds a tool, and drives every thread to its end.
        after = Recording(SCRIPT)
        await deploy(stack, {"STEPAGENT_SYSTEM_PROMPT": NEW_PROMPT}, after, [*TOOLS, lookup_v2])
        # The long timers are due; the deployment's Scheduler delivers them to the new worker.
        await stack.runtime.deliver_due_schedules(now=_far_future())
        await replay.continue_threads(stack, [t for t, _, _ in threads()])

        assert await replay.dead_letters(stack) == [], "a message was dead-lettered"
        events = await stack.outputs()
        for thread, _, ends_with in threads():
            said = await stack.texts(thread)
            assert said.count(ends_with) == 1, f"{thread}: {said[-6:]}"
            info = await stack.runtime.conversation.get_thread(thread)
            assert info is not None and info.turn_complete, f"{thread} is stuck"
        endings = {end for _, _, end in threads()}
        answers = Counter(e["thread_id"] for e in events if e["type"] == "text" and e.get("text") in endings)
        assert set(answers) == {t for t, _, _ in threads()}, "a thread never answered"
        assert not {t: n for t, n in answers.items() if n > 1}, "a thread answered twice"
        # The new prompt and tools apply from each thread's next step: every model call after deploy 2.
        assert same.requests and after.requests
        assert not any(NEW_PROMPT in system for system, _ in before.requests + same.requests)
        assert all(NEW_PROMPT in system and "lookup_v2" in names for system, names in after.requests)


def _far_future() -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) + timedelta(days=1)
