"""Approval of tool calls in step mode: a call that needs a person's decision is committed and waits; each
decision (approve, edit, reject, respond) resumes the thread in its own step; bad decisions change nothing."""

from __future__ import annotations

from typing import Any

from stepagent import texts
from stepagent.agent_config import AgentConfig
from stepagent.events import ApprovalRequested, InputRejected, ToolCallStarted, TurnComplete
from stepagent.history_items import (
    ApprovalItem,
    AssistantText,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    approval_states,
    waiting_for_approval,
)
from stepagent.messages import InputMessage, ToolResult
from stepagent.providers.base import Final, TextDelta
from stepagent.tools.base import ToolContext
from stepagent.tools.functions import tool
from tests.engine.harness import EchoSyncTool, Harness, RecordingTool, ReplayProvider, call, text


class MailTool(RecordingTool):
    """An asynchronous tool with a real schema (``to`` is a required string)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.parameters = {  # type: ignore[misc]
            "type": "object",
            "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
            "required": ["to"],
            "additionalProperties": False,
        }


def harness(provider: ReplayProvider, *tools: Any, approval: tuple[str, ...] = ("send_email",)) -> Harness:
    h = Harness(provider, list(tools))
    h.config.agent = AgentConfig(approval=approval)
    return h


def taken(h: Harness) -> list[Any]:
    """The events observed since the last call (of every thread)."""
    return [event for _, event in h.observer.take()]


def mail() -> MailTool:
    return MailTool(tool_name="send_email")


async def waiting(h: Harness, thread: str = "t1") -> ToolCallItem | None:
    return waiting_for_approval(await h.history(thread))


async def decide(h: Harness, decision: str, message_id: str, call_id: str = "tc-1", **fields: Any) -> None:
    await h.send(InputMessage.approval("t1", call_id, decision, **fields), message_id)
    await h.run()


async def asked(h: Harness) -> Harness:
    """Run the user's request up to the waiting call and check the waiting state."""
    await h.say("t1", "mail bob", "m1")
    events = h.observer.of("t1")
    assert ApprovalRequested("send_email", {"to": "bob"}, "tc-1") in events
    assert not any(isinstance(e, TurnComplete) for e in events)  # the thread waits: no turn_complete
    assert any(isinstance(e, ToolCallStarted) for e in events)
    found = await waiting(h)
    assert found is not None and found.call.id == "tc-1" and found.needs_approval
    assert await h.state.open_intents("t1") == []  # nothing to dispatch: no intent was committed
    return h


def provider_mailing(*after: list[Any]) -> ReplayProvider:
    provider = ReplayProvider().then(TextDelta("Sending."), call("send_email", "tc-1", to="bob"), Final())
    for stream in after:
        provider.then(*stream)
    return provider


async def test_approve_dispatches_the_call_as_made_once_and_never_before() -> None:
    tool = mail()
    h = await asked(harness(provider_mailing(text("Sent.")), tool))
    assert tool.dispatches == []
    h.observer.take()
    await decide(h, "approve", "a1")
    assert tool.dispatches == [("tc-1", {"to": "bob"})]
    assert await h.state.open_intents("t1") == []
    history = await h.history("t1")
    assert history[-1] == ApprovalItem("tc-1", "approve")
    assert approval_states(history) == {"tc-1": "approved"}
    assert await waiting(h) is None
    assert not any(isinstance(e, TurnComplete) for e in taken(h))  # still waiting for the result

    await decide(h, "approve", "a1")  # a redelivered decision is absorbed: nothing happens at all
    assert tool.dispatches == [("tc-1", {"to": "bob"})]
    assert not taken(h)

    await h.send(InputMessage.tool_result("t1", ToolResult.text("tc-1", "queued")), "tc-1")
    await h.run()
    history = await h.history("t1")
    assert history[-1] == AssistantText("Sent.")
    assert any(isinstance(e, TurnComplete) for e in h.observer.of("t1"))
    # The model never sees the decision row: the call and its result are adjacent.
    shown = h.provider.requests[-1].history
    assert not any(isinstance(i, ApprovalItem) for i in shown)
    assert isinstance(shown[-2], ToolCallItem) and isinstance(shown[-1], ToolResultItem)


