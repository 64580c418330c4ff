"""Reading a thread's stored notices back (``stepagent.notices`` through ``decode_live``): each kind as the
very object stored, any other kind kept as stored, anything unreadable skipped — without making an older
notice look new — and how the console shows the kinds."""

from __future__ import annotations

import json

from stepagent.console.reads import _notice
from stepagent.notices import UnknownNotice
from stepagent.stores.dynamodb.io import DynamoItem
from stepagent.stores.dynamodb.live import decode_live


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
            "text": "model-call limit for one turn reached: 50 of 50 model calls — the agent stopped before "
            "calling the model again; your next message starts a new turn (and a new count), or raise "
            "STEPAGENT_MAX_MODEL_CALLS_PER_TURN (or the profile's max_model_calls_per_turn)",
            "retrying": False,
        },
        {"kind": "oauth", "auth_url": "https://x.test/a", "tool_call_id": "c1", "open": True},
        {"kind": "error", "text": "hm", "retrying": False},
    ]


class _NoMetadata:
    """The one store read the stream makes for notices: the root's metadata (none here)."""

    async def get_metadata(self, thread_id: str) -> None:
        return None


async def test_the_api_stream_token_names_each_notice_so_a_resume_repeats_none() -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from stepagent.api.events import Position, ResumeTokens, SharedReads, TreeEvents, View

    tokens = ResumeTokens(b"k" * 32)

    def decode_token(token: str, root: str) -> dict[str, Position]:
        return tokens.decode(token, root)

    # Six notices recorded, the last four kept; the fifth cannot be read.
    notices = [s(ERROR.replace("e1", f"n{n}")) for n in (3, 4)] + [
        s("{garbage"),
        s(ERROR.replace("e1", "n6")),
    ]
    view = View(None, decode_live(item(notices, 6)))
    reader = cast(Any, SimpleNamespace(state=_NoMetadata()))

    async def sent(positions: dict[str, Position]) -> list[tuple[str, str]]:
        stream = TreeEvents(SharedReads(reader), "t", positions, tokens=tokens)
        return [(token, event["event_id"]) async for token, event in stream._thread_events("t", view)]  # type: ignore[typeddict-item]

    first = await sent({"t": Position(notices=2)})
    assert [event_id for _, event_id in first] == ["n3", "n4", "n6"]
    assert [decode_token(token, "t")["t"].notices for token, _ in first] == [3, 4, 6]
    # Resumed after each event: exactly the ones after it.
    assert [e for _, e in await sent(decode_token(first[1][0], "t"))] == ["n6"]
    assert await sent(decode_token(first[2][0], "t")) == []


def test_an_error_notice_that_does_not_read_as_one_is_still_shown_as_an_error() -> None:
    from typing import Any, cast

    from stepagent.client.watch import TreeWatch, WatchedThread

    misfit = {"type": "error", "event_id": "e", "message": "gave up on msg-7", "retrying": "no"}
    live = decode_live(item([s(misfit), s({"type": "oauth_required", "event_id": "o", "auth_url": 7})], 2))
    watch = TreeWatch(cast(Any, None), "t", {}, awaited={"msg-7", "msg-8"})
    view = WatchedThread(live=live, notice_seq=0)
    # The watch shows the misfit error (a non-boolean ``retrying`` is not a retry) and stops waiting for
    # the message it names; the unreadable OAuth notice is a kind it cannot show.
    assert watch._notices("t", view) == [
        {"thread_id": "t", "kind": "error", "text": "gave up on msg-7", "retrying": False}
    ]
    assert watch.awaited == {"msg-8"}
    # The console never shows an empty box: a notice with no message is named by its type.
    assert [_notice(n, pending_ids=set()) for n in live.notices] == [
        {"kind": "error", "text": "gave up on msg-7", "retrying": False},
        {"kind": "error", "text": "[oauth_required notice]", "retrying": False},
    ]
