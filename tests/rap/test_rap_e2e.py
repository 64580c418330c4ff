"""RAP end to end, in process: the engine (step mode) + the demo tool server + the receiver, over real
loopback HTTP. Covers a call round trip, subscriptions (associative and child-thread events, final,
cancellation), OAuth, a user choice answered through ``response_url``, and forged callbacks."""

from __future__ import annotations

import json

from stepagent.events import (
    InputRejected,
    OAuthRequiredEvent,
    UserChoiceDismissed,
    UserChoiceRequiredEvent,
)
from stepagent.history_items import AssistantText, EventItem, ToolResultItem
from stepagent.messages import ToolResult
from stepagent.providers.base import ModelRequest, StreamEvent
from stepagent.rap.choices import answer_user_choice
from stepagent.rap.tokens import callback_token
from tests.rap.stack import SECRET, call, last_input, rap_stack, say

T = "thread-e2e"


def model(request: ModelRequest) -> list[StreamEvent]:
    """The agent's script: decided by the last input's text."""
    text = last_input(request.history)
    thread = request.thread_stack[-1]
    if thread != T:
        return say("event noted")  # an event child thread
    if text == "what time is it?":
        return call("get_time", "call-time", timezone="Europe/Paris")
    if text.startswith("subscribe"):
        count = int(text.split()[1])
        return call("ticker", "call-tick", count=count, interval_seconds=0.05, associative_every=2)
    if text == "stop":
        return call("cancel_subscription", "call-cancel", tool_call_id="call-tick")
    if text == "connect":
        return call("connect_account", "call-oauth")
    if text == "color":
        return call("pick_color", "call-color")
    return say(f"ack: {text[:40]}")


async def test_a_rap_call_round_trips_through_the_receiver() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "what time is it?", "m1")
        await s.wait_queued()
        [queued] = s.h.sender.queue
        assert queued.message_id == "rap-tool-result-call-time"
        await s.h.run()
        history = await s.h.history(T)
        result = history[-2]
        assert isinstance(result, ToolResultItem) and result.result.id == "call-time"
        assert "Europe/Paris" in result.result.joined_text()
        assert isinstance(history[-1], AssistantText) and history[-1].text.startswith("ack: 20")

        # The tool server retrying its POST once the result is in changes nothing: the call is answered,
        # so the receiver refuses it (409) and enqueues nothing.
        body = {"type": "tool_result", "group_id": T, "id": "call-time", "text": "again"}
        token = callback_token(SECRET, T, "call-time")
        queued_before = len(s.h.sender.queue)
        response = await s.http.post(f"{s.receiver_url}/rap/callback?token={token}", json=body)
        assert response.status_code == 409 and "no longer waiting" in response.json()["error"]
        assert len(s.h.sender.queue) == queued_before
        await s.h.run()
        assert await s.h.history(T) == history


async def test_a_subscription_delivers_child_and_associative_events_until_final() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "subscribe 3", "m1")
        await s.wait_queued()  # the call's result, with subscription: true
        assert s.h.sender.queue[0].message.subscription is True
        await s.h.run()
        assert await s.h.state.active_subscriptions(T) == {"call-tick"}

        await s.wait_queued(4)  # tick 1 (child), tick 2 (associative), tick 3 (child), done (final)
        await s.h.run()
        history = await s.h.history(T)
        events = [item for item in history if isinstance(item, EventItem)]
        assert [json.loads(e.result.joined_text()) for e in events] == [
            {"tick": 2, "of": 3},
            {"done": True, "ticks": 3},
        ]
        assert all(e.tool_call_id == "call-tick" for e in events)
        children = await s.h.conversation.children(T)
        assert len(children) == 2  # ticks 1 and 3 ran in event child threads
        for child in children:
            child_history = await s.h.history(child.thread_id)
            assert isinstance(child_history[-1], AssistantText) and child_history[-1].text == "event noted"
        assert await s.h.state.active_subscriptions(T) == set()  # final ended it

        # After final, a (validly signed) late event is discarded.
        late = {"type": "subscription_event", "group_id": T, "tool_call_id": "call-tick", "text": "late"}
        token = callback_token(SECRET, T, "call-tick")
        assert (
            await s.http.post(f"{s.receiver_url}/rap/callback?token={token}", json=late)
        ).status_code == 200
        await s.h.run()
        assert await s.h.history(T) == history
        assert any(
            isinstance(e, InputRejected) and "not an active subscription" in e.reason
            for e in s.h.observer.of(T)
        )