async def test_edit_dispatches_the_edited_args_and_the_model_sees_them() -> None:
    tool = mail()
    h = await asked(harness(provider_mailing(text("Sent to carol.")), tool))
    await decide(h, "edit", "a1", args={"to": "carol", "body": "hi"})
    assert tool.dispatches == [("tc-1", {"to": "carol", "body": "hi"})]
    await h.send(InputMessage.tool_result("t1", ToolResult.text("tc-1", "queued")), "tc-1")
    await h.run()
    shown = h.provider.requests[-1].history
    calls = [i for i in shown if isinstance(i, ToolCallItem)]
    assert [c.call.arguments for c in calls] == [{"to": "carol", "body": "hi"}]
    assert approval_states(await h.history("t1")) == {"tc-1": "edited"}


async def test_edit_with_args_that_fail_the_schema_is_refused_and_the_call_keeps_waiting() -> None:
    tool = mail()
    h = await asked(harness(provider_mailing(), tool))
    before = await h.stored("t1")
    h.observer.take()
    await decide(h, "edit", "a1", args={"to": 7, "cc": "x"})
    rejected = [e for e in taken(h) if isinstance(e, InputRejected)]
    assert len(rejected) == 1 and "invalid" in rejected[0].reason and "keeps waiting" in rejected[0].reason
    assert "to" in rejected[0].reason
    assert tool.dispatches == [] and await h.stored("t1") == before
    assert (await waiting(h)) is not None
    # A corrected edit (a new message) is accepted.
    await decide(h, "edit", "a2", args={"to": "dave"})
    assert tool.dispatches == [("tc-1", {"to": "dave"})]


async def test_reject_answers_the_call_with_a_refusal_and_the_model_continues() -> None:
    tool = mail()
    h = await asked(harness(provider_mailing(text("Okay, I won't.")), tool))
    await decide(h, "reject", "a1", message="not today")
    assert tool.dispatches == []
    history = await h.history("t1")
    result = history[-2]
    assert isinstance(result, ToolResultItem) and result.result.id == "tc-1"
    assert result.result.first_text() == texts.APPROVAL_REJECTED_WITH_MESSAGE.format(message="not today")
    assert history[-1] == AssistantText("Okay, I won't.")
    assert approval_states(history) == {"tc-1": "rejected"}
    assert any(isinstance(e, TurnComplete) for e in h.observer.of("t1"))
    assert await h.state.open_intents("t1") == []


async def test_respond_answers_with_the_message_and_the_tool_never_runs() -> None:
    tool = mail()
    h = await asked(harness(provider_mailing(text("Noted.")), tool))
    await decide(h, "respond", "a1", message="already sent yesterday")
    assert tool.dispatches == []
    history = await h.history("t1")
    assert isinstance(history[-2], ToolResultItem)
    assert history[-2].result.first_text() == "already sent yesterday"
    assert "already sent yesterday" in str(h.provider.requests[-1].history[-1])
    assert approval_states(history) == {"tc-1": "responded"}


async def test_decisions_for_calls_that_do_not_wait_are_refused_and_change_nothing() -> None:
    tool = mail()
    h = await asked(harness(provider_mailing(text("Okay.")), tool))
    before = await h.stored("t1")
    h.observer.take()
    await decide(h, "approve", "x1", call_id="tc-unknown")
    [unknown] = [e for e in taken(h) if isinstance(e, InputRejected)]
    assert "no tool call tc-unknown" in unknown.reason
    assert await h.stored("t1") == before and tool.dispatches == []

    await decide(h, "reject", "a1")
    h.observer.take()
    after = await h.stored("t1")
    await decide(h, "approve", "a2")  # a second, different decision for the decided call
    [again] = [e for e in taken(h) if isinstance(e, InputRejected)]
    assert "already decided" in again.reason
    assert await h.stored("t1") == after and tool.dispatches == []


