"""The scripted model: matching, streaming, placeholders, ids, usage, errors and script validation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from stepagent.errors import ConfigurationError, ProviderError
from stepagent.history_items import (
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import ImageBlock, ImageContent, TextBlock, TextContent, ToolCall, ToolResult
from stepagent.providers.base import (
    Final,
    ModelInfo,
    ModelRequest,
    ReasoningComplete,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    ToolCallDelta,
    ToolSpec,
)
from stepagent.providers.scripted import (
    Script,
    ScriptedProvider,
    load_script,
    request_chars,
    split_chunks,
)

DEMO_SCRIPT = Path(__file__).parents[2] / "src" / "stepagent" / "demo" / "demo_script.json"


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def call(name: str, call_id: str = "c1", **arguments: Any) -> ToolCallItem:
    return ToolCallItem(ToolCall(id=call_id, name=name, arguments=arguments))


def result(text: str, call_id: str = "c1") -> ToolResultItem:
    return ToolResultItem(ToolResult.text(call_id, text))


def event(text: str, original: str = "spawn-1") -> EventItem:
    return EventItem(result=ToolResult.text("", text), tool_call_id=original, child_thread_id="child")


def request(
    *history: HistoryItem,
    stack: list[str] | None = None,
    system: str = "You are a test.",
    tools: list[ToolSpec] | None = None,
) -> ModelRequest:
    return ModelRequest(
        system=system,
        history=list(history),
        tools=tools or [],
        model=ModelInfo(model_id="scripted:inline"),
        thread_stack=["root"] if stack is None else stack,
    )


async def collect(provider: ScriptedProvider, req: ModelRequest) -> list[StreamEvent]:
    return [ev async for ev in provider.stream(req)]


def text_of(events: list[StreamEvent]) -> str:
    return "".join(ev.text for ev in events if isinstance(ev, TextDelta))


def calls_of(events: list[StreamEvent]) -> list[ToolCall]:
    return [ev.call for ev in events if isinstance(ev, ToolCallComplete)]


BASIC: dict[str, Any] = {
    "rules": [
        {"when": "(?i)weather", "reply": [{"text": "It is sunny."}]},
        {"when": "^sunny", "reply": [{"text": "tool said sunny"}]},
        {"when": "shut down", "reply": [{"text": "child done"}]},
        {"when": "weather|anything", "reply": [{"text": "second rule"}]},
    ],
    "default": [{"text": "default reply"}],
}


# ---------------------------------------------------------------------------------------------------------
# Matching


async def test_first_matching_rule_wins_on_user_text() -> None:
    provider = ScriptedProvider(BASIC)
    assert text_of(await collect(provider, request(user("What's the WEATHER?")))) == "It is sunny."


async def test_rule_matches_last_tool_result_text() -> None:
    provider = ScriptedProvider(BASIC)
    history: list[HistoryItem] = [user("weather please"), call("get_weather"), result("sunny, 21C")]
    assert text_of(await collect(provider, request(*history))) == "tool said sunny"


async def test_tool_result_text_blocks_are_joined() -> None:
    script = {"rules": [{"when": "first\nsecond", "reply": [{"text": "joined"}]}]}
    item = ToolResultItem(ToolResult(id="c1", content=[TextBlock(text="first"), TextBlock(text="second")]))
    assert text_of(await collect(ScriptedProvider(script), request(user("x"), call("t"), item))) == "joined"


async def test_rule_matches_event_pair_result_text() -> None:
    provider = ScriptedProvider(BASIC)
    history: list[HistoryItem] = [
        user("hi"),
        AssistantText("ok"),
        event("Child thread with ID x has shut down"),
    ]
    assert text_of(await collect(provider, request(*history))) == "child done"


async def test_trailing_assistant_items_do_not_count_as_input() -> None:
    # The input is the last user/tool-result/event item, even if assistant items follow it.
    provider = ScriptedProvider(BASIC)
    history: list[HistoryItem] = [
        user("weather?"),
        AssistantText("sunny"),
        Reasoning("thinking about sunny", "sig"),
    ]
    assert text_of(await collect(provider, request(*history))) == "It is sunny."


async def test_default_when_nothing_matches() -> None:
    provider = ScriptedProvider(BASIC)
    assert text_of(await collect(provider, request(user("hello")))) == "default reply"


async def test_image_only_user_item_has_empty_text() -> None:
    script = {"rules": [{"when": "^$", "reply": [{"text": "an image"}]}]}
    item = UserItem(ImageContent(data="aGVsbG8=", media_type="image/png"))
    assert text_of(await collect(ScriptedProvider(script), request(item))) == "an image"


async def test_no_match_without_default_is_a_clear_non_retryable_error() -> None:
    provider = ScriptedProvider({"rules": [{"when": "^never$", "reply": [{"text": "x"}]}]})
    long_text = "please " * 100
    with pytest.raises(ProviderError) as info:
        await collect(provider, request(user(long_text)))
    assert not info.value.retryable
    message = str(info.value)
    assert "no rule matched" in message
    assert "please please" in message
    assert len(message) < 400  # the quoted text is truncated
    assert "…" in message


async def test_on_restricts_a_rule_to_input_kinds() -> None:
    script = {
        "rules": [
            {"when": "sunny", "on": ["tool_result"], "reply": [{"text": "from tool"}]},
            {"when": "sunny", "on": "event", "reply": [{"text": "from event"}]},
        ],
        "default": [{"text": "fallback"}],
    }
    provider = ScriptedProvider(script)
    assert text_of(await collect(provider, request(user("sunny")))) == "fallback"
    assert text_of(await collect(provider, request(user("x"), call("t"), result("sunny")))) == "from tool"
    assert text_of(await collect(provider, request(user("x"), event("sunny")))) == "from event"


async def test_empty_history_matches_empty_text() -> None:
    provider = ScriptedProvider({"rules": [{"when": "^$", "reply": [{"text": "empty"}]}]})
    assert text_of(await collect(provider, request())) == "empty"


# ---------------------------------------------------------------------------------------------------------
# Events


async def test_text_streams_in_several_chunks_that_reassemble_exactly() -> None:
    text = "  Hello there,\n  this is a  longer reply with   odd spacing.  "
    provider = ScriptedProvider({"default": [{"text": text}]})
    events = await collect(provider, request(user("hi")))
    deltas = [ev for ev in events if isinstance(ev, TextDelta)]
    assert len(deltas) == 3
    assert "".join(d.text for d in deltas) == text
    assert isinstance(events[-1], Final)


@pytest.mark.parametrize("text", ["", "one", "two words", "a b c d e f g", "x\n\ny", " ", "日本語 テキスト"])
def test_split_chunks_reassembles(text: str) -> None:
    chunks = split_chunks(text)
    assert "".join(chunks) == text
    assert 0 < len(chunks) <= 3 or text == ""
    assert all(chunks)


async def test_reasoning_with_signature() -> None:
    script = {"default": [{"reasoning": "Let me think about it.", "signature": "sig-1"}, {"text": "Done."}]}
    events = await collect(ScriptedProvider(script), request(user("q")))
    deltas = [ev.text for ev in events if isinstance(ev, ReasoningDelta)]
    assert "".join(deltas) == "Let me think about it."
    complete = [ev for ev in events if isinstance(ev, ReasoningComplete)]
    assert complete == [ReasoningComplete(text="Let me think about it.", signature="sig-1")]
    kinds = [type(ev) for ev in events]
    # Deltas, then the complete block, then the text, then Final.
    assert kinds.index(ReasoningComplete) > max(i for i, k in enumerate(kinds) if k is ReasoningDelta)
    assert kinds.index(ReasoningComplete) < kinds.index(TextDelta)
    assert kinds[-1] is Final


async def test_reasoning_without_signature() -> None:
    events = await collect(ScriptedProvider({"default": [{"reasoning": "hmm"}]}), request(user("q")))
    assert [ev for ev in events if isinstance(ev, ReasoningComplete)] == [ReasoningComplete("hmm", None)]


async def test_tool_call_events() -> None:
    script = {
        "default": [{"text": "Calling."}, {"tool_call": {"name": "get_time", "arguments": {"tz": "UTC"}}}]
    }
    events = await collect(ScriptedProvider(script), request(user("time?")))
    deltas = [ev for ev in events if isinstance(ev, ToolCallDelta)]
    assert deltas == [ToolCallDelta(name="get_time")]
    (tool_call,) = calls_of(events)
    assert tool_call.name == "get_time"
    assert tool_call.arguments == {"tz": "UTC"}
    assert tool_call.id.startswith("call_") and len(tool_call.id) == len("call_") + 12
    assert events.index(deltas[0]) < next(
        i for i, ev in enumerate(events) if isinstance(ev, ToolCallComplete)
    )
    assert isinstance(events[-1], Final)


async def test_tool_call_without_arguments_has_empty_arguments() -> None:
    events = await collect(ScriptedProvider({"default": [{"tool_call": {"name": "t"}}]}), request(user("x")))
    assert calls_of(events)[0].arguments == {}


async def test_placeholders_substituted_at_any_depth() -> None:
    arguments = {
        "thread_id": "{thread_id}",
        "child_of": "{thread_stack}",
        "nested": {"list": ["{thread_id}", {"deep": "{thread_stack}"}], "keep": "x {thread_id}"},
        "number": 3,
        "{thread_id}": "key is not substituted",
    }
    script = {"default": [{"tool_call": {"name": "t", "arguments": arguments}}]}
    events = await collect(ScriptedProvider(script), request(user("x"), stack=["root", "mid", "leaf"]))
    args = calls_of(events)[0].arguments
    assert args["thread_id"] == "leaf"
    assert args["child_of"] == ["root", "mid", "leaf"]
    assert args["nested"]["list"] == ["leaf", {"deep": ["root", "mid", "leaf"]}]
    assert args["nested"]["keep"] == "x {thread_id}"  # only exact matches are placeholders
    assert args["number"] == 3
    assert args["{thread_id}"] == "key is not substituted"
    # The script itself is not mutated by substitution.
    assert arguments["thread_id"] == "{thread_id}"


async def test_placeholder_without_thread_stack_is_a_clear_error() -> None:
    script = {"default": [{"tool_call": {"name": "t", "arguments": {"id": "{thread_id}"}}}]}
    with pytest.raises(ProviderError, match="no thread stack") as info:
        await collect(ScriptedProvider(script), request(user("x"), stack=[]))
    assert not info.value.retryable


async def test_tool_call_ids_are_deterministic_and_unique() -> None:
    script = {"default": [{"tool_call": {"name": "a"}}, {"tool_call": {"name": "b"}}]}
    provider = ScriptedProvider(script)
    history: list[HistoryItem] = [user("x")]
    first = calls_of(await collect(provider, request(*history)))
    again = calls_of(await collect(ScriptedProvider(script), request(*history)))
    assert [c.id for c in first] == [c.id for c in again]  # same request → same ids
    assert first[0].id != first[1].id  # distinct within one reply
    later = calls_of(
        await collect(provider, request(*history, call("a", first[0].id), result("r", first[0].id)))
    )
    other_thread = calls_of(await collect(provider, request(*history, stack=["root", "child"])))
    same_length_other_content = calls_of(await collect(provider, request(user("y"))))
    ids = {c.id for c in first + later + other_thread + same_length_other_content}
    assert len(ids) == 8


async def test_usage_is_one_token_per_four_characters() -> None:
    tools = [ToolSpec(name="get_time", description="Get the time.", parameters={"type": "object"})]
    history: list[HistoryItem] = [
        Summary("earlier", 3),
        user("hello"),
        AssistantText("hi"),
        Reasoning("thought", "sig"),
        call("get_time", tz="UTC"),
        ToolResultItem(ToolResult(id="c1", content=[TextBlock(text="12:00"), ImageBlock(data="QUJD")])),
        event("report"),
        UserItem(ImageContent(data="aGk=", media_type="image/png")),
    ]
    script = {
        "default": [
            {"reasoning": "abc"},
            {"text": "hello world"},
            {"tool_call": {"name": "t", "arguments": {"k": "{thread_id}"}}},
        ]
    }
    events = await collect(ScriptedProvider(script), request(*history, system="SYS", tools=tools))
    final = events[-1]
    assert isinstance(final, Final) and final.usage is not None

    specs_json = json.dumps(
        [{"name": "get_time", "description": "Get the time.", "parameters": {"type": "object"}}],
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    image_json = json.dumps(
        {"type": "image", "data": "aGk=", "media_type": "image/png"},
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    expected_chars = (
        len("SYS")
        + len("[Compacted conversation summary]\nearlier")
        + len("hello")
        + len("hi")
        + len("thought")
        + len("get_time") + len('{"tz":"UTC"}')
        + len("12:00") + len("QUJD")
        + len("report")
        + len(image_json)
        + len(specs_json)
    )  # fmt: skip
    assert request_chars(request(*history, system="SYS", tools=tools)) == expected_chars
    assert final.usage.input_tokens == math.ceil(expected_chars / 4)
    output_chars = len("abc") + len("hello world") + len("t") + len('{"k":"root"}')
    assert final.usage.output_tokens == math.ceil(output_chars / 4)


async def test_usage_counts_system_prompt_growth() -> None:
    provider = ScriptedProvider({"default": [{"text": "x"}]})
    small = (await collect(provider, request(user("a"), system="")))[-1]
    big = (await collect(provider, request(user("a"), system="s" * 400)))[-1]
    assert isinstance(small, Final) and isinstance(big, Final)
    assert small.usage is not None and big.usage is not None
    assert big.usage.input_tokens - small.usage.input_tokens == 100


@pytest.mark.parametrize("retryable", [True, False])
async def test_error_event_raises_at_its_point_in_the_stream(retryable: bool) -> None:
    script = {
        "default": [
            {"text": "partial answer"},
            {"error": "overloaded", "retryable": retryable},
            {"text": "x"},
        ]
    }
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as info:
        async for ev in ScriptedProvider(script).stream(request(user("q"))):
            seen.append(ev)
    assert str(info.value) == "overloaded"
    assert info.value.retryable is retryable
    assert text_of(seen) == "partial answer"
    assert not any(isinstance(ev, Final) for ev in seen)


async def test_error_event_retryable_defaults_to_false() -> None:
    with pytest.raises(ProviderError) as info:
        await collect(ScriptedProvider({"default": [{"error": "bad request"}]}), request(user("q")))
    assert not info.value.retryable


async def test_final_is_last_and_unique() -> None:
    events = await collect(ScriptedProvider(BASIC), request(user("weather")))
    assert [isinstance(ev, Final) for ev in events].count(True) == 1
    assert isinstance(events[-1], Final)
    assert events[-1].stop_reason == "end_turn"


# ---------------------------------------------------------------------------------------------------------
# Info, loading, validation


def test_info_for_inline_and_file_scripts(tmp_path: Path) -> None:
    inline = ScriptedProvider({"default": [], "context_window": 1000})
    assert inline.info == ModelInfo(
        model_id="scripted:inline", context_window=1000, supports_image_input=True
    )
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"default": [{"text": "hi"}]}))
    from_file = ScriptedProvider(str(path))
    assert from_file.info.model_id == f"scripted:{path}"
    assert from_file.info.context_window == 0
    assert from_file.info.supports_image_input
    assert ScriptedProvider(f"scripted:{path}").info.model_id == f"scripted:{path}"
    assert ScriptedProvider(path).info.model_id == f"scripted:{path}"
    assert ScriptedProvider(load_script(path)).script.default is not None


async def test_file_script_streams(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(BASIC))
    assert text_of(await collect(ScriptedProvider(str(path)), request(user("weather")))) == "It is sunny."


def test_missing_file_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigurationError, match="cannot read script") as info:
        load_script(missing)
    assert str(missing) in str(info.value)


def test_invalid_json_names_path_and_position(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"rules": [\n  {"when": "x",}\n]}')
    with pytest.raises(ConfigurationError, match="not valid JSON") as info:
        load_script(path)
    assert str(path) in str(info.value)
    assert "line 2" in str(info.value)


@pytest.mark.parametrize(
    ("script", "fragment"),
    [
        ([], "must be a JSON object"),
        ({}, "needs 'rules', 'default' or both"),
        ({"rules": [], "extra": 1}, "unknown key 'extra'; allowed: rules, default"),
        ({"rules": {}}, "rules: must be a list"),
        ({"rules": ["x"]}, "rules[0]: must be a JSON object, got a string"),
        ({"rules": [{"reply": []}]}, "rules[0]: missing 'when'"),
        ({"rules": [{"when": "x"}]}, "rules[0]: missing 'reply'"),
        ({"rules": [{"when": 3, "reply": []}]}, "rules[0].when: must be a string"),
        (
            {"rules": [{"when": "(unclosed", "reply": []}]},
            "rules[0].when: bad regular expression '(unclosed'",
        ),
        (
            {"rules": [{"when": "x", "reply": [], "then": 1}]},
            "rules[0]: unknown key 'then'; allowed: when, reply, on",
        ),
        (
            {"rules": [{"when": "x", "reply": [], "on": ["assistant"]}]},
            "rules[0].on[0]: 'assistant' is not one of 'user', 'tool_result' or 'event'",
        ),
        ({"rules": [{"when": "x", "reply": [], "on": []}]}, "rules[0].on: must not be empty"),
        ({"rules": [{"when": "x", "reply": {"text": "a"}}]}, "rules[0].reply: must be a list, got an object"),
        ({"default": [{"txt": "hi"}]}, "default[0]: an event needs exactly one of"),
        ({"default": [{"text": "a", "error": "b"}]}, "found 'text' and 'error'"),
        ({"default": [{"text": "a", "delay": 1}]}, "default[0]: unknown key 'delay'"),
        ({"default": [{"text": 5}]}, "default[0].text: must be a string, got a number"),
        ({"default": [{"reasoning": "r", "signature": 1}]}, "default[0].signature: must be a string"),
        ({"default": [{"error": "e", "retryable": "yes"}]}, "default[0].retryable: must be true or false"),
        (
            {"default": [{"tool_call": "get_time"}]},
            "default[0].tool_call: must be a JSON object, got a string",
        ),
        ({"default": [{"tool_call": {"arguments": {}}}]}, "default[0].tool_call: missing 'name'"),
        ({"default": [{"tool_call": {"name": ""}}]}, "default[0].tool_call.name: must not be empty"),
        (
            {"default": [{"tool_call": {"name": "t", "arguments": []}}]},
            "tool_call.arguments: must be a JSON object, got a list",
        ),
        (
            {"default": [{"tool_call": {"name": "t", "args": {}}}]},
            "default[0].tool_call: unknown key 'args'; allowed: name, arguments",
        ),
        ({"default": [], "context_window": -1}, "context_window: must be at least 0, got -1"),
        ({"default": [], "context_window": True}, "context_window: must be a whole number, got True"),
        ({"rules": [{"when": "a", "reply": []}, {"when": "b", "reply": [None]}]}, "rules[1].reply[0]"),
    ],
)
def test_bad_scripts_fail_with_clear_messages(tmp_path: Path, script: Any, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ScriptedProvider(script) if isinstance(script, dict) else ScriptedProvider(_write(tmp_path, script))
    message = str(info.value)
    assert fragment in message
    assert message.startswith("scripted model: invalid script ")


def test_every_problem_of_a_script_is_one_line_naming_its_place() -> None:
    script = {
        "rules": [
            {"when": "(", "reply": [None, {"text": 1}], "on": "assistant"},
            {"when": "ok", "reply": [{"text": "a", "signature": "s"}, {"tool_call": {"name": ""}}]},
        ],
        "default": [{"text": None}],
        "context_window": True,
        "colour": "red",
    }
    with pytest.raises(ConfigurationError) as info:
        Script.from_dict(script)
    lines = str(info.value).splitlines()
    assert all(line.startswith("scripted model: invalid script 'inline': ") for line in lines)
    problems = [line.removeprefix("scripted model: invalid script 'inline': ") for line in lines]
    expected = [
        "rules[0].when: bad regular expression '('",
        "rules[0].reply[0]: must be a JSON object, got null",
        "rules[0].reply[1].text: must be a string, got a number",
        "rules[0].on[0]: 'assistant' is not one of",
        "rules[1].reply[0]: keys ['signature'] do not belong in a 'text' event",
        "rules[1].reply[1].tool_call.name: must not be empty",
        "default[0].text: must not be null",
        "context_window: must be a whole number, got True",
        "unknown key 'colour'; allowed: rules, default, context_window, description",
    ]
    assert len(problems) == len(expected)
    assert all(problem.startswith(start) for problem, start in zip(problems, expected, strict=True))


def test_bad_file_script_names_the_path(tmp_path: Path) -> None:
    path = _write(tmp_path, {"rules": [{"when": "[", "reply": []}]})
    with pytest.raises(ConfigurationError) as info:
        load_script(path)
    assert str(path) in str(info.value)
    assert "rules[0].when: bad regular expression" in str(info.value)


def test_description_keys_are_allowed() -> None:
    script = {"description": "top", "rules": [{"when": "x", "description": "rule", "reply": []}]}
    assert len(ScriptedProvider(script).script.rules) == 1


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------------------------------------------------
# The bundled demo script


async def test_demo_script_drives_the_whole_demo() -> None:
    provider = ScriptedProvider(DEMO_SCRIPT)
    root = ["root"]

    # 1. The user says anything → the agent calls get_time.
    history: list[HistoryItem] = [user("hello there")]
    events = await collect(provider, request(*history, stack=root))
    assert "demo" in text_of(events).lower()
    (get_time,) = calls_of(events)
    assert get_time.name == "get_time"

    # 2. The time arrives → answer + spawn a child with the full stack.
    history += [ToolCallItem(get_time), result("2025-01-01T12:34:56+00:00", get_time.id)]
    events = await collect(provider, request(*history, stack=root))
    assert "demo" in text_of(events).lower()
    (spawn,) = calls_of(events)
    assert spawn.name == "spawn_thread"
    assert spawn.arguments["child_of"] == ["root"]
    assert isinstance(spawn.arguments["instructions"], str)

    # 3. The sync spawn result → a short text, no more calls.
    spawned = result(
        "Child thread is successfully spawned and has ID: kid. You will be notified automatically when the "
        "child has anything to report. Make sure that you **do not** do the task assigned to the child thread.",
        spawn.id,
    )
    events = await collect(provider, request(*history, ToolCallItem(spawn), spawned, stack=root))
    assert "demo" in text_of(events).lower()
    assert calls_of(events) == []

    # 4. In the child: the seed → report_to_parent.
    child = ["root", "kid"]
    seed = result(
        "You are now INSIDE the thread that you requested to create. Your thread ID is kid. Your next task is "
        "to exactly follow these instructions: x\n. Start by repeating to yourself the instructions.",
        spawn.id,
    )
    child_history: list[HistoryItem] = [*history, ToolCallItem(spawn), seed]
    events = await collect(provider, request(*child_history, stack=child))
    (report,) = calls_of(events)
    assert report.name == "report_to_parent"
    assert isinstance(report.arguments["report"], str)

    # 5. The report ack → close_thread with the child's own id.
    child_history += [ToolCallItem(report), result("Report sent to parent thread.", report.id)]
    events = await collect(provider, request(*child_history, stack=child))
    (close,) = calls_of(events)
    assert close.name == "close_thread"
    assert close.arguments["thread_id"] == "kid"
    assert isinstance(close.arguments["report_to_parent"], str)

    # 6. The parent gets the report, then the shut-down notice → short texts.
    parent: list[HistoryItem] = [*history, ToolCallItem(spawn), spawned, AssistantText("waiting")]
    report_event = event(f"Report from child thread: {report.arguments['report']}", spawn.id)
    events = await collect(provider, request(*parent, report_event, stack=root))
    assert "demo" in text_of(events).lower() and calls_of(events) == []
    shut = event(
        f"Child thread with ID kid has shut down. Report from child thread: {close.arguments['report_to_parent']}",
        spawn.id,
    )
    events_shut = await collect(
        provider, request(*parent, report_event, AssistantText("ok"), shut, stack=root)
    )
    assert "demo" in text_of(events_shut).lower() and calls_of(events_shut) == []
    assert text_of(events_shut) != text_of(events)


async def test_demo_script_stops_on_tool_errors() -> None:
    # An error result must never trigger another spawn (which could recurse in a child).
    provider = ScriptedProvider(DEMO_SCRIPT)
    history: list[HistoryItem] = [
        user("hi"),
        call("get_time"),
        result("Error: TimeoutError: 12:00 was too late"),
    ]
    events = await collect(provider, request(*history, stack=["root", "kid"]))
    assert calls_of(events) == []
    assert "demo" in text_of(events).lower()


async def test_demo_script_user_text_resembling_tool_output_still_calls_get_time() -> None:
    provider = ScriptedProvider(DEMO_SCRIPT)
    for text in ["Report sent to parent thread.", "meet at 12:30?", "You are now INSIDE the thread"]:
        events = await collect(provider, request(user(text)))
        assert [c.name for c in calls_of(events)] == ["get_time"]
