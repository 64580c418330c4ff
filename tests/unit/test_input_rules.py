"""The boundary rules of ``stepagent.input_rules`` through ``parse_input_message`` (the one entry point)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepagent.errors import InputError, MalformedMessageError, PayloadTooLargeError
from stepagent.input_rules import MAX_DEPTH, MAX_ID_BYTES, MAX_METADATA_BYTES, check_group_id
from stepagent.messages import parse_input_message


def body(**fields: object) -> dict[str, object]:
    return {"content": {"type": "text", "text": "hi"}, "group_id": "t1", **fields}


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_message_at_every_limit_is_accepted() -> None:
    message = parse_input_message(
        body(
            id="i" * MAX_ID_BYTES,
            metadata={"deep": nested(MAX_DEPTH - 2), "big": "x" * (MAX_METADATA_BYTES - 1000)},
        )
    )
    assert message.id == "i" * MAX_ID_BYTES


@pytest.mark.parametrize(
    ("raw", "error", "reason"),
    [
        ('{"content":' * 50_000 + "1" + "}" * 50_000, MalformedMessageError, "nested deeper"),
        (json.dumps(body(metadata=nested(MAX_DEPTH))), MalformedMessageError, "metadata"),
        ('{"content":{"type":"text","text":"\\udfff"},"group_id":"t"}', MalformedMessageError, "surrogate"),
        (
            '{"content":{"type":"text","text":"ok"},"group_id":"t","metadata":{"\\ud800":1}}',
            InputError,
            "key",
        ),
        (
            '{"content":{"type":"text","text":"ok"},"group_id":"t","metadata":Infinity}',
            InputError,
            "Infinity",
        ),
        (
            '{"content":{"type":"text","text":"ok"},"group_id":"t","metadata":1e999}',
            InputError,
            "out of range",
        ),
        (
            '{"content":{"type":"text","text":"ok"},"group_id":"t","metadata":' + "9" * 5000 + "}",
            InputError,
            "JSON",
        ),
        (json.dumps(body(id="é" * (MAX_ID_BYTES // 2 + 1))), MalformedMessageError, "id: longer"),
        (json.dumps(body(metadata="x" * MAX_METADATA_BYTES)), PayloadTooLargeError, "metadata is"),
        (
            json.dumps(
                {
                    "content": {
                        "type": "toolresult",
                        "id": "c" * 600,
                        "content": [{"type": "text", "text": "r"}],
                    },
                    "group_id": "t",
                }
            ),
            MalformedMessageError,
            "content.id",
        ),
    ],
)
def test_what_breaks_a_rule_is_rejected_as_bad_input(raw: str, error: type[Exception], reason: str) -> None:
    with pytest.raises(error, match=reason) as caught:
        parse_input_message(raw)
    assert isinstance(caught.value, InputError)  # never a RecursionError or UnicodeError


def test_a_thread_id_from_outside_must_be_a_valid_sqs_message_group_id() -> None:
    # SQS: letters, digits and !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~, 1 to 128 characters.
    for good in ("a", "A-z_0.9", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "t" * 128, "5d0c6c52-7a3e-4c55"):
        check_group_id(good, "thread id")
    for bad in ("", "a b", "x\uffff", "caf\u00e9", "tab\there", "t" * 129, "line\n"):
        with pytest.raises(MalformedMessageError, match="thread id"):
            check_group_id(bad, "thread id")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            {"type": "approval", "tool_call_id": "c1", "decision": "approve"},
            "an approval is a person's answer, never synthetic",
        ),
        (
            {"type": "elicitation", "tool_call_id": "c1", "action": "decline"},
            "an elicitation answer is a person's, never synthetic",
        ),
        (
            {"type": "oauth_complete", "tool_call_id": "c1", "outcome": "signed_in", "server": "notes"},
            "a sign-in's completion is never synthetic",
        ),
    ],
)
def test_a_persons_answer_that_comes_as_a_synthetic_message_is_refused(
    content: dict[str, Any], says: str
) -> None:
    body = {"content": content, "group_id": "t", "synthetic": {"type": "compaction"}}
    with pytest.raises(MalformedMessageError) as refused:
        parse_input_message(body)
    assert str(refused.value) == f"invalid input message: synthetic: {says}"
    assert parse_input_message({**body, "synthetic": None}).content.type == content["type"]
