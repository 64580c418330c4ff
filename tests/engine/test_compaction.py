"""Step-mode compaction: the automatic trigger, the durable claim, summaries, children and references."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from stepagent.core.history import HistoryManager
from stepagent.events import CompactionApplied, Info, StepFailed, TurnComplete
from stepagent.history_items import EventItem, Summary, ToolCallItem, UserItem
from stepagent.ids import child_thread_id
from stepagent.messages import Compaction, InputMessage, TextContent
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import ThreadKind
from tests.engine.harness import Harness

LONG = "x" * 1000  # 250 tokens for the scripted model (one token per 4 characters)


@dataclass
class Recording:
    """Wraps a provider and keeps every request."""

    inner: ScriptedProvider
    requests: list[ModelRequest] = field(default_factory=list)

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        async for event in self.inner.stream(request):
            yield event


def compacting_script(**extra: Any) -> dict[str, Any]:
    return {
        "context_window": 2000,
        "rules": [
            {
                "when": "INSIDE a compaction thread",
                "reply": [
                    {
                        "tool_call": {
                            "name": "close_thread",
                            "arguments": {"thread_id": "{thread_id}", "report_to_parent": "SUMMARY"},
                        }
                    }
                ],
            },
            *extra.get("rules", []),
        ],
        "default": [{"text": "ok"}],
    }


def compaction_children(h: Harness, parent: str) -> list[str]:
    backend = h.conversation.backend
    return [
        t for t, i in backend.threads.items() if i.parent_id == parent and i.kind == ThreadKind.COMPACTION
    ]


async def test_long_conversation_compacts_twice_and_reload_matches() -> None:
    provider = Recording(ScriptedProvider(compacting_script()))
    h = Harness(provider)
    sent = 0
    while len(compaction_children(h, "t1")) < 2:
        assert sent < 12, "two compactions should happen within a dozen long messages"
        await h.say("t1", f"message {sent} {LONG}", f"m{sent}")
        sent += 1
    children = compaction_children(h, "t1")
    assert all(h.conversation.backend.threads[c].closed for c in children)
    summaries = h.conversation.backend.summaries["t1"]
    first, second = sorted(summaries)
    assert summaries[first] == summaries[second] == "SUMMARY"
    assert 0 < first < second
    assert sum(isinstance(e, CompactionApplied) for e in h.observer.of("t1")) == 2

    history = await h.history("t1")
    assert history[0] == Summary("SUMMARY", second)
    assert len(history) < 2 * sent  # the summary replaced the covered rows
    # The second compaction child was shown the first summary, not the rows it covers.
    second_child = next(c for c in children if h.conversation.backend.threads[c].spawn_order == second)
    (seen,) = [r.history for r in provider.requests if r.thread_stack[-1] == second_child]
    assert seen[0] == Summary("SUMMARY", first)
    assert not any(isinstance(i, UserItem) and "message 0 " in (i.text or "") for i in seen)


async def test_in_memory_apply_equals_a_fresh_load() -> None:
    """A manager that applies a summary in memory (local mode keeps one while the summary lands) must
    hold exactly what a fresh load of the stored transcript gives."""
    h = Harness(ScriptedProvider({"rules": [], "default": [{"text": "ok"}]}))
    for index in range(4):
        await h.say("t1", f"message {index}", f"m{index}")
    resident = await HistoryManager.load(h.conversation, h.state, "t1")
    await h.conversation.save_summary("t1", Summary("SUMMARY", 5))
    assert await resident.apply_compaction()
    fresh = await HistoryManager.load(h.conversation, h.state, "t1")
    assert resident.history == fresh.history
    assert resident.history[0] == Summary("SUMMARY", 5) and len(fresh.history) == 1 + 8 - 5


async def test_child_spawned_before_compaction_keeps_its_exact_prefix() -> None:
    script = compacting_script(
        rules=[
            {
                "when": "delegate",
                "reply": [
                    {
                        "tool_call": {
                            "name": "spawn_thread",
                            "arguments": {"instructions": "wait", "child_of": "{thread_stack}"},
                        }
                    }
                ],
            },
            {"when": "You are now INSIDE the thread", "reply": [{"text": "child waiting"}]},
        ]
    )
    h = Harness(ScriptedProvider(script))
    await h.say("t1", "please delegate", "m0")
    (child,) = [t for t, i in h.conversation.backend.threads.items() if i.parent_id == "t1"]
    before = await h.history(child)
    for index in range(1, 8):
        await h.say("t1", f"message {index} {LONG}", f"m{index}")
    assert compaction_children(h, "t1")
    assert (await h.history("t1"))[0] == Summary("SUMMARY", max(h.conversation.backend.summaries["t1"]))
    assert await h.history(child) == before


async def test_report_for_a_compacted_spawn_call_is_still_delivered() -> None:
    script = compacting_script(
        rules=[
            {
                "when": "delegate",
                "reply": [
                    {
                        "tool_call": {
                            "name": "spawn_thread",
                            "arguments": {"instructions": "report later", "child_of": "{thread_stack}"},
                        }
                    }
                ],
            },
            {"when": "You are now INSIDE the thread", "reply": [{"text": "child waiting"}]},
            {
                "when": "report now",
                "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "late news"}}}],
            },
        ]
    )
    h = Harness(ScriptedProvider(script))
    await h.say("t1", "please delegate", "m0")
    spawn = next(i for i in await h.history("t1") if isinstance(i, ToolCallItem))
    child = child_thread_id("t1", spawn.call.id)
    for index in range(1, 8):
        await h.say("t1", f"message {index} {LONG}", f"m{index}")
    assert h.conversation.backend.summaries["t1"]
    assert not any(isinstance(i, ToolCallItem) and i.call.id == spawn.call.id for i in await h.history("t1"))

    await h.say(child, "report now", "c1")
    events = [i for i in await h.history("t1") if isinstance(i, EventItem)]
    assert [e.result.first_text() for e in events] == ["Report from child thread: late news"]
    assert events[0].tool_call_id == spawn.call.id
    assert events[0].invocation is not None
    assert events[0].invocation.arguments["original_tool_name"] == "spawn_thread"


async def test_compaction_requests_while_one_runs_are_dropped() -> None:
    h = Harness(ScriptedProvider(compacting_script()))
    await h.say("t1", "hello", "m0")
    request = InputMessage(content=TextContent(text=""), group_id="t1", synthetic=Compaction())
    await h.step((request, "c1"))
    await h.step((request.model_copy(), "c2"))  # a second request while the first child has not closed
    assert len(compaction_children(h, "t1")) == 1
    assert any(isinstance(e, Info) and "already in progress" in e.text for e in h.observer.of("t1"))
    await h.run()  # the child summarizes and closes; the claim is released
    await h.step((request.model_copy(), "c3"))
    assert len(compaction_children(h, "t1")) == 2


async def test_compaction_claim_expires_if_the_child_never_finishes() -> None:
    now = [1000.0]
    h = Harness(ScriptedProvider(compacting_script()))
    h.config.clock = lambda: now[0]
    h.config.compaction_lease_seconds = 60
    await h.say("t1", "hello", "m0")
    request = InputMessage(content=TextContent(text=""), group_id="t1", synthetic=Compaction())
    await h.step((request, "c1"))
    h.sender.drain()  # the child's instructions are lost: it never runs
    await h.step((request.model_copy(), "c2"))
    assert len(compaction_children(h, "t1")) == 1
    now[0] += 61
    await h.step((request.model_copy(), "c3"))
    assert len(compaction_children(h, "t1")) == 2


async def test_a_compaction_thread_never_triggers_its_own_compaction() -> None:
    h = Harness(ScriptedProvider(compacting_script()))
    for index in range(4):
        await h.say("t1", f"message {index} {LONG}", f"m{index}")
    for child in compaction_children(h, "t1"):
        assert not compaction_children(h, child)
    # Every message was answered (the rows are kept; compaction only hides them from the model).
    rows = [json.loads(row) for _, row, _ in h.conversation.backend.rows["t1"]]
    assert [row["kind"] for row in rows] == ["user", "assistant"] * 4
    assert rows[-1]["content"] == {"text": "ok"}


async def test_a_trigger_measured_before_the_summary_landed_starts_no_second_compaction() -> None:
    """Reference issue #64: a step that loaded the thread before the summary landed reports the old, high
    usage after the compaction finished. Its request names the same (old) state as the first one, so the
    thread drops it as already processed."""
    from stepagent.core.step import ThreadStep
    from stepagent.providers.base import Usage

    h = Harness(ScriptedProvider(compacting_script()))
    await h.say("t1", "hello", "m0")
    stale = await HistoryManager.load(h.conversation, h.state, "t1")  # before any summary
    step = ThreadStep(h.conversation, h.state, h.config, h.observer, "t1")

    async def trigger(history: HistoryManager) -> None:
        """What a step's end does with the request it decided on: send it (``StepEffects.finish``)."""
        request = step._compaction_request(history, Usage(input_tokens=1900), 2000)
        assert request is not None
        await h.config.sender.send(*request)

    await trigger(stale)
    await h.run()  # the first compaction runs to completion
    assert len(compaction_children(h, "t1")) == 1
    await trigger(stale)  # the stale trigger
    await h.run()
    assert len(compaction_children(h, "t1")) == 1
    fresh = await HistoryManager.load(h.conversation, h.state, "t1")
    await trigger(fresh)  # a real new need
    await h.run()
    assert len(compaction_children(h, "t1")) == 2


