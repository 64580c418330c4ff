"""The step's pure plans: the fold-in order of a batch while a call is pending (``core/fold_order.py``) and
the end of a turn computed from the completion's outcome (``core/turn_end.py``)."""

from __future__ import annotations

from stepagent.core.completion import CompletionOutcome
from stepagent.core.fold_order import PendingCall, fold_order
from stepagent.core.step import StepInput
from stepagent.core.turn_end import end_of_turn
from stepagent.events import ApprovalRequested, CompletionFinished, LimitReached, StepFailed, TurnComplete
from stepagent.history_items import ToolCallItem
from stepagent.messages import InputMessage, SubscriptionEvent, ThreadReport, ToolCall, ToolResult
from stepagent.providers.base import Usage


def user(mid: str) -> StepInput:
    return StepInput(InputMessage.user_text("t", mid), mid)


def report(mid: str) -> StepInput:
    synthetic = ThreadReport(tool_call_id="spawn", child_thread_id="child")
    return StepInput(InputMessage.tool_result("t", ToolResult.text("", mid), synthetic=synthetic), mid)


def result(mid: str, call_id: str) -> StepInput:
    return StepInput(InputMessage.tool_result("t", ToolResult.text(call_id, "done")), mid)


def sub_event(mid: str, call_id: str) -> StepInput:
    synthetic = SubscriptionEvent(tool_call_id=call_id)
    return StepInput(InputMessage.tool_result("t", ToolResult.text(call_id, "evt"), synthetic=synthetic), mid)


def ids(items: list[StepInput]) -> list[str]:
    return [i.message_id for i in items]


# ---- fold order ---------------------------------------------------------------------------------------------


def test_no_pending_call_keeps_the_order_and_releases_at_the_end() -> None:
    plan = fold_order([report("r1"), user("u1")], None)
    assert ids(plan.inputs) == ["r1", "u1"]
    assert plan.hold == frozenset()
    assert plan.release_at == 2


def test_events_wait_for_a_pending_call_and_nothing_is_released() -> None:
    batch = [report("r1"), result("x", "other"), sub_event("s1", "c1"), sub_event("s2", "elsewhere")]
    plan = fold_order(batch, PendingCall("c1"))
    assert ids(plan.inputs) == ["r1", "x", "s1", "s2"]
    # The report waits; so does the pending call's own subscription event; another call's event does not.
    assert plan.hold == frozenset({0, 2})
    assert plan.release_at is None


def test_the_answer_goes_first_and_early_events_follow_it() -> None:
    batch = [report("r1"), user("u0"), result("res", "c1"), report("r2")]
    plan = fold_order(batch, PendingCall("c1"))
    assert ids(plan.inputs) == ["u0", "res", "r1", "r2"]
    assert plan.hold == frozenset()
    assert plan.release_at == 2  # held inputs of earlier steps follow the answer, before r1


def test_user_text_releases_without_reordering() -> None:
    plan = fold_order([report("r1"), user("u1")], PendingCall("c1"))
    assert ids(plan.inputs) == ["r1", "u1"]
    assert plan.hold == frozenset()
    assert plan.release_at == 2


def test_a_reject_answers_only_a_call_that_waits_for_a_person() -> None:
    reject = StepInput(InputMessage.approval("t", "c1", "reject"), "d1")
    waiting = fold_order([report("r1"), reject], PendingCall("c1", waits_for_person=True))
    assert ids(waiting.inputs) == ["d1", "r1"]
    assert waiting.release_at == 1
    running = fold_order([report("r1"), reject], PendingCall("c1"))
    assert running.release_at is None
    assert running.hold == frozenset({0})


# ---- the turn's end -----------------------------------------------------------------------------------------


def test_a_finished_turn_records_its_usage_and_completes_last() -> None:
    usage = Usage(input_tokens=10, output_tokens=5)
    outcome = CompletionOutcome(usage=usage, step_usage=usage, completions=2)
    result = end_of_turn(
        outcome,
        step_id="m1",
        model="m",
        context_window=1000,
        output_retries=0,
        complete=True,
        cost=0.5,
        stop_kept=False,
        waiting=None,
    )
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.completions) == (10, 5, 2)
    assert result.usage.turn_complete and result.usage.cost_usd == 0.5
    assert result.notices == [] and result.error is None
    assert result.observe == [
        CompletionFinished(usage=usage, context_window=1000, step_usage=usage, model="m")
    ]
    assert result.turn_complete(7) == TurnComplete(
        usage=usage, model="m", step_id="m1", version=7, cost_usd=0.5, output=None, has_output=False
    )


def test_a_limit_before_any_call_is_kept_once() -> None:
    limit = LimitReached("model_calls_per_turn", 3, 3)
    outcome = CompletionOutcome(limit=limit)
    first = end_of_turn(
        outcome,
        step_id="m1",
        model="m",
        context_window=0,
        output_retries=0,
        complete=True,
        cost=None,
        stop_kept=False,
        waiting=None,
    )
    assert first.usage is not None and first.usage.input_tokens == 0 and first.usage.completions == 0
    assert len(first.notices) == 1
    stopped = LimitReached("model_calls_per_turn", 3, 3, source_id="m1")
    assert first.observe[1:] == [stopped]
    again = end_of_turn(
        outcome,
        step_id="m1",
        model="m",
        context_window=0,
        output_retries=0,
        complete=True,
        cost=None,
        stop_kept=True,
        waiting=None,
    )
    assert again.usage is None and again.notices == []
    assert again.observe == first.observe  # the same events are reported again


def test_invalid_answers_fail_the_step_and_a_waiting_call_asks_for_approval() -> None:
    outcome = CompletionOutcome(completions=1, output_errors=["no field x"])
    waiting = ToolCallItem(ToolCall(id="c1", name="pay", arguments={"usd": 1}))
    result = end_of_turn(
        outcome,
        step_id="m1",
        model="m",
        context_window=0,
        output_retries=1,
        complete=False,
        cost=None,
        stop_kept=False,
        waiting=waiting,
    )
    error = "The answer did not match the output schema after 2 attempts: no field x"
    assert result.error == error
    assert result.observe[1:] == [
        StepFailed(message=error, retrying=False, source_id="m1"),
        ApprovalRequested("pay", {"usd": 1}, "c1"),
    ]
    assert result.turn_complete(3) is None
    assert result.usage is not None and not result.usage.turn_complete
