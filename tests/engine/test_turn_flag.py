"""The turn flag each commit records (``Commit.turn_complete``): ``True`` only on the last commit of a step
that leaves the thread with nothing pending (core/turn.py). Every commit is recorded, so a mid-step commit
that said "complete" would be caught."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepagent.core.step import StepInput
from stepagent.history_items import AssistantText
from stepagent.ids import child_thread_id
from stepagent.messages import InputMessage, ToolResult
from stepagent.providers.base import ModelInfo, Usage
from stepagent.stores.base import Commit, ThreadInfo
from stepagent.stores.memory import InMemoryConversationStore
from tests.engine.harness import Harness, RecordingTool, ReplayProvider, call, text


@dataclass
class FlagLog:
    commits: list[tuple[str, bool]] = field(default_factory=list)

    def of(self, thread: str) -> list[bool]:
        return [flag for tid, flag in self.commits if tid == thread]


def recording(h: Harness) -> FlagLog:
    """Record ``(thread, turn_complete)`` of every commit the step makes."""
    log = FlagLog()
    store = h.conversation
    assert isinstance(store, InMemoryConversationStore)
    original = store.commit

    async def commit(thread_id: str, commit: Commit) -> ThreadInfo:
        log.commits.append((thread_id, commit.turn_complete))
        return await original(thread_id, commit)

    store.commit = commit  # type: ignore[method-assign]
    return log


async def flag(h: Harness, thread: str) -> bool | None:
    info = await h.conversation.get_thread(thread)
    assert info is not None
    return info.turn_complete


async def test_a_text_reply_completes_the_turn_and_an_open_call_does_not() -> None:
    lookup = RecordingTool()
    provider = ReplayProvider().then(call("lookup", "c1", q="x")).then(*text("found it"))
    h = Harness(provider, [lookup])
    log = recording(h)
    await h.say("t", "look it up", "m1")
    assert log.of("t") == [False] and await flag(h, "t") is False  # the call is open

    await h.send(InputMessage.tool_result("t", ToolResult.text("c1", "42")), "r1")
    await h.run()
    assert log.of("t") == [False, True] and await flag(h, "t") is True
    history = await h.history("t")
    assert isinstance(history[-1], AssistantText) and history[-1].text == "found it"


async def test_a_passive_call_is_waiting_not_working() -> None:
    provider = ReplayProvider().then(call("sleep_until_event_or_input", "s1"))
    h = Harness(provider)
    log = recording(h)
    await h.say("t", "wait for news", "m1")
    assert log.of("t") == [True]


async def test_a_mid_step_commit_says_the_turn_is_still_running() -> None:
    # spawn_thread is synchronous: its call is committed before it runs, then the model gets a round.
    spawn = call("spawn_thread", "sp1", instructions="count", child_of=["t"])
    provider = ReplayProvider().then(spawn).then(*text("spawned"))
    h = Harness(provider)
    log = recording(h)
    await h.step((InputMessage.user_text("t", "delegate"), "m1"))
    assert log.of("t") == [False, True]
    # The child exists but has not processed its seed: no flag yet.
    assert await flag(h, child_thread_id("t", "sp1")) is None


async def test_a_step_that_will_request_compaction_is_not_complete() -> None:
    provider = ReplayProvider(model=ModelInfo("replay", context_window=10_000))
    provider.then(*text("long answer", usage=Usage(input_tokens=9_000, output_tokens=5)))
    h = Harness(provider)
    log = recording(h)
    await h.system.step([StepInput(InputMessage.user_text("t", "hi"), "m1")], h.observer)
    assert log.of("t") == [False]
    assert any(q.message.synthetic is not None for q in h.sender.queue)  # the compaction request


async def test_a_given_up_completion_ends_the_turn() -> None:
    from stepagent.errors import ProviderError

    provider = ReplayProvider().then(ProviderError("bad request", retryable=False, status=400))
    h = Harness(provider)
    log = recording(h)
    await h.say("t", "hi", "m1")
    assert log.of("t") == [True]


async def test_inputs_to_a_closed_thread_leave_it_complete() -> None:
    h = Harness(ReplayProvider().then(*text("a")))
    log = recording(h)
    await h.say("t", "hi", "m1")
    await h.conversation.close_thread("t")
    await h.say("t", "more", "m2")
    assert log.of("t")[-1] is True
