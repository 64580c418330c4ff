"""Small things a person meets at the command line: "did you mean" for a mistyped command or option, the
``history`` marks of a call that waited for a person, the structured-output feedback shown for what it is,
and a child thread's lines in the order things happened."""

from __future__ import annotations

import pytest

from stepagent.cli import main
from stepagent.client.interleave import interleave
from stepagent.history_items import UserItem
from stepagent.messages import TextContent
from stepagent.stores.base import StoredRow
from stepagent.transcript import Item, describe_row, format_transcript, item_line
from tests.integration.test_cli import clean_env, stepagent


def test_a_mistyped_option_or_command_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--sya", "hi"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: stepagent run" in err  # the command's usage, not the top level's
    assert "unrecognized arguments: --sya (did you mean --say?) hi" in err
    with pytest.raises(SystemExit):
        main(["rnu"])
    assert "invalid choice: 'rnu'" in (err := capsys.readouterr().err) and "did you mean run?" in err
    with pytest.raises(SystemExit):
        main(["dlq", "lsit"])
    assert "did you mean list?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["history", "t", "--jsno"])
    assert "did you mean --json?" in capsys.readouterr().err


def test_history_marks_decisions_as_the_chat_does() -> None:
    call: Item = {
        "thread_id": "r",
        "order": 2,
        "kind": "tool_call",
        "name": "send",
        "args": {},
        "tool_call_id": "c",
    }
    lines = format_transcript(
        [
            {**call, "approval": "approved"},
            {**call, "order": 4, "approval": "edited"},
            {**call, "order": 6, "approval": "rejected"},
            {**call, "order": 8, "approval": "responded"},
            {**call, "order": 10, "approval": "pending"},
        ],
        root_id="r",
    )
    assert [line.split(")  ", 1)[1] for line in lines[1:]] == [
        "✔ approved",
        "✎ edited (the arguments shown are the person's)",
        "✗ rejected",
        "↩ responded",
        "⏸ waiting for a decision",
    ]
    assert not any("[approval:" in line for line in lines)


def test_output_schema_feedback_is_not_shown_as_the_user_typing() -> None:
    feedback = "Your answer does not match the required output schema:\n- 'n' is a required property"
    row = StoredRow(5, "msg-1-output-check-1", UserItem(TextContent(text=feedback)))
    item = describe_row("r", row)
    assert item["kind"] == "user" and item["output_check"] is True  # what the model saw, marked
    assert item_line(item, "r") == f"agent ↻ output check: {' '.join(feedback.split())}"
    assert format_transcript([item], root_id="r")[1].startswith("   5 ↻ output check: Your answer")
    typed = describe_row("r", StoredRow(1, "msg-1", UserItem(TextContent(text="hi"))))
    assert "output_check" not in typed and item_line(typed, "r") == "user > hi"


def test_a_childs_lines_come_before_what_they_caused_in_the_parent() -> None:
    def row(thread: str, kind: str, **fields: object) -> Item:
        return {"thread_id": thread, "kind": kind, **fields}  # type: ignore[typeddict-item]

    items = [
        row("r", "tool_call", name="spawn_thread"),
        row("r", "event", text="Report from child thread: hi"),
        row("r", "event", text="Child thread with ID k has shut down"),
        row("r", "assistant", text="done"),
        row("k", "assistant", text="child here"),
        row("k", "tool_call", name="report_to_parent"),
        row("k", "tool_result", text="Report sent to parent thread."),
        row("k", "tool_call", name="close_thread"),
    ]
    ordered = interleave(items, {"r": None, "k": "r"}, "r")
    assert [(i["thread_id"], i.get("name") or i.get("text")) for i in ordered] == [
        ("r", "spawn_thread"),
        ("k", "child here"),
        ("k", "report_to_parent"),
        ("r", "Report from child thread: hi"),
        ("k", "Report sent to parent thread."),
        ("k", "close_thread"),
        ("r", "Child thread with ID k has shut down"),
        ("r", "done"),
    ]
    assert sorted(map(id, ordered)) == sorted(map(id, items))


def test_run_say_shows_the_childs_report_before_the_parent_receives_it() -> None:
    result = stepagent("run", "--say", "hi", env=clean_env())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    report = next(i for i, line in enumerate(lines) if "⚙ report_to_parent(" in line)
    received = next(i for i, line in enumerate(lines) if line.startswith("agent ✉ Report from child thread"))
    closed = next(i for i, line in enumerate(lines) if "⚙ close_thread(" in line)
    shut = next(i for i, line in enumerate(lines) if "has shut down" in line)
    assert report < received and closed < shut, result.stdout
    assert not lines[-2].startswith("[child "), (
        result.stdout
    )  # the root's final answer is not followed by the child
