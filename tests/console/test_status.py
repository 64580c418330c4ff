"""The console's status rules (stepagent.console.status), one rule at a time."""

from __future__ import annotations

from stepagent.console.status import Status, ThreadFacts, pending_call, thread_status, tree_status
from stepagent.stores.base import ThreadInfo
from stepagent.stores.dynamodb.live import LiveState


def facts(**changes: object) -> ThreadFacts:
    info = changes.pop("info", ThreadInfo("t", "t", version=3, tail=5, turn_complete=True))
    return ThreadFacts(thread_id="t", info=info, **changes)  # type: ignore[arg-type]


def status(**changes: object) -> Status:
    return thread_status(facts(**changes)).status


def test_each_rule() -> None:
    assert status() is Status.IDLE
    assert status(subscriptions=2) is Status.IDLE
    assert status(dead_letters=1) is Status.FAILED
    given_up = LiveState(
        notices=({"type": "error", "event_id": "e1", "message": "gave up", "retrying": False},), notice_seq=1
    )
    assert status(live=given_up, last_row_kind="user") is Status.FAILED
    assert status(live=given_up, last_row_kind="assistant") is Status.IDLE  # answered since
    retrying = LiveState(
        notices=({"type": "error", "event_id": "e2", "message": "x", "retrying": True},), notice_seq=1
    )
    assert status(live=retrying, last_row_kind="user") is Status.IDLE
    assert status(choices=1, pending_call=("pick_color", "c1")) is Status.CHOICE
    assert status(live=LiveState(version=3, phase="writing", text="hi")) is Status.WORKING
    assert status(live=LiveState(version=2, phase="writing", text="old")) is Status.IDLE  # stale partial
    assert status(inbox=frozenset({"m"})) is Status.WORKING
    assert status(open_intents=1) is Status.WORKING
    busy = ThreadInfo("t", "t", version=3, tail=5, turn_complete=False)
    assert status(info=busy, pending_call=("get_time", "c1")) is Status.TOOL
    assert status(pending_call=("sleep", "c1")) is Status.TIMER
    assert status(pending_call=("sleep_until_event_or_input", "c1")) is Status.TIMER
    assert status(info=busy) is Status.WORKING
    assert status(info=ThreadInfo("t", "t", version=0, tail=0)) is Status.WORKING  # child before its seed
    closed = ThreadInfo("t", "t", version=3, tail=5, closed=True, turn_complete=False)
    assert status(info=closed) is Status.IDLE
    assert status(info=closed, open_intents=1) is Status.WORKING


def test_a_tree_takes_its_most_urgent_thread_and_the_pending_call_is_the_last_unanswered() -> None:
    reports = [
        thread_status(facts()),
        thread_status(facts(pending_call=("sleep", "c"))),
        thread_status(facts(dead_letters=2)),
    ]
    assert tree_status(reports).status is Status.FAILED
    assert tree_status(reports[:2]).status is Status.TIMER
    rows = [
        {"kind": "tool_call", "tool_call_id": "a", "name": "get_time"},
        {"kind": "tool_result", "tool_call_id": "a"},
        {"kind": "tool_call", "tool_call_id": "b", "name": "pick_color"},
    ]
    assert pending_call(rows) == ("pick_color", "b")
    assert pending_call(rows[:2]) is None
