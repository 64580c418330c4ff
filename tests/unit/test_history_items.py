"""History items and their codec: exact round trips, deterministic bytes, reference rows, loud corruption."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepagent.errors import CorruptRowError, InvariantViolation
from stepagent.history_items import (
    CODEC_VERSION,
    INJECTED_TOOL_NAME,
    SUMMARY_PREFIX,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    answered_call_id,
    decode_item,
    encode_item,
    item_from_dict,
    item_to_dict,
)
from stepagent.messages import (
    ImageBlock,
    ImageContent,
    MediaContent,
    TextBlock,
    TextContent,
    ToolCall,
    ToolResult,
)

INVOCATION = ToolCall(
    id="inv-1",
    name=INJECTED_TOOL_NAME,
    arguments={
        "original_args": {"topic": "events"},
        "original_tool_call_id": "tc-sub",
        "original_tool_name": "subscribe_tool",
    },
)

ITEMS: dict[str, HistoryItem] = {
    "user text": UserItem(TextContent(text="hello")),
    "user text unicode": UserItem(TextContent(text='héllo ✓ \n\t"quoted"')),
    "user image": UserItem(ImageContent(data="iVBORw0KGgo=", media_type="png")),
    "user image no media type": UserItem(ImageContent(data="AAA")),
    "user document": UserItem(
        MediaContent.model_validate({"type": "document", "data": "x", "media_type": "pdf"})
    ),
    "assistant text": AssistantText("Hello, world"),
    "assistant empty text": AssistantText(""),
    "reasoning signed": Reasoning("let me think", signature="sig-abc"),
    "reasoning unsigned": Reasoning("musing"),
    "reasoning redacted": Reasoning("", redacted="opaque-bytes"),
    "reasoning redacted with signature": Reasoning("", signature="sig", redacted="opaque"),
    "tool call": ToolCallItem(
        ToolCall(id="tc-1", name="some_tool", arguments={"x": 1, "nested": {"y": [1, 2]}})
    ),
    "tool call full": ToolCallItem(
        ToolCall(id="tc-2", name="t", arguments={}, call_id="call-2", signature="s"), display_as="t(…)"
    ),
    "tool result": ToolResultItem(ToolResult.text("tc-1", "tool output")),
    "tool result call_id + segments": ToolResultItem(
        ToolResult.text("tc-1", "out", call_id="call-1"), display_segments=[{"type": "text", "text": "shown"}]
    ),
    "tool result image": ToolResultItem(
        ToolResult(
            id="tc-3", content=[TextBlock(text="chart"), ImageBlock(data="AAA", media_type="image/png")]
        )
    ),
    "event with invocation and child": EventItem(
        result=ToolResult.text("inv-1", "Report from child thread: done"),
        tool_call_id="tc-sub",
        child_thread_id="child-1",
        invocation=INVOCATION,
    ),
    "event with invocation, no child": EventItem(
        result=ToolResult.text("inv-1", "build output chunk\n[exit code: 0]"),
        tool_call_id="tc-cmd",
        invocation=INVOCATION,
    ),
    "legacy event without invocation": EventItem(
        result=ToolResult.text("tc-sub", "event"), tool_call_id="tc-sub"
    ),
}


@pytest.mark.parametrize("item", ITEMS.values(), ids=ITEMS.keys())
def test_round_trip(item: HistoryItem) -> None:
    encoded = encode_item(item)
    decoded = decode_item(encoded)
    assert decoded == item
    assert type(decoded) is type(item)
    assert decode_item(encoded.encode()) == item
    assert item_from_dict(item_to_dict(item)) == item


@pytest.mark.parametrize("item", ITEMS.values(), ids=ITEMS.keys())
def test_encoding_is_deterministic(item: HistoryItem) -> None:
    encoded = encode_item(item)
    assert encode_item(item) == encoded
    # Re-encoding what was read back gives the same bytes (a re-run writes byte-identical rows).
    assert encode_item(decode_item(encoded)) == encoded
    # Compact, versioned, valid JSON.
    assert encoded == json.dumps(json.loads(encoded), ensure_ascii=False, separators=(",", ":"))
    assert json.loads(encoded)["v"] == CODEC_VERSION


def test_encoding_is_compact_and_versioned() -> None:
    assert encode_item(UserItem(TextContent(text="hello"))) == (
        '{"v":1,"kind":"user","content":{"type":"text","text":"hello"}}'
    )
    assert (
        encode_item(AssistantText("Hello, world"))
        == '{"v":1,"kind":"assistant","content":{"text":"Hello, world"}}'
    )
    assert encode_item(ToolResultItem(ToolResult.text("tc-1", "tool output"))) == (
        '{"v":1,"kind":"tool_result","result":{"type":"toolresult","id":"tc-1",'
        '"content":[{"type":"text","text":"tool output"}]}}'
    )


def test_non_ascii_is_kept_verbatim() -> None:
    encoded = encode_item(UserItem(TextContent(text="héllo ✓")))
    assert "héllo ✓" in encoded


def test_reference_field_shapes() -> None:
    call = item_to_dict(ToolCallItem(ToolCall(id="tc-1", name="some_tool", arguments={"x": 1})))
    assert call == {
        "v": 1,
        "kind": "tool_call",
        "call": {
            "id": "tc-1",
            "call_id": None,
            "function": {"name": "some_tool", "arguments": {"x": 1}},
            "signature": None,
            "additional_params": None,
        },
    }
    # Optional fields are omitted when null.
    assert "display_as" not in call
    result = item_to_dict(ToolResultItem(ToolResult.text("tc-1", "x")))
    assert "display_segments" not in result
    assert "call_id" not in result["result"]
    event = item_to_dict(EventItem(result=ToolResult.text("i", "x"), tool_call_id="tc"))
    assert "child_thread_id" not in event
    assert "invocation" not in event


def test_summary_cannot_be_encoded() -> None:
    with pytest.raises(InvariantViolation):
        encode_item(Summary(text="the story so far", up_to_order=3))
    with pytest.raises(InvariantViolation):
        item_to_dict(Summary(text="x", up_to_order=1))


def test_summary_rendering() -> None:
    summary = Summary(text="the story so far", up_to_order=3)
    assert summary.rendered == "[Compacted conversation summary]\nthe story so far"
    assert summary.rendered == SUMMARY_PREFIX + summary.text


def test_answered_call_id() -> None:
    assert answered_call_id(ITEMS["tool result"]) == "tc-1"
    assert answered_call_id(ITEMS["event with invocation and child"]) == "inv-1"
    assert answered_call_id(ITEMS["legacy event without invocation"]) == "tc-sub"
    for name in ("user text", "assistant text", "reasoning signed", "tool call"):
        assert answered_call_id(ITEMS[name]) is None
    assert answered_call_id(Summary("s", 1)) is None


def test_user_item_text() -> None:
    assert UserItem(TextContent(text="hi")).text == "hi"
    assert UserItem(ImageContent(data="AAA")).text is None


# ----------------------------------------------------------------------------------------------------------
# Unversioned rows as the reference runtime stores them (no version field): still read

REFERENCE_ROWS: list[tuple[str, HistoryItem]] = [
    ('{"kind":"user","content":{"type":"text","text":"hello"}}', UserItem(TextContent(text="hello"))),
    ('{"kind":"assistant","content":{"text":"Hello, world"}}', AssistantText("Hello, world")),
    (
        '{"kind":"tool_call","call":{"id":"tc-1","call_id":null,"function":{"name":"some_tool",'
        '"arguments":{"x":1}},"signature":null,"additional_params":null}}',
        ToolCallItem(ToolCall(id="tc-1", name="some_tool", arguments={"x": 1})),
    ),
    (
        '{"kind":"tool_call","call":{"id":"tc-1","call_id":"c-1","function":{"name":"t","arguments":{}},'
        '"signature":null,"additional_params":null},"display_as":"pretty"}',
        ToolCallItem(ToolCall(id="tc-1", name="t", call_id="c-1"), display_as="pretty"),
    ),
    (
        '{"kind":"tool_result","result":{"id":"tc-1","content":[{"type":"text","text":"tool output"}]}}',
        ToolResultItem(ToolResult.text("tc-1", "tool output")),
    ),
    (
        '{"kind":"tool_result","result":{"id":"tc-1","call_id":"c-1","content":[{"type":"text","text":"x"}]},'
        '"display_segments":[{"type":"text","text":"shown"}]}',
        ToolResultItem(
            ToolResult.text("tc-1", "x", call_id="c-1"), display_segments=[{"type": "text", "text": "shown"}]
        ),
    ),
    (
        '{"kind":"tool_result","result":{"id":"tc-1","content":[{"type":"image",'
        '"data":{"type":"base64","value":"AAA"},"media_type":"png"}]}}',
        ToolResultItem(ToolResult(id="tc-1", content=[ImageBlock(data="AAA", media_type="png")])),
    ),
    (
        '{"kind":"subscription_event","result":{"id":"inv-1","content":[{"type":"text","text":"Report"}]},'
        '"tool_call_id":"tc-sub","child_thread_id":"child-1","invocation":{"id":"inv-1","call_id":null,'
        '"function":{"name":"receive_event__injected","arguments":{"original_args":{"topic":"events"},'
        '"original_tool_call_id":"tc-sub","original_tool_name":"subscribe_tool"}},"signature":null,'
        '"additional_params":null}}',
        EventItem(
            result=ToolResult.text("inv-1", "Report"),
            tool_call_id="tc-sub",
            child_thread_id="child-1",
            invocation=INVOCATION,
        ),
    ),
    (
        '{"kind":"subscription_event","result":{"id":"tc-sub","content":[{"type":"text","text":"e"}]},'
        '"tool_call_id":"tc-sub"}',
        EventItem(result=ToolResult.text("tc-sub", "e"), tool_call_id="tc-sub"),
    ),
    (
        '{"kind":"assistant","content":{"reasoning":["step one, ","step two"],"id":null,"signature":"sig"}}',
        Reasoning("step one, step two", signature="sig"),
    ),
]


@pytest.mark.parametrize(("row", "expected"), REFERENCE_ROWS, ids=range(len(REFERENCE_ROWS)))
def test_unversioned_reference_rows_decode(row: str, expected: HistoryItem) -> None:
    assert decode_item(row) == expected
    # Re-encoding writes our versioned shape, which reads back to the same item.
    assert decode_item(encode_item(expected)) == expected


def test_explicit_version_zero_is_the_unversioned_form() -> None:
    assert decode_item('{"v":0,"kind":"assistant","content":{"text":"x"}}') == AssistantText("x")


# ----------------------------------------------------------------------------------------------------------
# Corrupt rows fail loudly


@pytest.mark.parametrize("version", [2, 99, -1, "1", None])
def test_unknown_version(version: Any) -> None:
    row = json.dumps({"v": version, "kind": "assistant", "content": {"text": "x"}})
    with pytest.raises(CorruptRowError, match="version"):
        decode_item(row)


@pytest.mark.parametrize("kind", ["summary", "system", "", None, 3])
def test_unknown_kind(kind: Any) -> None:
    with pytest.raises(CorruptRowError, match="unknown kind"):
        decode_item(json.dumps({"v": 1, "kind": kind, "content": {"text": "x"}}))


def test_missing_kind() -> None:
    with pytest.raises(CorruptRowError, match="unknown kind"):
        decode_item('{"v":1,"content":{"text":"x"}}')


@pytest.mark.parametrize(
    "row",
    [
        "",
        "not json",
        '{"kind":"user"',
        b"\xff\xfe",
        "[]",
        '"a string"',
        "null",
        "42",
    ],
)
def test_garbage(row: str | bytes) -> None:
    with pytest.raises(CorruptRowError):
        decode_item(row)


@pytest.mark.parametrize(
    "raw",
    [
        {"v": 1, "kind": "user"},
        {
            "v": 1,
            "kind": "user",
            "content": {"type": "toolresult", "id": "x", "content": [{"type": "text", "text": "y"}]},
        },
        {"v": 1, "kind": "user", "content": {"type": "text"}},
        {"v": 1, "kind": "user", "content": "hello"},
        {"v": 1, "kind": "assistant"},
        {"v": 1, "kind": "assistant", "content": {"unknown": 1}},
        {"v": 1, "kind": "assistant", "content": None},
        {"v": 1, "kind": "assistant", "content": "text"},
        {"v": 1, "kind": "tool_call"},
        {"v": 1, "kind": "tool_call", "call": {"id": "x"}},
        {"v": 1, "kind": "tool_call", "call": None},
        {"v": 1, "kind": "tool_result", "result": {"id": "x", "content": []}},
        {"v": 1, "kind": "tool_result", "result": {"content": [{"type": "text", "text": "y"}]}},
        {
            "v": 1,
            "kind": "subscription_event",
            "result": {"id": "x", "content": [{"type": "text", "text": "y"}]},
        },
        {
            "v": 1,
            "kind": "subscription_event",
            "result": {"id": "x", "content": [{"type": "text", "text": "y"}]},
            "tool_call_id": "t",
            "invocation": {"id": "i"},
        },
    ],
)
def test_malformed_rows_of_known_kinds(raw: dict[str, Any]) -> None:
    with pytest.raises(CorruptRowError):
        decode_item(json.dumps(raw))


def test_corrupt_row_error_is_an_invariant_violation() -> None:
    with pytest.raises(InvariantViolation):
        decode_item("garbage")
    assert CorruptRowError("x").retryable
