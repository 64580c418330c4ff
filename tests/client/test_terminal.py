"""The terminal chat's rendering (pure): the line of each reply item, and the status line from what the
items say is happening."""

from __future__ import annotations

import io

from stepagent.client.terminal import Activity, Screen, item_line


def test_each_kind_of_item_has_its_line() -> None:
    root, child = "root", "0123456789abcdef"
    assert item_line({"thread_id": root, "kind": "assistant", "text": "hi"}, root) == "agent > hi"
    assert item_line({"thread_id": child, "kind": "assistant", "text": "hi"}, root) == "[child 01234567] > hi"
    call = {"thread_id": root, "kind": "tool_call", "name": "get_time", "args": {}}
    assert item_line(call, root) == "agent ⚙ get_time()"
    oauth = {"thread_id": root, "kind": "oauth", "auth_url": "https://example.com/a", "tool_call_id": "c"}
    assert item_line(oauth, root) == "agent 🔑 authorise at https://example.com/a"
    choice = {
        "thread_id": root,
        "kind": "choice",
        "prompt": "Which?",
        "choices": ["a", "b"],
        "choice_id": "c",
    }
    assert item_line(choice, root) == "agent ? Which? [0: a, 1: b]"
    error = {"thread_id": root, "kind": "error", "text": "boom", "retrying": True}
    assert item_line(error, root) == "agent ! boom (retrying)"
    assert (
        item_line({"thread_id": root, "kind": "user", "text": "from elsewhere"}, root)
        == "user > from elsewhere"
    )
    for silent in ("reasoning", "summary", "partial", "idle"):
        assert item_line({"thread_id": root, "kind": silent, "text": "x"}, root) is None


def test_the_status_says_what_is_running() -> None:
    activity = Activity("root")
    assert activity.status(80) is None  # idle: no status line
    activity.see(
        {"thread_id": "root", "kind": "partial", "phase": "writing", "text": "Let me check", "after": 1}
    )
    assert activity.status(80).endswith("agent is writing: Let me check")  # type: ignore[union-attr]
    activity.see(
        {"thread_id": "root", "kind": "tool_call", "order": 2, "name": "get_time", "tool_call_id": "c"}
    )
    assert activity.status(80).endswith("agent: running get_time")  # type: ignore[union-attr]
    activity.see({"thread_id": "root", "kind": "choice", "choice_id": "c", "choices": ["a"], "prompt": "?"})
    assert "waiting for your answer" in str(activity.status(80))
    activity.see({"thread_id": "root", "kind": "tool_result", "order": 3, "tool_call_id": "c", "text": "ok"})
    assert activity.choice is None and activity.status(80).endswith("working")  # type: ignore[union-attr]
    activity.see({"thread_id": "root", "kind": "idle"})
    assert activity.status(80) is None


def test_lines_are_printed_above_the_status_and_the_prompt() -> None:
    out = io.StringIO()
    screen = Screen(out, interactive=True)
    screen.show_prompt(True)
    screen.typed("hel")
    screen.set_status("⠋ working")
    screen.line("agent > hi")
    # The last write erased the prompt and the status line, printed the line, then drew both again.
    assert out.getvalue().endswith("\r\x1b[K\x1b[1A\r\x1b[Kagent > hi\n⠋ working\nyou > hel")
    plain = io.StringIO()
    Screen(plain, interactive=False).line("agent > hi")
    assert plain.getvalue() == "agent > hi\n"  # no terminal: no escapes


def test_a_reached_limit_is_a_line() -> None:
    root = "conv-1"
    item = {"thread_id": root, "kind": "limit", "text": "model_calls_per_turn limit reached (3 of 3)"}
    assert item_line(item, root) == "agent ⏹ model_calls_per_turn limit reached (3 of 3)"