async def test_a_request_that_cannot_fit_waits_for_compaction_then_answers() -> None:
    """The no-wedge rule: a request over the window even with its tool outputs truncated is not sent; the
    step asks for compaction (no failure, the turn stays open) and the thread answers once it lands."""
    provider = Recording(ScriptedProvider({**compacting_script(), "context_window": 6_000}))
    h = Harness(provider)
    await h.step((InputMessage.user_text("t1", "a" * 9_000), "m1"))  # fits: answered
    assert h.sender.queue == []  # and under the compaction limit: nothing requested
    await h.step((InputMessage.user_text("t1", "b" * 9_000), "m2"))  # cannot fit with "a": not sent
    assert len(provider.requests) == 1
    assert not [e for _, e in h.observer.events if isinstance(e, StepFailed)]
    assert [type(e) for _, e in h.observer.events].count(TurnComplete) == 1  # m2's turn is still open
    assert [type(q.message.synthetic) for q in h.sender.queue] == [Compaction]
    await h.run()  # the compaction thread summarises, the thread applies it and answers m2
    assert compaction_children(h, "t1")
    rows = [json.loads(row) for _, row, _ in h.conversation.backend.rows["t1"]]
    assert [row["kind"] for row in rows] == ["user", "assistant", "user", "assistant"]
    assert not [e for _, e in h.observer.events if isinstance(e, StepFailed)]
    assert [type(e) for _, e in h.observer.events].count(TurnComplete) == 2
