"""Step mode runs each thread as its agent: the configured prompt, limits and built-in tools; the profile a
root's metadata selects, for the root and every descendant; usage committed per step and ``TurnComplete``
when a turn is done; a model the catalog does not know still compacts."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from stepagent import texts
from stepagent.agent_config import AgentConfig, AgentProfile
from stepagent.core.completion import RetryPolicy
from stepagent.core.step import StepConfig
from stepagent.errors import ConfigurationError, UnknownProfileError
from stepagent.events import CompletionFinished, EventCollector, TurnComplete
from stepagent.messages import Compaction, InputMessage, ToolResult
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import Final, ModelInfo, ModelProvider, ModelRequest, StreamEvent, Usage
from stepagent.providers.catalog import DEFAULT_CONTEXT_WINDOW
from stepagent.providers.factory import make_provider
from stepagent.providers.scripted import ScriptedProvider
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.memory import memory_stores
from stepagent.testing import InProcessQueueDriver
from stepagent.tools.base import Tool, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.sleep import Sleep, SleepUntil
from stepagent.usage import thread_usage
from tests.engine.harness import EchoSyncTool, RecordingTool, ReplayProvider, call, no_sleep, text

THREADING = ["spawn_thread", "report_to_parent", "close_thread", "send_message_to_child"]
ALL_BUILTINS = [*THREADING, "cancel_subscription", "sleep_until_event_or_input", "sleep", "sleep_until"]

# The support agent: delegates to a child thread, which reports and closes itself.
SUPPORT_SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "You are now INSIDE the thread",
            "on": ["tool_result"],
            "reply": [
                {"text": "support child at work"},
                {"tool_call": {"name": "report_to_parent", "arguments": {"report": "child report"}}},
            ],
        },
        {
            "when": "^Report sent to parent thread",
            "on": ["tool_result"],
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {"thread_id": "{thread_id}", "report_to_parent": "child done"},
                    }
                }
            ],
        },
        {"when": "has shut down", "on": ["event"], "reply": [{"text": "support: the child finished"}]},
        {"when": "Report from", "on": ["event"], "reply": [{"text": "support: got a report"}]},
        {
            "when": "successfully spawned",
            "on": ["tool_result"],
            "reply": [{"text": "support: child spawned"}],
        },
        {
            "when": "delegate",
            "on": ["user"],
            "reply": [
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "look it up", "child_of": "{thread_stack}"},
                    }
                }
            ],
        },
    ],
    "default": [{"text": "support here"}],
}


@dataclass
class Recording:
    """A provider that records the requests it answers (and which thread asked)."""

    inner: ModelProvider
    requests: list[ModelRequest] = field(default_factory=list)

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        async for event in self.inner.stream(request):
            yield event

    def threads(self) -> list[str]:
        return list(dict.fromkeys(r.thread_stack[-1] for r in self.requests))


class System:
    def __init__(
        self,
        provider: ModelProvider,
        *,
        agent: AgentConfig | None = None,
        tools: list[Tool] | None = None,
        providers: dict[str, ModelProvider] | None = None,
    ) -> None:
        self.conversation, self.state = memory_stores()
        self.sender = InProcessSender()
        self.observer = EventCollector()
        toolset = Toolset.of([*(tools or []), *builtin_tools(), Sleep(), SleepUntil()])
        self.config = StepConfig(
            provider=provider,
            toolset=toolset,
            sender=self.sender,
            agent=agent or AgentConfig(),
            providers=providers or {},
            retry=RetryPolicy(sleep=no_sleep),
        )
        self.driver = InProcessQueueDriver(
            AgentSystem(self.conversation, self.state, self.config), self.sender
        )

    async def say(self, thread: str, text: str, message_id: str, metadata: Any = None) -> None:
        await self.driver.send(
            InputMessage.user_text(thread, text, id=message_id, metadata=metadata), message_id
        )
        for result in await self.driver.run_until_idle(self.observer):
            if result.error is not None:
                raise result.error

    def of(self, kind: type[Any]) -> list[tuple[str, Any]]:
        return [(t, e) for t, e in self.observer.events if isinstance(e, kind)]


def names(request: ModelRequest) -> list[str]:
    return [tool.name for tool in request.tools]


# ---- prompt, limits and built-in tools -----------------------------------------------------------------


async def test_without_configuration_the_prompt_and_tools_are_the_defaults() -> None:
    provider = ReplayProvider().then(*text("ok"))
    system = System(provider)
    await system.say("t1", "hi", "m1")
    (request,) = provider.requests
    suffix = texts.THREAD_SUFFIX.format(root_thread_id="t1")
    assert request.system == texts.DEFAULT_SYSTEM_PROMPT + suffix
    assert names(request) == ALL_BUILTINS
    assert request.max_tokens is None and request.temperature is None
    assert request.output_limit == provider.info.max_output_tokens


async def test_the_configured_prompt_limits_and_builtins_reach_every_request() -> None:
    provider = ReplayProvider().then(*text("ok"))
    agent = AgentConfig(system_prompt="You file expense reports.\n", max_tokens=512, temperature=0.3,
                        builtin_tools="none")  # fmt: skip
    system = System(provider, agent=agent, tools=[RecordingTool(tool_name="lookup")])
    await system.say("t1", "hi", "m1")
    (request,) = provider.requests
    # The configured prompt replaces the intro; only the guidance for what is offered follows.
    assert request.system == (
        "You file expense reports.\n\n" + texts.GUIDE_TOOLS + texts.THREAD_SUFFIX.format(root_thread_id="t1")
    )
    assert names(request) == ["lookup"]  # your tools, no built-ins
    assert (request.max_tokens, request.temperature, request.output_limit) == (512, 0.3, 512)


async def test_threading_guidance_and_tools_only_when_the_threading_tools_are_offered() -> None:
    provider = ReplayProvider().then(*text("ok")).then(*text("ok"))
    system = System(provider, agent=AgentConfig(system_prompt="Be a bot.", builtin_tools="timers"))
    await system.say("t1", "hi", "m1")
    assert names(provider.requests[0]) == ["sleep", "sleep_until"]
    assert "spawn_thread" not in provider.requests[0].system
    system = System(provider, agent=AgentConfig(system_prompt="Be a bot.", builtin_tools="threads"))
    await system.say("t2", "hi", "m1")
    assert names(provider.requests[1]) == THREADING
    assert texts.GUIDE_SPAWN in provider.requests[1].system and "Be a bot." in provider.requests[1].system


async def test_a_model_call_to_a_builtin_that_is_not_offered_is_an_unknown_tool() -> None:
    provider = ReplayProvider().then(call("spawn_thread", "c1", instructions="x"), Final()).then(*text("ok"))
    system = System(provider, agent=AgentConfig(builtin_tools="none"))
    await system.say("t1", "hi", "m1")
    assert await system.conversation.children("t1") == []  # nothing was spawned
    assert texts.UNKNOWN_TOOL.format(name="spawn_thread") in str(provider.requests[1].history[-1])


async def test_children_can_always_report_and_close() -> None:
    script = Recording(ScriptedProvider(SUPPORT_SCRIPT))
    # Only spawn_thread is selected: the root is offered just that, a child also report_to_parent and
    # close_thread (in toolset order), so it can still finish.
    system = System(script, agent=AgentConfig(builtin_tools="spawn_thread"))
    await system.say("root", "please delegate", "m1")
    root, child = script.threads()
    by_thread = {r.thread_stack[-1]: names(r) for r in script.requests}
    assert by_thread[root] == ["spawn_thread"]
    assert by_thread[child] == ["spawn_thread", "report_to_parent", "close_thread"]
    info = await system.conversation.get_thread(child)
    assert info is not None and info.closed  # the child reported and closed itself


# ---- profiles ------------------------------------------------------------------------------------------


def support_profile(**overrides: Any) -> AgentProfile:
    values: dict[str, Any] = {
        "name": "support",
        "system_prompt": "You are the support agent.",
        "model": "scripted:support",
        "tools": ("crm_*",),
        "builtin_tools": frozenset(THREADING),
        "max_tokens": 777,
        "temperature": 0.1,
    }
    return AgentProfile(**(values | overrides))


async def test_a_profile_chosen_by_the_roots_metadata_serves_the_root_and_its_children() -> None:
    default = Recording(ScriptedProvider({"default": [{"text": "default agent"}]}))
    support = Recording(ScriptedProvider(SUPPORT_SCRIPT))
    tools: list[Tool] = [RecordingTool(tool_name="crm_find"), RecordingTool(tool_name="billing")]
    agent = AgentConfig(system_prompt="You are the default agent.", profiles={"support": support_profile()})
    system = System(default, agent=agent, tools=tools, providers={"scripted:support": support})

    await system.say("conv", "please delegate", "m1", metadata={"profile": "support", "user_id": "u1"})

    assert default.requests == []  # the default agent never ran
    root, child = support.threads()
    assert root == "conv" and child != root
    for request in support.requests:
        assert request.system.startswith("You are the support agent.")
        assert (request.max_tokens, request.temperature) == (777, 0.1)
        assert "billing" not in names(request) and "crm_find" in names(request)
    usage = await thread_usage(system.conversation, "conv")
    assert usage is not None and list(usage.threads) == ["conv", child]
    assert list(usage.models) == [support.info.name] and usage.total.completions == len(support.requests)
    # The child's steps all end on an open call (report_to_parent, then close_thread): only the root's
    # turns complete — after the spawn, the report and the shut-down notice.
    done = system.of(TurnComplete)
    assert [thread for thread, _ in done] == ["conv", "conv", "conv"]
    assert all(event.model == support.info.name for _, event in done)

    # A later message without metadata keeps the profile (metadata changes only when a message sets it).
    await system.say("conv", "thanks", "m2")
    assert default.requests == [] and support.requests[-1].thread_stack == ["conv"]


async def test_a_profile_inherits_what_it_does_not_set() -> None:
    provider = ReplayProvider().then(*text("ok"))
    agent = AgentConfig(
        system_prompt="Default prompt.",
        max_tokens=100,
        temperature=0.5,
        context_window=5000,
        profiles={"terse": AgentProfile(name="terse", system_prompt="One word answers.")},
    )
    system = System(provider, agent=agent)
    await system.say("t1", "hi", "m1", metadata={"profile": "terse"})
    (request,) = provider.requests
    assert request.system.startswith("One word answers.")
    assert (request.max_tokens, request.temperature, request.model.context_window) == (100, 0.5, 5000)
    assert names(request) == ALL_BUILTINS


async def test_an_unknown_profile_rejects_the_input_and_writes_nothing() -> None:
    provider = ReplayProvider()
    system = System(
        provider, agent=AgentConfig(profiles={"support": support_profile(model=None, tools=None)})
    )
    with pytest.raises(UnknownProfileError) as caught:
        await system.say("t1", "hi", "m1", metadata={"profile": "sales"})
    assert "'sales'" in str(caught.value) and "support" in str(caught.value)
    assert caught.value.disposition == "reject"
    assert await system.conversation.get_thread("t1") is None and provider.requests == []


def test_a_profile_that_cannot_be_served_fails_when_the_config_is_built() -> None:
    agent = AgentConfig(profiles={"support": support_profile(tools=("crm_*", "nothing_like_this"))})
    with pytest.raises(ConfigurationError) as caught:
        System(ReplayProvider(), agent=agent, tools=[RecordingTool(tool_name="crm_find")])
    lines = str(caught.value).splitlines()
    assert len(lines) == 2
    assert "'scripted:support'" in lines[0] and "no provider" in lines[0]
    assert "'nothing_like_this'" in lines[1] and "crm_find" in lines[1]


# ---- usage and the end of a turn -----------------------------------------------------------------------


async def test_usage_is_committed_per_step_and_turn_complete_marks_the_end_of_a_turn() -> None:
    lookup = RecordingTool(tool_name="lookup")
    provider = (
        ReplayProvider()
        .then(call("echo_sync", "s1", text="a"), Final(usage=Usage(100, 5, cache_read_tokens=40)))
        .then(call("lookup", "c1", q="x"), Final(usage=Usage(150, 7)))
        .then(*text("it is 42", usage=Usage(200, 3, cache_write_tokens=9)))
    )
    system = System(provider, tools=[EchoSyncTool(), lookup])
    await system.say("t1", "what is it?", "m1")
    # The first step ran two model calls (a synchronous tool in between) and ends on an open call.
    assert system.of(TurnComplete) == []
    (first,) = [r async for r in system.conversation.usage_records("t1")]
    assert (first.input_tokens, first.output_tokens, first.cache_read_tokens, first.completions) == (
        250,
        12,
        40,
        2,
    )
    assert not first.turn_complete and first.step_id == "m1" and first.model == "replay"
    [(_, finished)] = system.of(CompletionFinished)
    assert finished.usage == Usage(150, 7) and finished.step_usage == Usage(250, 12, 40, 0)  # last vs sum

    await system.driver.send(InputMessage.tool_result("t1", ToolResult.text("c1", "42")), "r1")
    await system.driver.run_until_idle(system.observer)
    [(thread, done)] = system.of(TurnComplete)
    second = [r async for r in system.conversation.usage_records("t1", after_version=first.version)]
    assert [r.turn_complete for r in second] == [True]
    info = await system.conversation.get_thread("t1")
    assert info is not None
    assert thread == "t1" and done == TurnComplete(Usage(200, 3, 0, 9), "replay", "r1", second[0].version)
    assert done.version == info.version  # the commit that stored it
    events = [e for t, e in system.observer.events if t == "t1"]
    assert events[-1] == done  # the last event of its step

    usage = await thread_usage(system.conversation, "t1")
    assert usage is not None
    assert usage.total.as_dict() == {"input_tokens": 450, "output_tokens": 15, "cache_read_tokens": 40,
                                     "cache_write_tokens": 9, "completions": 3, "steps": 2}  # fmt: skip


# ---- a model the catalog does not know -----------------------------------------------------------------


def openai_stream(prompt_tokens: int) -> bytes:
    chunks = [
        {
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": None}
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2}},
    ]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


@pytest.mark.parametrize(("window", "compacts"), [(None, True), (1_000_000, False)])
async def test_an_unknown_model_gets_the_default_window_and_compaction_stays_on(
    window: int | None, compacts: bool, caplog: pytest.LogCaptureFixture
) -> None:
    used = int(DEFAULT_CONTEXT_WINDOW * 0.8)  # past 75% of the default window, far below a real one
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=openai_stream(used))

    env = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://llm.test/v1"}
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        with caplog.at_level(logging.WARNING, logger="stepagent.providers.factory"):
            provider = make_provider(
                "openai:house-model-13b", environ=env, http_client=client, context_window=window
            )
        system = System(provider, agent=AgentConfig(context_window=window))
        [result] = await system.driver.system.step([(InputMessage.user_text("t1", "hi", id="m1"), "m1")])
    assert result.ok and provider.info.context_window == (window or DEFAULT_CONTEXT_WINDOW)
    warned = [r.getMessage() for r in caplog.records if "house-model-13b" in r.getMessage()]
    assert bool(warned) is (window is None)  # a warning at start only when the window is unknown
    queued = system.sender.drain()
    requests = [q for q in queued if isinstance(q.message.synthetic, Compaction)]
    assert bool(requests) is compacts
    assert bodies and bodies[0]["model"] == "house-model-13b"


async def test_in_python_a_profile_may_name_a_provider_object() -> None:
    default, chosen = ReplayProvider(), ReplayProvider().then(*text("from the profile"))
    agent = AgentConfig(profiles={"p": AgentProfile(name="p", model=chosen, context_window=4321)})
    system = System(default, agent=agent)
    await system.say("t1", "hi", "m1", metadata={"profile": "p"})
    assert default.requests == [] and len(chosen.requests) == 1
    assert chosen.requests[0].model.context_window == 4321
