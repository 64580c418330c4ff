"""The terminal's approval lines and answers (pure: no stack): the inline question, the typed answers
``y`` / ``n [why]`` / ``e JSON`` / ``r TEXT``, the decision lines, and ``tail``'s hint instead of a question."""

from __future__ import annotations

import io
from typing import Any, cast

import pytest

from stepagent.client.api import Client
from stepagent.client.terminal import Activity, Chat, Screen, approval_line, item_line, parse_decision

WAITING = {
    "thread_id": "conv",
    "order": 3,
    "kind": "tool_call",
    "name": "send_email",
    "args": {"to": "bob"},
    "tool_call_id": "c1",
    "approval": "pending",
}


def test_the_question_and_the_typed_answers() -> None:
    assert (
        approval_line(WAITING, "conv") == '⏸ send_email({"to":"bob"})  approve? [y]es [n]o [e]dit [r]espond'
    )
    assert approval_line({**WAITING, "thread_id": "child-123456789"}, "conv").startswith("[child child-12] ⏸")
    assert parse_decision("y") == ("approve", None, None)
    assert parse_decision(" yes ") == ("approve", None, None)
    assert parse_decision("n") == ("reject", None, None)
    assert parse_decision("n not today") == ("reject", None, "not today")
    assert parse_decision('e {"to": "carol"}') == ("edit", {"to": "carol"}, None)
    assert parse_decision("r already sent") == ("respond", None, "already sent")
    for bad, hint in [("e", "JSON"), ("e [1]", "object"), ("r", "answer"), ("maybe", "answer y")]:
        with pytest.raises(ValueError, match=hint):
            parse_decision(bad)


def test_decision_lines() -> None:
    edited = {
        "thread_id": "conv",
        "kind": "approval",
        "tool_call_id": "c1",
        "approval": "edited",
        "args": {"to": "x"},
    }
    assert item_line(edited, "conv") == 'agent ✎ edited c1 → {"to": "x"}'
    rejected = {
        "thread_id": "conv",
        "kind": "approval",
        "tool_call_id": "c1",
        "approval": "rejected",
        "text": "no",
    }
    assert item_line(rejected, "conv") == "agent ✗ rejected c1: no"


@pytest.mark.parametrize("decides", [True, False])
def test_chat_asks_and_tail_shows_the_command(decides: bool) -> None:
    out = io.StringIO()
    chat = Chat(cast(Client, None), "conv", Screen(out, interactive=False), Activity("conv"), decides=decides)
    chat.show(cast(dict[str, Any], WAITING))
    shown = out.getvalue()
    assert "agent ⚙ send_email" in shown
    if decides:
        assert "approve? [y]es [n]o [e]dit [r]espond" in shown and chat.activity.approval == WAITING
    else:
        assert "stepagent approve conv c1 [--reject [MSG] | --edit JSON | --respond TEXT]" in shown
    assert chat.activity.status(80) is not None and "decision" in str(chat.activity.status(80))
