"""Context overflow in local mode: every turn whose arrival overflows the window is answered once, after
the compaction it triggers, with itself as the last item of the answering request (the same rule the
worker follows: ``tests/integration/test_context_overflow.py``)."""

from __future__ import annotations

import pytest

from stepagent.events import EventCollector, StepFailed
from stepagent.history_items import AssistantText, UserItem
from stepagent.messages import TextContent
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import ThreadKind
from tests.integration.test_context_overflow import turn_text, turns_script
from tests.local.test_local_mode import TIMEOUT, RecordingScripted, make, running

pytestmark = pytest.mark.asyncio

#: Two turns stay under the compaction threshold; the third's arrival overflows the window (local mode
#: offers fewer tools than the worker's test deployment, so its turns are a little longer).
CHARS = 4_800


async def test_every_overflowing_turn_is_answered_once_seeing_itself_in_local_mode() -> None:
    turns = 40
    provider = RecordingScripted(ScriptedProvider(turns_script(turns, 6_000)))
    collector = EventCollector()
    async with running(make(provider, collector=collector)) as system:
        for turn in range(1, turns + 1):
            await system.send_user_text("t1", turn_text(turn, CHARS))
            await system.wait_idle(TIMEOUT)
        answers = [
            row.item.text
            async for row in system.conversation.load_rows("t1")
            if isinstance(row.item, AssistantText)
        ]
        children = await system.conversation.children("t1")
    assert not [e for e in collector.of("t1") if isinstance(e, StepFailed)]
    assert answers == [f"ANSWER-{n:02d}" for n in range(1, turns + 1)]  # each once, in order, never DEFAULT
    assert sum(c.kind == ThreadKind.COMPACTION for c in children) >= 5
    for turn in range(1, turns + 1):
        question = UserItem(TextContent(text=turn_text(turn, CHARS)))
        # Asked exactly once with the question as the request's last item.
        assert sum(r.thread_stack[-1] == "t1" and r.history[-1] == question for r in provider.requests) == 1
