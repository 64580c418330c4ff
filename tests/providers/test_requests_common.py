"""The provider-neutral conversation rules, each on a small hand-made history."""

from __future__ import annotations

import json

from stepagent.core.completion import model_view
from stepagent.history_items import (
    INJECTED_TOOL_NAME,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
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
from stepagent.providers.base import ModelInfo, ModelRequest, ToolSpec
from stepagent.providers.json_body import dump_json
from stepagent.providers.openai_compat import openai_body
from stepagent.providers.requests_common import (
    CONVERSATION_START,
    EMPTY_OUTPUT,
    EMPTY_USER_TEXT,
    ORPHAN_RESULT_PREFIX,
    PENDING_RESULT,
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    Turn,
    conversation,
    image_bytes,
    image_media_type,
    wire_tool_id,
)
from stepagent.texts import IMAGE_OMITTED

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def call(call_id: str, name: str = "t") -> ToolCallItem:
    return ToolCallItem(ToolCall(id=call_id, name=name, arguments={"x": 1}))


def result(call_id: str, *blocks: TextBlock | ImageBlock) -> ToolResultItem:
    return ToolResultItem(ToolResult(id=call_id, content=list(blocks) or [TextBlock(text="ok")]))


def roles(turns: list[Turn]) -> list[str]:
    return [t.role for t in turns]


def test_roles_alternate_and_merge() -> None:
    turns = conversation(
        [user("a"), user("b"), AssistantText("c"), call("1"), result("1"), user("d")], images=True
    )
    assert roles(turns) == ["user", "assistant", "user"]
    assert turns[0].parts == [TextPart("a"), TextPart("b")]
    assert turns[1].parts == [TextPart("c"), ToolUsePart("1", "t", {"x": 1})]
    assert turns[2].parts == [ToolResultPart("1", (TextPart("ok"),)), TextPart("d")]


def test_trailing_unanswered_call_gets_pending_result() -> None:
    turns = conversation([user("a"), call("1")], images=True)
    assert turns[-1] == Turn("user", [ToolResultPart("1", (TextPart(PENDING_RESULT),))])


def test_unanswered_call_before_other_input_is_closed_first() -> None:
    turns = conversation([user("a"), call("1"), user("interrupting")], images=True)
    assert turns[-1].parts == [ToolResultPart("1", (TextPart(PENDING_RESULT),)), TextPart("interrupting")]


def test_orphan_result_becomes_user_text() -> None:
    turns = conversation([user("a"), AssistantText("b"), result("gone", TextBlock(text="late"))], images=True)
    assert turns[-1].parts == [TextPart(ORPHAN_RESULT_PREFIX.format(id="gone")), TextPart("late")]


def test_event_item_expands_to_call_and_result() -> None:
    invocation = ToolCall(id="ev1", name=INJECTED_TOOL_NAME, arguments={"original_tool_call_id": "orig"})
    event = EventItem(result=ToolResult.text("ev1", "report"), tool_call_id="orig", invocation=invocation)
    turns = conversation([user("a"), AssistantText("waiting"), event], images=True)
    assert turns[1].parts == [
        TextPart("waiting"),
        ToolUsePart("ev1", INJECTED_TOOL_NAME, invocation.arguments),
    ]
    assert turns[2].parts == [ToolResultPart("ev1", (TextPart("report"),))]


def test_legacy_event_without_invocation() -> None:
    event = EventItem(result=ToolResult.text("ev1", "report"), tool_call_id="orig")
    turns = conversation([user("a"), event], images=True)
    assert turns[1].parts == [ToolUsePart("ev1", INJECTED_TOOL_NAME, {"original_tool_call_id": "orig"})]


def test_empty_contents_get_placeholders() -> None:
    turns = conversation(
        [user("  "), AssistantText(""), call("1"), result("1", TextBlock(text="")),
         call("2"), result("2", TextBlock(text=" "), TextBlock(text="kept"))],
        images=True,
    )  # fmt: skip
    assert turns[0].parts == [TextPart(EMPTY_USER_TEXT)]
    assert turns[2].parts[0] == ToolResultPart("1", (TextPart(EMPTY_OUTPUT),))
    assert turns[4].parts[0] == ToolResultPart("2", (TextPart("kept"),))


def test_conversation_starting_with_assistant_gets_a_user_opening() -> None:
    turns = conversation([Summary("so far", 3), AssistantText("go on")], images=True)
    assert turns[0] == Turn("user", [TextPart(CONVERSATION_START)])
    assert turns[1].parts == [TextPart(Summary("so far", 3).rendered), TextPart("go on")]
    assert conversation([], images=True) == [Turn("user", [TextPart(CONVERSATION_START)])]


def test_reasoning_first_signed_only() -> None:
    history: list[HistoryItem] = [
        user("a"),
        AssistantText("text first"),
        Reasoning("unsigned"),
        Reasoning("signed", signature="s"),
        Reasoning("", redacted="opaque"),
        call("1"),
    ]
    turns = conversation(history, images=True)
    assert turns[1].parts == [
        ThinkingPart("signed", "s"),
        ThinkingPart("", None, "opaque"),
        TextPart("text first"),
        ToolUsePart("1", "t", {"x": 1}),
    ]
    assert all(
        not isinstance(p, ThinkingPart) for p in conversation(history, images=True, reasoning=False)[1].parts
    )


def test_images_and_placeholders() -> None:
    history: list[HistoryItem] = [
        UserItem(ImageContent(data=PNG)),
        UserItem(ImageContent(data=PNG, media_type="image/bmp")),
        UserItem(MediaContent(type="audio")),
        call("1"),
        result("1", ImageBlock(data=PNG, media_type="image/jpg")),
    ]
    with_images = conversation(history, images=True)
    assert with_images[0].parts[0] == ImagePart("image/png", PNG)
    assert with_images[0].parts[1] == TextPart("[image omitted: unsupported image type image/bmp]")
    assert "audio omitted" in with_images[0].parts[2].text  # type: ignore[union-attr]
    assert with_images[2].parts[0] == ToolResultPart("1", (ImagePart("image/jpeg", PNG),))
    without = conversation(history, images=False)
    assert without[0].parts[0] == TextPart(IMAGE_OMITTED)
    assert without[2].parts[0] == ToolResultPart("1", (TextPart(IMAGE_OMITTED),))


def test_agrees_with_the_engines_model_view() -> None:
    """completion.model_view strips tool-result images first; what it leaves is translated the same way,
    so the two never disagree (and nothing is replaced twice)."""
    history: list[HistoryItem] = [
        user("a"),
        call("1"),
        result("1", TextBlock(text="t"), ImageBlock(data=PNG)),
    ]
    viewed = model_view(history, supports_image_input=False)
    assert conversation(viewed, images=False) == conversation(history, images=False)


def test_wire_ids() -> None:
    assert wire_tool_id("toolu_01ABC-x") == "toolu_01ABC-x"
    odd = wire_tool_id("call:1/odd id")
    assert odd.startswith("toolu_") and len(odd) <= 64 and odd == wire_tool_id("call:1/odd id")
    assert wire_tool_id("x" * 65) != "x" * 65
    turns = conversation([user("a"), call("call:1/odd id"), result("call:1/odd id")], images=True)
    assert turns[1].parts[0].id == turns[2].parts[0].tool_use_id == odd  # type: ignore[union-attr]


def test_media_type_sniffing_and_decoding() -> None:
    assert image_media_type(ImageBlock(data=PNG)) == "image/png"
    assert image_media_type(ImageBlock(data="/9j/4AAQ")) == "image/jpeg"
    assert image_media_type(ImageBlock(data="R0lGODlh")) == "image/gif"
    assert image_media_type(ImageBlock(data="UklGRiQ")) == "image/webp"
    assert image_bytes("data:image/png;base64,AAEC") == b"\x00\x01\x02"
    assert image_bytes("AAE") == b"\x00\x01"
    assert image_bytes("!!!") == b""


def test_dump_json_like_the_sdks() -> None:
    body = {"t": '😀\u2028 "q" κ', "n": 1}
    assert dump_json(body) == '{"t":"😀\u2028 \\"q\\" κ","n":1}'.encode()
    assert dump_json({"t": "bad \ud800 surrogate"}) == b'{"t":"bad ? surrogate"}'


def test_openai_tool_images_move_to_a_user_message() -> None:
    info = ModelInfo("gpt-4o", supports_image_input=True)
    history: list[HistoryItem] = [
        user("look"),
        call("1"),
        result("1", TextBlock(text="here"), ImageBlock(data=PNG)),
    ]
    request = ModelRequest(system="", history=history, tools=[ToolSpec("t", "d", {})], model=info)
    messages = list(openai_body(request, "gpt-4o")["messages"])
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": "1",
        "content": "here\n[1 image(s) from this tool result follow in the next message]",
    }
    assert messages[3]["role"] == "user"
    assert messages[3]["content"][0] == {"type": "text", "text": "[image(s) from the result of tool call 1]"}
    assert messages[3]["content"][1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    assert json.loads(json.dumps(messages[1]["tool_calls"][0]["function"]["arguments"])) == '{"x":1}'
