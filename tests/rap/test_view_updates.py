"""A RAP tool's view updates (:meth:`RapCall.send_view_update`), end to end: the tool server POSTs them over
loopback HTTP to the real receiver, which hands them to the output side — in process to the receiver app's
``on_view``, on AWS (moto) as ``view_update`` events on the output queue. The agent never sees them, and
the call's result still round-trips; a view update for a thread the runtime does not know is refused. The
tool server is the README's example, run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stepagent.errors import CallbackRefusedError
from stepagent.history_items import AssistantText, ToolResultItem
from stepagent.providers.base import ModelRequest, StreamEvent
from stepagent.rap.call import RapCall
from stepagent.rap.server import RapToolServer
from stepagent.rap.tokens import callback_url_for
from tests.rap.stack import call, last_input, rap_stack, say
from tests.rap.test_rap_on_moto import SECRET as MOTO_SECRET
from tests.rap.test_rap_on_moto import rap_on_moto

T = "thread-views"
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_report_server() -> RapToolServer:
    """The README's view-update example (the Python block that calls ``send_view_update``), executed."""
    [code] = [
        block
        for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
        if "send_view_update" in block
    ]
    namespace: dict[str, object] = {"__name__": "readme_view_updates"}
    exec(compile(code, "README view updates", "exec"), namespace)
    server = namespace["server"]
    assert isinstance(server, RapToolServer)
    return server


def model(request: ModelRequest) -> list[StreamEvent]:
    text = last_input(request.history)
    if text == "report":
        return call("build_report", "call-report", pages=2)
    return say(f"done: {text}")


async def test_a_tools_view_updates_reach_the_output_side_in_order_and_never_the_agent() -> None:
    async with rap_stack(model, server=readme_report_server()) as s:
        await s.h.say(T, "report", "m1")
        await s.wait_queued()

        # Each update was answered before the next was sent, and all before the result.
        assert [(v.thread_id, v.view_type, v.content) for v in s.views] == [
            (T, "progress", {"page": 1, "of": 2}),
            (T, "progress", {"page": 2, "of": 2}),
            (T, "progress", None),
        ]
        events = [v.output_event() for v in s.views]
        assert [e["type"] for e in events] == ["view_update"] * 3
        assert len({e["event_id"] for e in events}) == 3  # each new state is an event of its own

        [queued] = s.h.sender.queue  # only the result is agent input
        assert queued.message_id == "rap-tool-result-call-report"
        await s.h.run()
        history = await s.h.history(T)
        result = history[-2]
        assert isinstance(result, ToolResultItem) and result.result.joined_text() == "report of 2 pages"
        assert history[-1] == AssistantText("done: report of 2 pages")
        assert "progress" not in repr(history)


async def test_on_moto_a_view_update_is_an_output_queue_event_and_an_unknown_thread_is_refused() -> None:
    async with rap_on_moto() as (stack, receiver_url, demo):
        await stack.send_user("conv-views", "hello", "m1")
        await stack.pump()
        await stack.outputs()

        def rap_call(thread: str, call_id: str) -> RapCall:
            url = callback_url_for(receiver_url, MOTO_SECRET, thread, call_id)
            return demo.call_for(
                {"operation": "build_report", "id": call_id, "callback_url": url, "group_id": thread}
            )

        known = rap_call("conv-views", "call-views")
        await known.send_view_update("progress", {"page": 1, "of": 3})
        [event] = await stack.outputs()
        assert event["type"] == "view_update" and event["view_type"] == "progress"
        assert event["content"] == {"page": 1, "of": 3}
        assert event["thread_id"] == event["root_thread_id"] == "conv-views"
        assert await stack.receive(stack.input_url) == []  # nothing for the agent

        stranger = rap_call("conv-nobody-knows", "call-views")
        with pytest.raises(CallbackRefusedError, match="HTTP 404"):
            await stranger.send_view_update("progress", {"page": 1})
        assert await stack.outputs() == []
