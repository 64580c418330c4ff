"""The call-id Bloom filter (``stepagent.call_id_filter``): no false negatives, the designed false-positive
rate at capacity, determinism across processes, union, the encoding; and which ids a summary hides
(``history_items.hidden_call_ids``)."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import uuid

from stepagent.call_id_filter import BITS, CAPACITY, FALSE_POSITIVE_BOUND, FORMAT, CallIdFilter
from stepagent.history_items import (
    INJECTED_TOOL_NAME,
    AssistantText,
    EventItem,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    hidden_call_ids,
)
from stepagent.messages import TextContent, ToolCall, ToolResult


def random_ids(seed: int, count: int) -> list[str]:
    """Ids shaped like providers' (``call_…``, ``toolu_…``, UUIDs, short numerals), deterministic."""
    rng = random.Random(seed)
    shapes = [
        lambda: (
            "call_"
            + "".join(rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", k=24))
        ),
        lambda: "toolu_" + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=24)),
        lambda: str(uuid.UUID(int=rng.getrandbits(128))),
        lambda: f"call_{rng.randrange(10**6)}",
    ]
    ids: dict[str, None] = {}
    while len(ids) < count:
        ids[rng.choice(shapes)()] = None
    return list(ids)


def test_no_false_negatives_on_thousands_of_random_ids() -> None:
    ids = random_ids(1, 5_000)  # far past capacity: still never a false "absent"
    grown = CallIdFilter()
    for start in range(0, len(ids), 250):
        grown = grown.with_ids(ids[start : start + 250])
        assert all(grown.might_contain(i) for i in ids[: start + 250])
    whole = CallIdFilter.of(ids)  # built once: inside the generator it would be rebuilt for every id
    assert all(whole.might_contain(i) for i in ids)
    assert all(CallIdFilter.of([i]).might_contain(i) for i in ids[:1_000])
    assert CallIdFilter.of([""]).might_contain("")  # an empty id is an id too


def test_false_positive_rate_at_capacity_is_within_the_design_bound() -> None:
    members = random_ids(2, CAPACITY)
    others = [i for i in random_ids(3, 20_000) if i not in set(members)]
    full = CallIdFilter.of(members)
    rate = sum(full.might_contain(i) for i in others) / len(others)
    assert rate <= FALSE_POSITIVE_BOUND, rate
    assert full.bits_set <= BITS // 2 + BITS // 16  # about half full at capacity, as designed
    # An empty filter says "absent" to everything; far past capacity it degrades, it does not break.
    assert not any(CallIdFilter().might_contain(i) for i in others[:1_000])
    saturated = CallIdFilter.of(random_ids(4, 4 * CAPACITY))
    assert sum(saturated.might_contain(i) for i in others) / len(others) < 0.9


def test_bits_are_deterministic_across_processes() -> None:
    ids = random_ids(5, 50)
    here = CallIdFilter.of(ids).encode().hex()
    script = (
        "import sys; from stepagent.call_id_filter import CallIdFilter; "
        "print(CallIdFilter.of(sys.argv[1:]).encode().hex())"
    )
    # A fresh interpreter has another hash() salt: the bits must not depend on it.
    for salt in ("0", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", script, *ids],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": salt},
        ).stdout.strip()
        assert out == here


def test_pinned_positions_do_not_change() -> None:
    """Stored filters must read the same in every later version: changing the hash, the positions or the
    layout must come with a new ``FORMAT`` (old filters then decode as unknown, never as wrong)."""
    one = CallIdFilter.of(["call_1"])
    assert [i for i in range(BITS) if one.bits >> i & 1] == [115, 1722, 1879, 3329, 3486, 5093, 6700]
    hundred = CallIdFilter.of([f"call_{i}" for i in range(100)]).encode()
    assert hundred[0] == FORMAT == 1
    assert hashlib.sha256(hundred).hexdigest() == (
        "29a75d4cc6cf997fb3ccfae63a999d077b9c672e83653b640125fd6bd5d2ac2e"
    )


def test_union_holds_both_and_is_order_free() -> None:
    a_ids, b_ids = random_ids(6, 300), random_ids(7, 300)
    a, b = CallIdFilter.of(a_ids), CallIdFilter.of(b_ids)
    both = a.union(b)
    assert both == b.union(a) == CallIdFilter.of(a_ids + b_ids) == a.with_ids(b_ids)
    assert all(both.might_contain(i) for i in a_ids + b_ids)
    assert a.union(CallIdFilter()) == a and a.union(a) == a


def test_encode_decode_round_trip_and_unknown_bytes() -> None:
    for f in (CallIdFilter(), CallIdFilter.of(random_ids(8, 700)), CallIdFilter((1 << BITS) - 1)):
        data = f.encode()
        assert len(data) == 1 + BITS // 8 and data[0] == FORMAT
        assert CallIdFilter.decode(data) == f
    good = CallIdFilter.of(["x"]).encode()
    assert CallIdFilter.decode(bytes([FORMAT + 1]) + good[1:]) is None  # a future format: unknown
    assert CallIdFilter.decode(good[:-1]) is None
    assert CallIdFilter.decode(b"") is None


# ---- which ids a summary hides --------------------------------------------------------------------------


def call(call_id: str) -> ToolCallItem:
    return ToolCallItem(ToolCall(id=call_id, name="lookup", arguments={}))


def result(call_id: str) -> ToolResultItem:
    return ToolResultItem(ToolResult.text(call_id, "out"))


def test_hidden_call_ids_covers_calls_results_and_event_invocations() -> None:
    invocation = ToolCall(id="inv-1", name=INJECTED_TOOL_NAME, arguments={})
    items = [
        UserItem(TextContent(text="hi")),
        AssistantText("calling"),
        call("c-1"),
        result("c-1"),
        result("orphan-answer"),  # answers a call the items do not hold (inherited): still its id
        EventItem(result=ToolResult.text("inv-1", "event"), tool_call_id="sub-1", invocation=invocation),
        EventItem(result=ToolResult.text("legacy-1", "event"), tool_call_id="sub-1"),
    ]
    found = hidden_call_ids(items)
    assert found is not None
    assert all(found.might_contain(i) for i in ("c-1", "orphan-answer", "inv-1", "legacy-1"))
    assert found == CallIdFilter.of(["c-1", "orphan-answer", "inv-1", "legacy-1"])
    assert hidden_call_ids([]) == CallIdFilter()


def test_hidden_call_ids_extends_the_summary_it_starts_from() -> None:
    older = Summary("old", 4, call_ids=CallIdFilter.of(["c-old"]))
    found = hidden_call_ids([older, call("c-new"), result("c-new")])
    assert found == CallIdFilter.of(["c-old", "c-new"])
    # An older summary without a filter: what it hid is unknown, so the new one is unknown too.
    assert hidden_call_ids([Summary("old", 4), call("c-new")]) is None


def test_summary_equality_and_repr_ignore_the_filter() -> None:
    with_filter = Summary("s", 3, call_ids=CallIdFilter.of(["c"]))
    assert with_filter == Summary("s", 3)
    assert "call_ids" not in repr(with_filter)