async def test_user_text_interrupts_a_waiting_call_like_any_pending_call() -> None:
    tool = mail()
    h = await asked(harness(provider_mailing(text("Okay, cancelled.")), tool))
    await h.say("t1", "never mind", "m2")
    history = await h.history("t1")
    assert isinstance(history[-3], ToolResultItem) and history[-3].result.id == "tc-1"
    assert isinstance(history[-2], UserItem)
    assert approval_states(history) == {}  # interrupted, never decided
    h.observer.take()
    await decide(h, "approve", "a1")
    [late] = [e for e in taken(h) if isinstance(e, InputRejected)]
    assert "interrupted" in late.reason and tool.dispatches == []


async def test_an_inline_tool_that_needs_approval_waits_then_runs_in_the_deciding_step() -> None:
    provider = ReplayProvider().then(call("echo_sync", "tc-1", text="hi"), Final()).then(*text("Echoed."))
    h = harness(provider, EchoSyncTool(), approval=("echo_sync",))
    await h.say("t1", "echo hi", "m1")
    assert (await waiting(h)) is not None
    assert len(provider.requests) == 1  # the step stopped at the call
    await decide(h, "approve", "a1")
    history = await h.history("t1")
    assert isinstance(history[-2], ToolResultItem) and history[-2].result.first_text() == "echo: hi"
    assert history[-1] == AssistantText("Echoed.")
    assert await h.state.open_intents("t1") == []


async def test_policy_tool_flag_patterns_and_builtins() -> None:
    @tool(approval=True)
    async def wire_money(amount: int) -> str:
        """Send money."""
        return "sent"

    @tool
    async def crm_update(field: str) -> str:
        """Update the CRM."""
        return "ok"

    from stepagent.core.agents import resolve_agent
    from stepagent.tools.base import Toolset
    from stepagent.tools.builtins import builtin_tools

    toolset = Toolset.of([wire_money, crm_update, *builtin_tools()])
    provider = ReplayProvider()

    def agent(approval: tuple[str, ...]) -> Any:
        return resolve_agent(
            AgentConfig(approval=approval), provider, toolset, {}, metadata=None, child=False
        )

    spawn = toolset.get("spawn_thread")
    assert spawn is not None
    assert agent(()).needs_approval(wire_money) and not agent(()).needs_approval(crm_update)
    assert agent(("crm_*",)).needs_approval(crm_update)
    assert agent(("*",)).needs_approval(crm_update) and not agent(("*",)).needs_approval(spawn)
    assert agent(("spawn_thread",)).needs_approval(spawn)


async def test_function_tool_edit_is_validated_by_its_signature() -> None:
    from stepagent.core.approval import edit_problem

    @tool(approval=True)
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return "done"

    assert edit_problem(refund, {"order": "A1", "amount": 3}) is None
    problem = edit_problem(refund, {"order": "A1", "amount": "lots"})
    assert problem is not None and "amount" in problem


async def test_events_held_behind_a_waiting_call_are_released_by_a_reject_in_the_same_batch() -> None:
    """Events that arrive while a call waits for a person are held like for any pending call; a decision
    that answers the call (reject, respond) releases them in its own step, so nothing stays held."""
    from stepagent.messages import SubscriptionEvent
    from tests.engine.harness import RecordingTool

    provider = ReplayProvider()
    h = harness(provider, mail(), RecordingTool(tool_name="subscribe"))
    provider.then(call("subscribe", "sub-1", topic="builds"), Final()).then(*text("watching"))
    await h.say("t1", "watch builds", "m0")
    start = InputMessage.tool_result("t1", ToolResult.text("sub-1", "subscribed"), subscription=True)
    await h.step((start, "r0"))
    provider.then(call("send_email", "tc-1", to="bob"), Final())
    await h.say("t1", "mail bob", "m1")
    assert (await waiting(h)) is not None
    event = InputMessage.tool_result(
        "t1",
        ToolResult.text("sub-1", "build failed"),
        synthetic=SubscriptionEvent(tool_call_id="sub-1", associative=True),
    )
    await h.step((event, "e1"))  # held: the call waits
    assert [d.message_id for d in await h.state.deferred_inputs("t1")] == ["e1"]
    provider.then(*text("Not sent; and the build failed."))
    await h.step((InputMessage.approval("t1", "tc-1", "reject"), "a1"))
    assert await h.state.deferred_inputs("t1") == []
    history = await h.history("t1")
    assert "build failed" in str(history[-2]) and history[-1] == AssistantText(
        "Not sent; and the build failed."
    )


