"""Reading a thread's stored notices back (``stepagent.notices`` through ``decode_live``): each kind as the
very object stored, any other kind kept as stored, anything unreadable skipped — without making an older
notice look new — and how the console shows the kinds."""

from __future__ import annotations

import json

from stepagent.console.reads import _notice
from stepagent.notices import UnknownNotice
from stepagent.stores.dynamodb_io import DynamoItem
from stepagent.stores.dynamodb_live import decode_live


def item(stored: list[DynamoItem], seq: int) -> DynamoItem:
    """A ``LIVE`` item as DynamoDB returns it, holding ``stored`` notices (wire values)."""
    return {"notices": {"L": stored}, "notice_seq": {"N": str(seq)}}


def s(value: object) -> DynamoItem:
    return {"S": value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))}


ERROR = '{"event_id":"e1","type":"error","message":"gave up","retrying":false,"attempts":3,"later":[1]}'
LIMIT = '{"type":"limit_reached","event_id":"l1","limit":"model_calls_per_turn","value":50,"used":50}'
OAUTH = '{"type":"oauth_required","event_id":"o1","auth_url":"https://x.test/a","tool_call_id":"c1"}'


def test_each_kind_is_the_object_stored_byte_for_byte() -> None:
    live = decode_live(item([s(ERROR), s(LIMIT), s(OAUTH)], 3))
    assert [n["type"] for n in live.notices if not isinstance(n, UnknownNotice)] == [
        "error",
        "limit_reached",
        "oauth_required",
    ]
    # Key order, a key this version does not know and integral numbers stay as written: the HTTP API
    # forwards what was recorded.
    assert [json.dumps(n, separators=(",", ":")) for n in live.notices] == [ERROR, LIMIT, OAUTH]


def test_other_kinds_are_kept_as_stored_and_unreadable_ones_are_skipped() -> None:
    newer = {"type": "future_kind", "event_id": "f1", "x": [1, {"y": None}]}
    misfits = [
        {"type": "error", "event_id": "e", "message": "m", "retrying": "no"},  # not a boolean
        {"type": "error", "event_id": "e", "message": "m"},  # no retrying
        {"type": "limit_reached", "event_id": "l", "limit": "x", "value": True, "used": 1},  # a boolean
        {"type": "oauth_required", "event_id": "o", "auth_url": 7, "tool_call_id": "c"},
    ]
    unreadable = [s("not json"), s([1, 2]), s({"message": "no type"}), s({"type": 5}), s("null"), {"N": "1"}]
    live = decode_live(item([s(newer), *[s(m) for m in misfits], *unreadable], 11))
    assert live.notices == (UnknownNotice(newer), *[UnknownNotice(m) for m in misfits])
    assert [n.type for n in live.notices if isinstance(n, UnknownNotice)][:2] == ["future_kind", "error"]


def test_a_skipped_notice_still_counts_so_no_older_one_looks_new() -> None:
    first, third = ERROR.replace("e1", "first"), ERROR.replace("e1", "third")
    # 25 notices recorded, the last three kept; the middle one cannot be read.
    live = decode_live(item([s(first), s("{garbage"), s(third)], 25))
    assert [n["event_id"] for n in live.new_notices(24)] == ["third"]
    assert [n["event_id"] for n in live.new_notices(23)] == ["third"]
    assert [n["event_id"] for n in live.new_notices(0)] == ["first", "third"]
    assert live.new_notices(25) == []


def test_the_console_shows_each_kind() -> None:
    notices = decode_live(item([s(ERROR), s(LIMIT), s(OAUTH), s({"type": "future", "message": "hm"})], 4))
    views = [_notice(n, pending_ids={"c1"}) for n in notices.notices]
    assert views == [
        {"kind": "error", "text": "gave up", "retrying": False},
        {
            "kind": "error",
            "text": "model_calls_per_turn limit reached (50 of 50): the agent stopped before calling the model",
            "retrying": False,
        },
        {"kind": "oauth", "auth_url": "https://x.test/a", "tool_call_id": "c1", "open": True},
        {"kind": "error", "text": "hm", "retrying": False},
    ]
