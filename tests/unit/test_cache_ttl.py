"""The prompt-cache TTL decision: which waits are slow, what ``auto`` picks, the setting's validation."""

from __future__ import annotations

import pytest

from stepagent.agent_config import AgentConfig, agent_config_from_env
from stepagent.core.cache_ttl import choose_ttl, input_wait_kinds, is_slow_wait, latest_call_kind
from stepagent.errors import ConfigurationError
from stepagent.history_items import AssistantText, ToolCallItem, UserItem
from stepagent.messages import ApprovalDecision, InputMessage, TextContent, ThreadReport, ToolCall, ToolResult
from stepagent.tools.base import Tool, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.sleep import Sleep, SleepUntil


class Remote(Tool):
    name = "remote"
    wait = "rap"


class Function(Tool):
    name = "function"


TOOLS = Toolset.of([Remote(), Function(), *builtin_tools()])


@pytest.mark.parametrize(
    ("kinds", "slow"),
    [
        ({"rap"}, True),
        ({"sleep"}, True),
        ({"child"}, True),
        ({"approval"}, True),  # a pending approval waits for a person
        ({"tool", "user", "event"}, False),
        (set(), False),
    ],
)
def test_which_waits_are_slow(kinds: set[str], slow: bool) -> None:
    assert is_slow_wait(kinds) is slow


def test_auto_picks_an_hour_only_for_slow_waits_and_fixed_settings_win() -> None:
    assert choose_ttl("auto", slow=True) == "1h"
    assert choose_ttl("auto", slow=False) == "5m"
    assert choose_ttl("5m", slow=True) == "5m"
    assert choose_ttl("1h", slow=False) == "1h"


def test_what_a_steps_inputs_ended() -> None:
    user = InputMessage.user_text("t", "hi")
    remote = InputMessage.tool_result("t", ToolResult.text("c1", "done"))
    function = InputMessage.tool_result("t", ToolResult.text("c2", "done"))
    report = InputMessage(
        content=ToolResult.text("spawn", "report"),
        group_id="t",
        synthetic=ThreadReport(tool_call_id="spawn", child_thread_id="c"),
    )
    pending = {"c1": "remote", "c2": "function"}
    assert input_wait_kinds([user], pending, TOOLS) == {"user"}
    assert input_wait_kinds([remote], pending, TOOLS) == {"rap"}
    assert input_wait_kinds([function], pending, TOOLS) == {"tool"}
    assert input_wait_kinds([report], pending, TOOLS) == {"child"}


def test_the_latest_call_says_what_kind_of_thread_it_is() -> None:
    def call(name: str) -> ToolCallItem:
        return ToolCallItem(ToolCall(id=name, name=name))

    assert latest_call_kind([UserItem(TextContent(text="hi")), AssistantText("ok")], TOOLS) is None
    assert latest_call_kind([call("function"), call("remote"), AssistantText("ok")], TOOLS) == "rap"
    assert latest_call_kind([call("remote"), call("function")], TOOLS) == "tool"
    assert latest_call_kind([call("spawn_thread")], TOOLS) == "child"
    assert latest_call_kind([call("unknown")], TOOLS) == "tool"
    assert Sleep.wait == SleepUntil.wait == "sleep"


def test_the_setting_is_validated_with_a_clear_error() -> None:
    assert AgentConfig().prompt_cache_ttl == "auto"
    assert agent_config_from_env({"STEPAGENT_PROMPT_CACHE_TTL": " 1H "}).prompt_cache_ttl == "1h"
    with pytest.raises(ConfigurationError) as caught:
        agent_config_from_env({"STEPAGENT_PROMPT_CACHE_TTL": "10m"})
    assert "STEPAGENT_PROMPT_CACHE_TTL='10m' is invalid: use 5m, 1h or auto" in str(caught.value)


def test_an_approval_is_a_slow_wait_both_ways() -> None:
    """A decision input ends a wait for a person, and a thread whose latest call waited for one is expected
    to wait for people again: both make ``auto`` write one-hour entries."""
    decision = InputMessage(
        content=ApprovalDecision(tool_call_id="c2", decision="approve"), group_id="t", id="d-1"
    )
    assert input_wait_kinds([decision], {"c2": "function"}, TOOLS) == {"approval"}
    waiting = ToolCallItem(call=ToolCall(id="c2", name="function", arguments={}), needs_approval=True)
    assert latest_call_kind([UserItem(TextContent(text="hi")), waiting], TOOLS) == "approval"
    plain = ToolCallItem(call=ToolCall(id="c3", name="function", arguments={}))
    assert latest_call_kind([waiting, plain], TOOLS) == "tool"
