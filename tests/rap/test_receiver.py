"""The pure RAP receiver: conversion (the cases the reference runtime's bridge and callback tests cover), authentication,
validation and the Lambda Function URL event shape."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from stepagent.messages import (
    ImageBlock,
    OAuthRequired,
    SubscriptionEvent,
    TextBlock,
    ToolResult,
    UserChoiceRequired,
    parse_input_message,
)
from stepagent.rap.receiver import (
    OutgoingInput,
    ReceiverResult,
    ViewUpdate,
    function_url_response,
    receive_callback,
    receive_function_url_event,
)
from stepagent.rap.tokens import callback_token

SECRET = "receiver-secret"
PNG = base64.b64encode(b"\x89PNG fake").decode()


def token(thread: str = "thread-1", call: str = "call") -> str:
    return callback_token(SECRET, thread, call)


def post(body: dict[str, Any], *, call: str = "call", thread: str = "thread-1") -> ReceiverResult:
    return receive_callback(json.dumps(body), token(thread, call), SECRET)


def only_message(result: ReceiverResult) -> OutgoingInput:
    assert result.status == 200, result.body
    assert result.body == {"ok": True}
    assert len(result.messages) == 1 and not result.views
    return result.messages[0]


def tool_result(**fields: Any) -> dict[str, Any]:
    return {"type": "tool_result", "group_id": "thread-1", "id": "call", **fields}


# ---- conversion -----------------------------------------------------------------------------------------


def test_text_tool_result_converts() -> None:
    out = only_message(post(tool_result(call_id="c-1", text="42")))
    assert out.dedup_id == "rap-tool-result-call"
    message = out.message
    assert message.group_id == "thread-1"
    assert message.content == ToolResult(id="call", call_id="c-1", content=[TextBlock(text="42")])
    assert message.synthetic is None and message.subscription is False and message.display_as is None
    # What goes on the queue parses back as the same message.
    assert parse_input_message(message.to_json()) == message


def test_display_as_and_subscription_flag_pass_through() -> None:
    segments = [
        {"type": "diff", "content": {"path": "a.py", "patch": "@@"}},
        {"type": "text", "content": "ok"},
    ]
    out = only_message(post(tool_result(text="Subscribed", display_as=segments, subscription=True)))
    assert out.message.display_as == segments
    assert out.message.subscription is True


def test_subscription_event_converts_with_flags() -> None:
    body = {"type": "subscription_event", "group_id": "thread-1", "tool_call_id": "call", "text": '{"n":1}'}
    out = only_message(post({**body, "associative": True, "final": True}))
    assert out.message.content == ToolResult.text("call", '{"n":1}')
    assert out.message.synthetic == SubscriptionEvent(tool_call_id="call", associative=True, final=True)
    plain = only_message(post(body)).message.synthetic
    assert plain == SubscriptionEvent(tool_call_id="call", associative=False, final=False)


def test_oauth_converts() -> None:
    body = {"type": "oauth", "group_id": "thread-1", "id": "call", "auth_url": "https://auth.example/x"}
    out = only_message(post(body))
    assert out.dedup_id == "rap-oauth-call"
    assert out.message.content == OAuthRequired(id="call", auth_url="https://auth.example/x")


def test_user_choice_converts_with_default_zero() -> None:
    body = {
        "type": "user_choice",
        "group_id": "thread-1",
        "id": "call",
        "prompt": "Which?",
        "choices": ["a", "b"],
        "response_url": "https://tool.example/choices/k",
    }
    out = only_message(post(body))
    assert out.dedup_id == "rap-user-choice-call"
    assert out.message.content == UserChoiceRequired(
        id="call",
        prompt="Which?",
        choices=["a", "b"],
        default=0,
        response_url="https://tool.example/choices/k",
    )


def test_view_update_is_not_agent_input() -> None:
    body = {"type": "view_update", "group_id": "thread-1", "view_type": "progress", "content": {"pct": 40}}
    result = post(body, call="any-call-of-this-thread")
    assert result.status == 200 and not result.messages
    assert result.views == (ViewUpdate("thread-1", "progress", {"pct": 40}),)
    event = result.views[0].output_event()
    assert (
        event["type"] == "view_update"
        and event["view_type"] == "progress"
        and event["content"] == {"pct": 40}
    )
    again = post(body, call="any-call-of-this-thread").views[0].output_event()
    changed = ViewUpdate("thread-1", "progress", {"pct": 50}).output_event()
    assert again["event_id"] == event["event_id"] != changed["event_id"]


def test_tool_result_content_wins_over_text() -> None:
    out = only_message(post(tool_result(text="fallback", content=[{"type": "text", "text": "structured"}])))
    assert out.message.content == ToolResult(id="call", content=[TextBlock(text="structured")])


def test_empty_structured_content_falls_back_to_text() -> None:
    out = only_message(post(tool_result(text="fallback", content=[])))
    assert out.message.content == ToolResult.text("call", "fallback")


def test_neither_content_nor_text_is_empty_text() -> None:
    out = only_message(post(tool_result()))
    assert out.message.content == ToolResult.text("call", "")


def test_structured_content_with_image_is_converted() -> None:
    content = [{"type": "text", "text": "see"}, {"type": "image", "data": PNG, "mediaType": "image/png"}]
    out = only_message(post(tool_result(content=content)))
    assert out.message.content == ToolResult(
        id="call", content=[TextBlock(text="see"), ImageBlock(data=PNG, media_type="image/png")]
    )


def test_unknown_image_media_type_maps_to_none() -> None:
    content = [{"type": "image", "data": PNG, "mediaType": "image/x-unknown"}]
    out = only_message(post(tool_result(content=content)))
    assert out.message.content == ToolResult(id="call", content=[ImageBlock(data=PNG, media_type=None)])


def test_stable_dedup_for_single_callbacks() -> None:
    first, second = post(tool_result(text="a")), post(tool_result(text="a"))
    assert first.messages[0].dedup_id == second.messages[0].dedup_id == "rap-tool-result-call"


def test_repeated_subscription_events_are_deduplicated_by_content_or_event_id() -> None:
    """Deliberate difference from the reference (fresh random ids): a retried POST of one event is one
    message; distinct events are distinct."""
    event = {"type": "subscription_event", "group_id": "thread-1", "tool_call_id": "call", "text": "t1"}
    first, retry = post(event).messages[0], post(event).messages[0]
    other = post({**event, "text": "t2"}).messages[0]
    final = post({**event, "final": True}).messages[0]
    assert first.dedup_id == retry.dedup_id
    assert len({first.dedup_id, other.dedup_id, final.dedup_id}) == 3
    named = post({**event, "event_id": "e-7"}).messages[0]
    assert named.dedup_id == "rap-event-call-e-7"
    assert post({**event, "text": "t9", "event_id": "e-7"}).messages[0].dedup_id == named.dedup_id


# ---- authentication ----------------------------------------------------------------------------------------


def test_a_missing_token_is_401() -> None:
    result = receive_callback(json.dumps(tool_result(text="x")), None, SECRET)
    assert result.status == 401 and "token" in result.body["error"] and not result.messages


def test_a_bad_token_is_403() -> None:
    result = receive_callback(json.dumps(tool_result(text="x")), "v1.Y2FsbA.AAAA", SECRET)
    assert result.status == 403 and not result.messages


def test_a_token_of_another_thread_is_403() -> None:
    body = json.dumps(tool_result(text="x", group_id="victim"))
    result = receive_callback(body, token("thread-1", "call"), SECRET)
    assert result.status == 403
    assert "victim" in result.body["error"]


def test_a_token_of_another_call_is_403() -> None:
    result = post(tool_result(text="x"), call="other-call")
    assert result.status == 403 and "call" in result.body["error"]
    event = {"type": "subscription_event", "group_id": "thread-1", "tool_call_id": "call", "text": "x"}
    assert post(event, call="other-call").status == 403


def test_a_token_made_with_another_secret_is_403() -> None:
    forged = callback_token("guessed", "thread-1", "call")
    assert receive_callback(json.dumps(tool_result(text="x")), forged, SECRET).status == 403


# ---- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "no body"),
        (b"\xff\xfe", "UTF-8"),
        (b"{nope", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"type": "teleport", "group_id": "thread-1"}', "unknown callback type"),
        (b'{"type": "tool_result", "group_id": "thread-1"}', "id"),
        (
            b'{"type": "tool_result", "group_id": "thread-1", "id": "call", "subscription": "maybe"}',
            "subscription",
        ),
        (
            b'{"type": "tool_result", "group_id": "thread-1", "id": "call", "content": [{"type": "image"}]}',
            "content",
        ),
        (
            b'{"type": "oauth", "group_id": "thread-1", "id": "call", "auth_url": "javascript:alert(1)"}',
            "auth_url",
        ),
        (
            b'{"type": "user_choice", "group_id": "thread-1", "id": "call", "prompt": "?", "choices": [],'
            b' "response_url": "https://x.example"}',
            "choices",
        ),
        (b'{"type": "subscription_event", "group_id": "thread-1", "tool_call_id": "call"}', "text"),
    ],
)
def test_malformed_bodies_are_400_with_a_json_error(body: bytes, fragment: str) -> None:
    result = receive_callback(body, token(), SECRET)
    assert result.status == 400, result.body
    assert fragment in result.body["error"]
    assert json.loads(result.body_json()) == result.body  # always valid JSON, whatever the message says


def test_a_choice_default_out_of_range_is_400() -> None:
    body = {
        "type": "user_choice",
        "group_id": "thread-1",
        "id": "call",
        "prompt": "?",
        "choices": ["a"],
        "default": 3,
        "response_url": "https://x.example/r",
    }
    assert post(body).status == 400


def test_an_oversized_body_is_413_before_anything_else() -> None:
    big = json.dumps(tool_result(text="x" * 2000))
    result = receive_callback(big, None, SECRET, max_bytes=1000)
    assert result.status == 413 and not result.messages


def test_only_post_is_allowed() -> None:
    assert receive_callback(None, token(), SECRET, method="GET").status == 405


# ---- the Function URL event ---------------------------------------------------------------------------------


def url_event(
    body: str | None, *, b64: bool = False, method: str = "POST", tok: str | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "version": "2.0",
        "rawPath": "/",
        "requestContext": {"http": {"method": method, "path": "/"}},
        "isBase64Encoded": b64,
        "queryStringParameters": {"token": tok or token()},
    }
    if body is not None:
        event["body"] = base64.b64encode(body.encode()).decode() if b64 else body
    return event


def test_function_url_events_plain_and_base64() -> None:
    body = json.dumps(tool_result(text="hi"))
    for b64 in (False, True):
        result = receive_function_url_event(url_event(body, b64=b64), SECRET)
        assert only_message(result).message.content == ToolResult.text("call", "hi")
    response = function_url_response(receive_function_url_event(url_event(body), SECRET))
    assert response == {
        "statusCode": 200,
        "headers": {"content-type": "application/json"},
        "body": '{"ok":true}',
    }


def test_function_url_event_rejections() -> None:
    assert receive_function_url_event(url_event(None), SECRET).status == 400
    bad = url_event("x")
    bad.update(isBase64Encoded=True, body="%%%not base64")
    assert receive_function_url_event(bad, SECRET).status == 400
    assert receive_function_url_event(url_event("{}", method="GET"), SECRET).status == 405
    no_token = url_event(json.dumps(tool_result(text="x")))
    no_token["queryStringParameters"] = None
    assert receive_function_url_event(no_token, SECRET).status == 401
    huge = url_event("x" * 5000, b64=True)
    assert receive_function_url_event(huge, SECRET, max_bytes=1000).status == 413
    # An event of the wrong shape is a 4xx JSON answer, not an exception (Lambda would answer 502).
    odd = url_event(json.dumps(tool_result(text="x")))
    odd.update(requestContext="not an object", queryStringParameters={"token": ["a", "list"]})
    assert receive_function_url_event(odd, SECRET).status == 401
    odd.update(requestContext={"http": None}, queryStringParameters={"token": token()})
    assert receive_function_url_event(odd, SECRET).status == 200


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (RecursionError("too deep"), 400),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "bad"), 400),
        (RuntimeError("a bug"), 500),
        (OSError("disk"), 500),
    ],
)
def test_the_receiver_classifies_unexpected_errors_through_the_tree(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, status: int
) -> None:
    """Whatever goes wrong inside, the receiver answers: 4xx for what only bad input raises (the tool
    server stops), 500 for anything else (it retries) — never an exception (a 502 from Lambda)."""
    from stepagent.rap import receiver

    def explode(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(receiver, "convert_callback", explode)
    result = post(tool_result(text="x"))
    assert result.status == status and "error" in result.body and not result.messages