async def test_cancel_subscription_notifies_the_owning_server_which_stops_sending() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "subscribe 1000", "m1")
        await s.wait_queued()
        await s.h.run()
        await s.wait_queued()  # the first tick is on its way
        await s.h.say(T, "stop", "m2")
        history = await s.h.history(T)
        cancel_result = next(
            i for i in history if isinstance(i, ToolResultItem) and i.result.id == "call-cancel"
        )
        assert cancel_result.result.joined_text() == "Subscription 'call-tick' cancelled successfully."
        assert s.tools_server.cancelled == [(T, "call-tick")]
        assert await s.h.state.active_subscriptions(T) == set()

        # The subscription's task on the server has ended: nothing can send another tick.
        await s.wait_for(lambda: not s.tools_server.is_running(T, "call-tick"))
        late = {"type": "subscription_event", "group_id": T, "tool_call_id": "call-tick", "text": "x"}
        token = callback_token(SECRET, T, "call-tick")
        await s.http.post(f"{s.receiver_url}/rap/callback?token={token}", json=late)
        await s.h.run()
        assert await s.h.history(T) == history  # events for a cancelled subscription are discarded


async def test_an_interrupted_rap_call_is_cancelled_on_its_server_only() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "color", "m1")  # pick_color waits for the user
        await s.wait_queued()
        await s.h.say(T, "never mind", "m2")  # user text interrupts the pending call
        await s.wait_for(lambda: s.tools_server.cancelled == [(T, "call-color")])


async def test_an_oauth_notice_is_surfaced_and_the_call_completes() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "connect", "m1")
        await s.wait_queued(2)
        await s.h.run()
        notices = [e for e in s.h.observer.of(T) if isinstance(e, OAuthRequiredEvent)]
        assert notices == [
            OAuthRequiredEvent(
                auth_url="https://example.com/oauth/authorize?demo=1", tool_call_id="call-oauth"
            )
        ]
        history = await s.h.history(T)
        assert history[-2] == ToolResultItem(result=ToolResult.text("call-oauth", "Account connected."))


async def test_a_user_choice_is_answered_through_its_response_url() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "color", "m1")
        await s.wait_queued()
        await s.h.run()
        [asked] = [e for e in s.h.observer.of(T) if isinstance(e, UserChoiceRequiredEvent)]
        choice = asked.choice
        assert choice.choices == ["red", "green", "blue"] and choice.response_url.startswith(s.tools_url)
        assert await s.h.state.pending_choices(T) == [choice]

        assert await answer_user_choice(choice, 2, s.http) == 2
        await s.wait_queued()
        await s.h.run()
        history = await s.h.history(T)
        assert history[-2] == ToolResultItem(result=ToolResult.text("call-color", "The user picked blue."))
        assert UserChoiceDismissed(choice_id="call-color") in s.h.observer.of(T)
        assert await s.h.state.pending_choices(T) == []


async def test_forged_callbacks_are_rejected_and_enqueue_nothing() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "color", "m1")
        await s.wait_queued()
        await s.h.run()
        url = f"{s.receiver_url}/rap/callback"
        forged = {"type": "tool_result", "group_id": T, "id": "call-color", "text": "forged"}
        missing = await s.http.post(url, json=forged)
        bad = await s.http.post(f"{url}?token=v1.AAAA.BBBB", json=forged)
        other_thread = callback_token(SECRET, "attacker-thread", "call-color")
        replayed = await s.http.post(f"{url}?token={other_thread}", json=forged)
        other_call = callback_token(SECRET, T, "call-other")
        wrong_call = await s.http.post(f"{url}?token={other_call}", json=forged)
        assert [r.status_code for r in (missing, bad, replayed, wrong_call)] == [401, 403, 403, 403]
        assert all("error" in r.json() for r in (missing, bad, replayed, wrong_call))
        assert s.h.sender.queue == []


async def test_view_updates_go_to_the_output_side_not_the_agent() -> None:
    async with rap_stack(model) as s:
        token = callback_token(SECRET, T, "any")
        body = {"type": "view_update", "group_id": T, "view_type": "progress", "content": {"pct": 10}}
        response = await s.http.post(f"{s.receiver_url}/rap/callback?token={token}", json=body)
        assert response.status_code == 200
        assert [v.content for v in s.views] == [{"pct": 10}] and s.h.sender.queue == []


async def test_an_event_in_the_same_batch_as_the_subscription_result_is_kept() -> None:
    async with rap_stack(model) as s:
        await s.h.say(T, "subscribe 1", "m1")
        await s.wait_queued(2)  # the result and the first (child) tick, in one batch
        await s.h.run()
        assert len(await s.h.conversation.children(T)) == 1
