"""HMAC callback tokens: bound to (thread, call), constant-time checked, never raising on garbage."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from stepagent.rap.tokens import callback_token, callback_url_for, verify_token

SECRET = "s3cret"


def test_a_token_verifies_for_its_thread_and_names_its_call() -> None:
    token = callback_token(SECRET, "thread-1", "call-1")
    grant = verify_token(SECRET, "thread-1", token)
    assert grant is not None and grant.tool_call_id == "call-1"


@pytest.mark.parametrize(
    ("secret", "thread"),
    [("other-secret", "thread-1"), (SECRET, "thread-2"), (SECRET, "thread-1x")],
)
def test_a_token_is_rejected_for_another_thread_or_secret(secret: str, thread: str) -> None:
    assert verify_token(secret, thread, callback_token(SECRET, "thread-1", "call-1")) is None


def test_an_embedded_call_id_cannot_be_swapped() -> None:
    good = callback_token(SECRET, "t", "call-1").split(".")
    other = callback_token(SECRET, "t", "call-2").split(".")
    forged = ".".join([good[0], other[1], *good[2:]])
    assert verify_token(SECRET, "t", forged) is None


def test_ambiguous_id_pairs_get_different_tokens() -> None:
    a = callback_token(SECRET, "a\x1fb", "c")
    b = callback_token(SECRET, "a", "b\x1fc")
    grant = verify_token(SECRET, "a", b)
    assert grant is not None and grant.tool_call_id == "b\x1fc"
    assert verify_token(SECRET, "a", a) is None


@pytest.mark.parametrize("garbage", [None, "", "v1", "v1.x.y", "v2.a.b", "v1.!!!.???", "v1..", "a.b.c.d"])
def test_garbage_is_rejected_without_raising(garbage: str | None) -> None:
    assert verify_token(SECRET, "t", garbage) is None


def test_an_empty_secret_never_verifies_and_cannot_sign() -> None:
    assert verify_token("", "t", callback_token(SECRET, "t", "c")) is None
    with pytest.raises(ValueError):
        callback_token("", "t", "c")


def test_callback_url_keeps_the_base_query_and_replaces_a_token() -> None:
    url = callback_url_for("https://rx.example/cb?stage=prod&token=old", SECRET, "t", "c")
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert parts.netloc == "rx.example" and parts.path == "/cb"
    assert query["stage"] == ["prod"]
    assert query["token"] == [callback_token(SECRET, "t", "c")]
