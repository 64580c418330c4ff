"""The approval wire formats: the input content (schema-level bad input is refused at parse, so the worker
dead-letters it with an error event), the stored rows (round trip, old rows still read), the
``approval_required`` output event and the ``STEPAGENT_APPROVAL`` setting."""

from __future__ import annotations

import json

import pytest

from stepagent.agent_config import AgentConfig, agent_config_from_env, load_profiles
from stepagent.errors import ConfigurationError, MalformedMessageError
from stepagent.history_items import ApprovalItem, ToolCallItem, decode_item, encode_item
from stepagent.messages import ApprovalDecision, ToolCall, parse_input_message
from stepagent.outputs.build import row_events
from stepagent.stores.base import StoredRow


def body(content: dict[str, object]) -> str:
    return json.dumps({"content": {"type": "approval", **content}, "group_id": "t1"})


def test_the_contract_shape_parses() -> None:
    message = parse_input_message(
        body({"tool_call_id": "c1", "decision": "edit", "args": {"to": "x"}, "message": "fixed"})
    )
    assert message.content == ApprovalDecision(
        tool_call_id="c1", decision="edit", args={"to": "x"}, message="fixed"
    )
    assert parse_input_message(message.to_json()) == message  # round trip


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"tool_call_id": "c1", "decision": "maybe"}, "content.decision"),
        ({"tool_call_id": "c1", "decision": "edit"}, "content"),  # edit without args
        ({"tool_call_id": "c1", "decision": "edit", "args": [1]}, "content.args"),
        ({"tool_call_id": "c1", "decision": "respond"}, "content"),  # respond without a message
        ({"decision": "approve"}, "content.tool_call_id"),
    ],
)
def test_schema_level_bad_input_is_refused_with_the_field(content: dict[str, object], field: str) -> None:
    with pytest.raises(MalformedMessageError) as raised:
        parse_input_message(body(content))
    assert raised.value.field == field


def test_rows_round_trip_and_old_call_rows_still_read() -> None:
    call = ToolCallItem(ToolCall(id="c1", name="send_email", arguments={"to": "x"}), needs_approval=True)
    decision = ApprovalItem("c1", "edit", {"to": "y"}, "typo")
    for item in (call, decision, ApprovalItem("c1", "approve")):
        assert decode_item(encode_item(item)) == item
    old = ToolCallItem(ToolCall(id="c2", name="lookup"))
    assert "needs_approval" not in encode_item(old)  # rows without approval are byte-identical to before
    assert decode_item(encode_item(old)) == old


def test_a_waiting_call_row_publishes_approval_required() -> None:
    call = ToolCallItem(ToolCall(id="c1", name="send_email", arguments={"to": "x"}), needs_approval=True)
    events = row_events("t1", [StoredRow(3, "m", call)])
    assert [e["type"] for e in events] == ["tool_call", "approval_required"]
    asked = events[1]
    assert (asked["tool_call_id"], asked["name"], asked["args"]) == ("c1", "send_email", {"to": "x"})
    assert asked["event_id"] != events[0]["event_id"]
    # A decision row publishes the decision only (never the call again), with the edited arguments.
    [decided] = row_events("t1", [StoredRow(4, "a", ApprovalItem("c1", "edit", {"to": "y"}))])
    assert (decided["type"], decided["tool_call_id"], decided["decision"]) == ("approval", "c1", "edit")
    assert (decided["approval"], decided["args"]) == ("edited", {"to": "y"})


def test_the_setting_and_the_profile_field() -> None:
    config = agent_config_from_env({"STEPAGENT_APPROVAL": " send_email, crm_* ,,send_email"})
    assert config.approval == ("send_email", "crm_*")
    assert AgentConfig().approval == ()
    profiles = load_profiles(json.dumps({"support": {"approval": ["refund"]}}), [])
    assert profiles["support"].approval == ("refund",)
    with pytest.raises(ConfigurationError, match="approval"):
        load_profiles(json.dumps({"support": {"approval": 3}}), [])