async def test_an_mcp_tool_selected_by_pattern_waits_and_an_edit_is_checked_against_its_schema() -> None:
    """MCP tools are named ``<server>__<tool>``; ``STEPAGENT_APPROVAL=crm__*`` selects them. The edit is
    validated with the server's JSON Schema, and the approved call goes to the function runner once."""
    from stepagent.tools.mcp import McpConnection, McpServer, McpTool

    submitted: list[tuple[str, dict[str, Any], str]] = []

    class Runner:
        async def submit(self, tool_name: str, arguments: dict[str, Any], context: ToolContext) -> None:
            submitted.append((tool_name, arguments, context.tool_call_id))

    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    update = McpTool(
        McpConnection(McpServer(name="crm", command="/nonexistent")), "update", "Update.", schema
    )
    provider = ReplayProvider().then(call("crm__update", "tc-1", id=1), Final())
    h = harness(provider, update, approval=("crm__*",))
    h.config.runner = Runner()
    await h.say("t1", "update the crm", "m1")
    assert (await waiting(h)) is not None and submitted == []
    taken(h)
    await decide(h, "edit", "a1", args={"id": "seven"})
    [refused] = [e for e in taken(h) if isinstance(e, InputRejected)]
    assert "'seven' is not of type 'integer'" in refused.reason and submitted == []
    await decide(h, "edit", "a2", args={"id": 7})
    assert submitted == [("crm__update", {"id": 7}, "tc-1")]


async def test_a_refused_decision_is_kept_with_the_thread_and_listed_in_the_history_with_its_call() -> None:
    from stepagent.outputs.build import record_notices
    from stepagent.transcript import tree_items

    tool = mail()
    h = await asked(harness(provider_mailing(text("Okay.")), tool))
    await decide(h, "approve", "x1", call_id="tc-unknown")
    await decide(h, "edit", "x2", args={"to": 7})
    kept = [n async for r in h.conversation.usage_records("t1") for n in record_notices("t1", r)]
    assert [(n["type"], n.get("tool_call_id"), n["retrying"]) for n in kept] == [
        ("error", "tc-unknown", False),
        ("error", "tc-1", False),
    ]
    items = [i async for i in tree_items(h.conversation, "t1")]
    errors = [i for i in items if i["kind"] == "error"]
    assert [(i["tool_call_id"], i["text"]) for i in errors] == [
        (n["tool_call_id"], n["message"]) for n in kept
    ]
    [call_item] = [i for i in items if i["kind"] == "tool_call"]
    assert call_item["approval"] == "pending"  # a refusal leaves the call waiting
    assert [i["kind"] for i in items][-3:] == ["tool_call", "error", "error"]


async def test_a_call_waiting_for_approval_is_not_taken_for_a_structured_answer() -> None:
    tool = mail()
    h = harness(provider_mailing(text('{"sent": true}')), tool)
    h.config.agent = AgentConfig(
        approval=("send_email",), output_schema={"type": "object", "required": ["sent"]}
    )
    await asked(h)
    assert len(h.provider.requests) == 1  # the text before the call was not sent back as a wrong answer
    await decide(h, "approve", "a1")
    assert tool.dispatches != []
