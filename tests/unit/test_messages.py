"""The wire model: reference JSON examples parse, round trips are exact, bad input is rejected clearly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepagent.errors import InputError, MalformedMessageError
from stepagent.messages import (
    Compaction,
    CompactionComplete,
    ImageBlock,
    ImageContent,
    InputMessage,
    MediaContent,
    OAuthRequired,
    ParentMessage,
    SubscriptionEvent,
    TextBlock,
    TextContent,
    ThreadReport,
    ToolCall,
    ToolResult,
    UserChoiceRequired,
    is_deferrable_synthetic,
    is_inline_synthetic,
    parse_input_message,
)


def result_content(text: str = "out", id: str = "") -> dict[str, Any]:
    return {"type": "toolresult", "id": id, "content": [{"type": "text", "text": text}]}


# ----------------------------------------------------------------------------------------------------------
# Reference examples parse


def test_user_text_reference_example() -> None:
    message = parse_input_message('{"content": {"type": "text", "text": "hi"}, "group_id": "conv-1"}')
    assert message.content == TextContent(text="hi")
    assert message.group_id == "conv-1"
    assert message.metadata is None
    assert message.synthetic is None
    assert message.display_as is None
    assert message.subscription is False
    assert message.id is None
    assert message.is_user_text


def test_tool_result_with_call_id() -> None:
    message = parse_input_message(
        {
            "content": {
                "type": "toolresult",
                "id": "tc-1",
                "call_id": "call-abc",
                "content": [{"type": "text", "text": "tool output"}],
            },
            "group_id": "conv-1",
        }
    )
    assert isinstance(message.content, ToolResult)
    assert message.content.id == "tc-1"
    assert message.content.call_id == "call-abc"
    assert message.content.content == [TextBlock(text="tool output")]
    assert message.content.first_text() == "tool output"
    assert not message.is_user_text


def test_tool_result_without_call_id_defaults_to_none() -> None:
    message = parse_input_message({"content": result_content("x", id="tc-1"), "group_id": "g"})
    assert isinstance(message.content, ToolResult)
    assert message.content.call_id is None


def test_tool_result_image_in_rig_form() -> None:
    message = parse_input_message(
        {
            "content": {
                "type": "toolresult",
                "id": "tc-img",
                "content": [
                    {"type": "text", "text": "a chart"},
                    {
                        "type": "image",
                        "data": {"type": "base64", "value": "iVBORw0KGgo="},
                        "media_type": "png",
                    },
                ],
            },
            "group_id": "g",
        }
    )
    assert isinstance(message.content, ToolResult)
    image = message.content.content[1]
    assert image == ImageBlock(data="iVBORw0KGgo=", media_type="png")
    assert message.content.joined_text() == "a chart"


def test_tool_result_image_in_rap_form() -> None:
    message = parse_input_message(
        {
            "content": {
                "type": "toolresult",
                "id": "tc-img",
                "content": [{"type": "image", "data": "iVBORw0KGgo=", "mediaType": "image/png"}],
            },
            "group_id": "g",
        }
    )
    assert isinstance(message.content, ToolResult)
    assert message.content.content == [ImageBlock(data="iVBORw0KGgo=", media_type="image/png")]
    assert message.content.first_text() is None


def test_oauth_required() -> None:
    message = parse_input_message(
        {
            "content": {
                "type": "oauth_required",
                "id": "o-1",
                "call_id": None,
                "auth_url": "https://example.com/auth",
            },
            "group_id": "g",
        }
    )
    assert message.content == OAuthRequired(id="o-1", auth_url="https://example.com/auth")
    assert not message.is_user_text


def test_user_choice_required() -> None:
    message = parse_input_message(
        {
            "content": {
                "type": "user_choice_required",
                "id": "choice-1",
                "call_id": "tc-1",
                "prompt": "Deploy where?",
                "choices": ["staging", "production"],
                "default": 1,
                "response_url": "https://example.com/respond",
            },
            "group_id": "g",
        }
    )
    assert message.content == UserChoiceRequired(
        id="choice-1",
        call_id="tc-1",
        prompt="Deploy where?",
        choices=["staging", "production"],
        default=1,
        response_url="https://example.com/respond",
    )


def test_user_choice_default_defaults_to_first() -> None:
    message = parse_input_message(
        {
            "content": {
                "type": "user_choice_required",
                "id": "c",
                "prompt": "p",
                "choices": ["a"],
                "response_url": "u",
            },
            "group_id": "g",
        }
    )
    assert isinstance(message.content, UserChoiceRequired)
    assert message.content.default == 0


def test_user_image_and_media_content() -> None:
    image = parse_input_message(
        {
            "content": {"type": "image", "data": {"type": "base64", "value": "AAA"}, "media_type": "jpeg"},
            "group_id": "g",
        }
    )
    assert image.content == ImageContent(data="AAA", media_type="jpeg")
    assert not image.is_user_text

    document = parse_input_message(
        {"content": {"type": "document", "data": "SGVsbG8=", "media_type": "pdf"}, "group_id": "g"}
    )
    assert isinstance(document.content, MediaContent)
    assert document.content.type == "document"
    assert document.content.model_dump()["data"] == "SGVsbG8="


@pytest.mark.parametrize(
    ("synthetic", "expected"),
    [
        (
            {"type": "subscription_event", "tool_call_id": "tc-sub"},
            SubscriptionEvent(tool_call_id="tc-sub", associative=False, final=False),
        ),
        (
            {"type": "subscription_event", "tool_call_id": "tc-sub", "associative": True, "final": True},
            SubscriptionEvent(tool_call_id="tc-sub", associative=True, final=True),
        ),
        (
            {"type": "thread_report", "tool_call_id": "tc-spawn", "child_thread_id": "child-1"},
            ThreadReport(tool_call_id="tc-spawn", child_thread_id="child-1"),
        ),
        ({"type": "parent_message", "tool_call_id": "tc-spawn"}, ParentMessage(tool_call_id="tc-spawn")),
        ({"type": "compaction_complete"}, CompactionComplete()),
        # The legacy bare string: a non-associative, non-final subscription event.
        ("tc-legacy", SubscriptionEvent(tool_call_id="tc-legacy", associative=False, final=False)),
    ],
)
def test_synthetic_kinds_on_tool_results(synthetic: Any, expected: Any) -> None:
    message = parse_input_message(
        {"content": result_content("Report from child thread: done"), "group_id": "g", "synthetic": synthetic}
    )
    assert message.synthetic == expected
    assert not message.is_user_text


def test_compaction_trigger_is_empty_user_text() -> None:
    message = parse_input_message(
        {"content": {"type": "text", "text": ""}, "group_id": "g", "synthetic": {"type": "compaction"}}
    )
    assert message.synthetic == Compaction()
    assert message.content == TextContent(text="")
    # Synthetic messages are never "user text", even when the content is text.
    assert not message.is_user_text


def test_synthetic_predicates() -> None:
    assert is_inline_synthetic(ThreadReport(tool_call_id="t", child_thread_id="c"))
    assert is_inline_synthetic(ParentMessage(tool_call_id="t"))
    assert is_inline_synthetic(SubscriptionEvent(tool_call_id="t", associative=True))
    assert not is_inline_synthetic(SubscriptionEvent(tool_call_id="t"))
    assert not is_inline_synthetic(Compaction())
    assert not is_inline_synthetic(CompactionComplete())
    assert not is_inline_synthetic(None)

    # A non-associative event runs in its own child thread, so it never waits for a pending call.
    assert not is_deferrable_synthetic(SubscriptionEvent(tool_call_id="t"))
    assert is_deferrable_synthetic(SubscriptionEvent(tool_call_id="t", associative=True))
    assert is_deferrable_synthetic(ThreadReport(tool_call_id="t", child_thread_id="c"))
    assert is_deferrable_synthetic(ParentMessage(tool_call_id="t"))
    assert not is_deferrable_synthetic(Compaction())
    assert not is_deferrable_synthetic(CompactionComplete())
    assert not is_deferrable_synthetic(None)


def test_metadata_display_as_subscription_and_id() -> None:
    message = parse_input_message(
        {
            "content": result_content("started", id="tc-sub"),
            "group_id": "g",
            "metadata": {"user_id": "u-123", "nested": {"a": [1, 2]}},
            "display_as": [{"type": "text", "text": "Subscribed"}, {"type": "link", "url": "https://x"}],
            "subscription": True,
            "id": "msg-42",
        }
    )
    assert message.metadata == {"user_id": "u-123", "nested": {"a": [1, 2]}}
    assert message.display_as == [
        {"type": "text", "text": "Subscribed"},
        {"type": "link", "url": "https://x"},
    ]
    assert message.subscription is True
    assert message.id == "msg-42"


def test_explicit_nulls_are_accepted() -> None:
    message = parse_input_message(
        {
            "content": {"type": "text", "text": "hi"},
            "group_id": "g",
            "metadata": None,
            "synthetic": None,
            "display_as": None,
            "subscription": False,
        }
    )
    assert message == InputMessage.user_text("g", "hi")


def test_unknown_fields_are_ignored() -> None:
    message = parse_input_message({"content": {"type": "text", "text": "hi"}, "group_id": "g", "future": 1})
    assert message == InputMessage.user_text("g", "hi")


def test_parse_accepts_str_bytes_and_dict() -> None:
    raw = {"content": {"type": "text", "text": "héllo"}, "group_id": "g"}
    as_str = json.dumps(raw, ensure_ascii=False)
    assert parse_input_message(raw) == parse_input_message(as_str) == parse_input_message(as_str.encode())


# ----------------------------------------------------------------------------------------------------------
# Round trips and serialization

ROUND_TRIP_BODIES: list[dict[str, Any]] = [
    {"content": {"type": "text", "text": "hi"}, "group_id": "conv-1"},
    {"content": {"type": "text", "text": "héllo ✓"}, "group_id": "conv-1", "id": "m-1"},
    {"content": {**result_content("out", id="tc-1"), "call_id": "c-1"}, "group_id": "g"},
    {"content": result_content("out", id="tc-1"), "group_id": "g", "subscription": True},
    {
        "content": {
            "type": "toolresult",
            "id": "tc-1",
            "content": [{"type": "image", "data": {"type": "base64", "value": "AAA"}, "media_type": "png"}],
        },
        "group_id": "g",
    },
    {
        "content": {
            "type": "toolresult",
            "id": "tc-1",
            "content": [{"type": "image", "data": "AAA", "mediaType": "x"}],
        },
        "group_id": "g",
    },
    {"content": {"type": "image", "data": "AAA"}, "group_id": "g"},
    {"content": {"type": "audio", "data": "AAA", "media_type": "wav"}, "group_id": "g"},
    {
        "content": {"type": "oauth_required", "id": "o", "call_id": "c", "auth_url": "https://a"},
        "group_id": "g",
    },
    {
        "content": {
            "type": "user_choice_required",
            "id": "c",
            "prompt": "p",
            "choices": ["a", "b", "c"],
            "default": 2,
            "response_url": "https://r",
        },
        "group_id": "g",
    },
    {"content": result_content(), "group_id": "g", "synthetic": "tc-legacy"},
    {
        "content": result_content(),
        "group_id": "g",
        "synthetic": {"type": "subscription_event", "tool_call_id": "t", "associative": True, "final": True},
    },
    {
        "content": result_content(),
        "group_id": "g",
        "synthetic": {"type": "thread_report", "tool_call_id": "t", "child_thread_id": "c"},
    },
    {
        "content": result_content(),
        "group_id": "g",
        "synthetic": {"type": "parent_message", "tool_call_id": "t"},
    },
    {"content": {"type": "text", "text": ""}, "group_id": "g", "synthetic": {"type": "compaction"}},
    {
        "content": result_content("Compaction complete"),
        "group_id": "g",
        "synthetic": {"type": "compaction_complete"},
    },
    {
        "content": {"type": "text", "text": "hi"},
        "group_id": "g",
        "metadata": {"k": [1, {"x": None}]},
        "display_as": [{"type": "text", "text": "shown"}],
    },
    {"content": {"type": "text", "text": "hi"}, "group_id": "g", "metadata": "a plain string"},
]


@pytest.mark.parametrize("body", ROUND_TRIP_BODIES, ids=range(len(ROUND_TRIP_BODIES)))
def test_round_trip_is_identity(body: dict[str, Any]) -> None:
    first = parse_input_message(body)
    encoded = first.to_json()
    second = parse_input_message(encoded)
    assert second == first
    # ...and serialization is a fixed point from then on.
    assert second.to_json() == encoded


def test_serialization_includes_top_level_nulls_and_false() -> None:
    encoded = InputMessage.user_text("conv-1", "hi").to_json()
    assert json.loads(encoded) == {
        "content": {"type": "text", "text": "hi"},
        "group_id": "conv-1",
        "metadata": None,
        "synthetic": None,
        "display_as": None,
        "subscription": False,
    }
    # Compact and in a stable field order.
    assert encoded == (
        '{"content":{"type":"text","text":"hi"},"group_id":"conv-1","metadata":null,'
        '"synthetic":null,"display_as":null,"subscription":false}'
    )


def test_serialization_includes_id_only_when_set() -> None:
    assert "id" not in json.loads(InputMessage.user_text("g", "hi").to_json())
    assert json.loads(InputMessage.user_text("g", "hi", id="m-1").to_json())["id"] == "m-1"


def test_tool_result_omits_call_id_when_null() -> None:
    without = InputMessage.tool_result("g", ToolResult.text("tc-1", "out"))
    assert json.loads(without.to_json())["content"] == {
        "type": "toolresult",
        "id": "tc-1",
        "content": [{"type": "text", "text": "out"}],
    }
    with_call_id = InputMessage.tool_result("g", ToolResult.text("tc-1", "out", call_id="c-9"))
    assert json.loads(with_call_id.to_json())["content"] == {
        "type": "toolresult",
        "id": "tc-1",
        "call_id": "c-9",
        "content": [{"type": "text", "text": "out"}],
    }


def test_image_serialization_normalises_media_type_key() -> None:
    block = ImageBlock.model_validate({"type": "image", "data": "AAA", "mediaType": "image/png"})
    assert block.model_dump() == {"type": "image", "data": "AAA", "media_type": "image/png"}
    assert ImageBlock(data="AAA").model_dump() == {"type": "image", "data": "AAA"}


def test_legacy_synthetic_serializes_in_tagged_form() -> None:
    message = parse_input_message({"content": result_content(), "group_id": "g", "synthetic": "tc-legacy"})
    assert json.loads(message.to_json())["synthetic"] == {
        "type": "subscription_event",
        "tool_call_id": "tc-legacy",
        "associative": False,
        "final": False,
    }


def test_constructors() -> None:
    message = InputMessage.user_text("g", "hi", id="m", metadata={"a": 1})
    assert (message.group_id, message.id, message.metadata) == ("g", "m", {"a": 1})
    report = InputMessage.tool_result(
        "parent",
        ToolResult.text("", "Report from child thread: done"),
        synthetic=ThreadReport(tool_call_id="tc-spawn", child_thread_id="child"),
    )
    assert parse_input_message(report.to_json()) == report
    subscribed = InputMessage.tool_result("g", ToolResult.text("tc-sub", "ok"), subscription=True)
    assert subscribed.subscription is True


def test_tool_result_helpers() -> None:
    result = ToolResult(
        id="tc-1",
        content=[TextBlock(text="a"), ImageBlock(data="AAA", media_type="png"), TextBlock(text="b")],
    )
    assert result.first_text() == "a"
    assert result.joined_text() == "a\nb"
    renamed = result.with_id("inv-1", call_id="c")
    assert (renamed.id, renamed.call_id, renamed.content) == ("inv-1", "c", result.content)


def test_tool_call_rig_shape() -> None:
    rig = {
        "id": "tc-1",
        "call_id": None,
        "function": {"name": "some_tool", "arguments": {"x": 1}},
        "signature": None,
        "additional_params": None,
    }
    call = ToolCall.model_validate(rig)
    assert (call.id, call.name, call.arguments) == ("tc-1", "some_tool", {"x": 1})
    assert call.model_dump() == rig
    assert ToolCall(id="tc-1", name="some_tool", arguments={"x": 1}) == call


def test_messages_are_immutable() -> None:
    message = InputMessage.user_text("g", "hi")
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error type is internal
        message.group_id = "other"  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------------------
# Malformed input


def assert_malformed(body: Any, field: str | None, *reason_parts: str) -> MalformedMessageError:
    with pytest.raises(MalformedMessageError) as caught:
        parse_input_message(body)
    error = caught.value
    assert isinstance(error, InputError)
    assert error.disposition == "reject"
    assert not error.retryable
    message = str(error)
    assert error.field == field
    if field is not None:
        assert field in message
    for part in reason_parts:
        assert part.lower() in message.lower(), message
    return error


def test_missing_group_id() -> None:
    assert_malformed({"content": {"type": "text", "text": "hi"}}, "group_id", "required")


def test_empty_group_id() -> None:
    assert_malformed({"content": {"type": "text", "text": "hi"}, "group_id": ""}, "group_id", "at least 1")


def test_non_string_group_id() -> None:
    assert_malformed({"content": {"type": "text", "text": "hi"}, "group_id": 7}, "group_id", "string")


def test_missing_content() -> None:
    assert_malformed({"group_id": "g"}, "content", "required")


def test_content_not_an_object() -> None:
    assert_malformed({"content": "hi", "group_id": "g"}, "content")


def test_wrong_content_type_tag() -> None:
    assert_malformed(
        {"content": {"type": "txt", "text": "hi"}, "group_id": "g"}, "content", "'txt'", "toolresult"
    )


def test_text_content_without_text() -> None:
    assert_malformed({"content": {"type": "text"}, "group_id": "g"}, "content.text", "required")


def test_tool_result_without_id() -> None:
    body = {"content": {"type": "toolresult", "content": [{"type": "text", "text": "x"}]}, "group_id": "g"}
    assert_malformed(body, "content.id", "required")


def test_tool_result_with_empty_content_list() -> None:
    body = {"content": {"type": "toolresult", "id": "tc-1", "content": []}, "group_id": "g"}
    assert_malformed(body, "content.content", "at least 1")


def test_tool_result_with_bad_block() -> None:
    body = {"content": {"type": "toolresult", "id": "tc-1", "content": [{"type": "text"}]}, "group_id": "g"}
    assert_malformed(body, "content.content.0.text", "required")
    body = {"content": {"type": "toolresult", "id": "tc-1", "content": [{"type": "video"}]}, "group_id": "g"}
    assert_malformed(body, "content.content.0", "'video'")


@pytest.mark.parametrize("default", [2, -1])
def test_user_choice_default_out_of_range(default: int) -> None:
    body = {
        "content": {
            "type": "user_choice_required",
            "id": "c",
            "prompt": "p",
            "choices": ["a", "b"],
            "default": default,
            "response_url": "u",
        },
        "group_id": "g",
    }
    assert_malformed(body, "content", f"default {default}", "2 choices")


def test_user_choice_without_choices() -> None:
    body = {
        "content": {
            "type": "user_choice_required",
            "id": "c",
            "prompt": "p",
            "choices": [],
            "response_url": "u",
        },
        "group_id": "g",
    }
    assert_malformed(body, "content.choices", "at least 1")


@pytest.mark.parametrize(
    "synthetic",
    [
        {"type": "thread_report", "tool_call_id": "t", "child_thread_id": "c"},
        {"type": "parent_message", "tool_call_id": "t"},
        {"type": "subscription_event", "tool_call_id": "t", "associative": True},
        "tc-legacy",
    ],
)
def test_synthetic_event_with_text_content(synthetic: Any) -> None:
    body = {"content": {"type": "text", "text": "hi"}, "group_id": "g", "synthetic": synthetic}
    assert_malformed(body, "synthetic", "toolresult")


def test_thread_report_without_child_thread_id() -> None:
    body = {
        "content": result_content(),
        "group_id": "g",
        "synthetic": {"type": "thread_report", "tool_call_id": "t"},
    }
    assert_malformed(body, "synthetic.child_thread_id", "required")


def test_unknown_synthetic_type() -> None:
    body = {"content": result_content(), "group_id": "g", "synthetic": {"type": "nope"}}
    assert_malformed(body, "synthetic", "'nope'")


def test_empty_id() -> None:
    assert_malformed(
        {"content": {"type": "text", "text": "hi"}, "group_id": "g", "id": ""}, "id", "at least 1"
    )


def test_display_segment_without_type() -> None:
    body = {"content": {"type": "text", "text": "hi"}, "group_id": "g", "display_as": [{"text": "x"}]}
    assert_malformed(body, "display_as", "segment 0", "type")


def test_subscription_not_a_bool() -> None:
    body = {"content": {"type": "text", "text": "hi"}, "group_id": "g", "subscription": "maybe"}
    assert_malformed(body, "subscription", "bool")


@pytest.mark.parametrize("body", ["not json", '{"content": ', b"\xff\xfe", ""])
def test_non_json_body(body: str | bytes) -> None:
    assert_malformed(body, None, "not valid JSON")


@pytest.mark.parametrize(
    ("body", "kind"), [("[1, 2]", "list"), ('"hi"', "str"), ("null", "NoneType"), ("3", "int")]
)
def test_non_object_body(body: str, kind: str) -> None:
    assert_malformed(body, None, "must be a JSON object", kind)


def test_non_object_dict_argument_is_checked_too() -> None:
    assert_malformed([{"content": {}}], None, "must be a JSON object")  # type: ignore[arg-type]
