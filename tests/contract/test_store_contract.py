"""Contract suite for ``ConversationStore`` + ``StateStore``, run against every registered implementation.

Only protocol methods are used and every test works on fresh ids, so an implementation backed by shared
infrastructure (DynamoDB on moto/LocalStack) can join by registering a factory in ``conftest.py``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from stepagent.core.ancestors import AncestorLink, ancestor_chain, load_history_with_ancestors
from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import (
    AssistantText,
    HistoryItem,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import InputMessage, TextContent, ToolCall, ToolResult, UserChoiceRequired
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    DeferredInput,
    DispatchIntent,
    StateStore,
    StoredRow,
    ThreadInfo,
    ThreadKind,
)

StorePair = tuple[ConversationStore, StateStore]


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def text_of(item: HistoryItem) -> str:
    match item:
        case UserItem():
            return item.text or ""
        case AssistantText(text=text):
            return text
        case Summary(text=text):
            return f"summary:{text}"
        case ToolCallItem(call=call):
            return f"call:{call.name}"
        case ToolResultItem(result=result):
            return f"result:{result.first_text()}"
    return repr(item)


async def head(conv: ConversationStore, thread_id: str) -> int:
    info = await conv.get_thread(thread_id)
    return info.version if info else 0


async def append(conv: ConversationStore, thread_id: str, *texts: str) -> ThreadInfo:
    """Commit one user row per text, with fresh message ids."""
    rows = [(user(text), uid("m")) for text in texts]
    return await conv.commit(thread_id, Commit(expected_version=await head(conv, thread_id), rows=rows))


async def load(
    conv: ConversationStore, thread_id: str, after: int = 0, up_to: int | None = None
) -> list[StoredRow]:
    return [row async for row in conv.load_rows(thread_id, after=after, up_to=up_to)]


async def texts(
    conv: ConversationStore, thread_id: str, after: int = 0, up_to: int | None = None
) -> list[str]:
    return [text_of(row.item) for row in await load(conv, thread_id, after, up_to)]


def choice(choice_id: str, prompt: str = "Pick one") -> UserChoiceRequired:
    return UserChoiceRequired(
        id=choice_id, prompt=prompt, choices=["a", "b"], response_url="https://example/r"
    )


def intent(tool_call_id: str, name: str = "remote_tool") -> DispatchIntent:
    return DispatchIntent(
        tool_call_id=tool_call_id, tool_name=name, arguments={"q": tool_call_id}, call_id=None
    )


def deferred(thread_id: str, message_id: str) -> DeferredInput:
    message = InputMessage.tool_result(
        thread_id, ToolResult.text("tc-sub", f"event {message_id}"), synthetic="tc-sub"
    )
    return DeferredInput(message_id=message_id, message=message)


@dataclass
class Snapshot:
    info: ThreadInfo | None
    rows: list[StoredRow]
    processed: set[str]
    answered: set[str]
    intents: list[DispatchIntent]
    subscriptions: set[str]
    deferred: list[DeferredInput]
    metadata: Any


async def snapshot(stores: StorePair, thread_id: str, probe_ids: list[str]) -> Snapshot:
    conv, state = stores
    return Snapshot(
        info=await conv.get_thread(thread_id),
        rows=await load(conv, thread_id),
        processed=await state.filter_processed(thread_id, probe_ids),
        answered=await state.filter_answered(thread_id, probe_ids),
        intents=await state.open_intents(thread_id),
        subscriptions=await state.active_subscriptions(thread_id),
        deferred=await state.deferred_inputs(thread_id),
        metadata=await state.get_metadata(thread_id),
    )


# ----------------------------------------------------------------------------------------------------------
# Commit: orders, heads, version check


async def test_unknown_thread_has_no_record_and_no_rows(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    assert await conv.get_thread(thread) is None
    assert await load(conv, thread) == []
    # Reading did not create anything.
    assert await conv.get_thread(thread) is None


async def test_first_commit_creates_a_root_record(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    info = await append(conv, thread, "one", "two")
    assert info.thread_id == thread
    assert info.root_id == thread
    assert info.parent_id is None
    assert info.spawn_order is None
    assert info.spawn_tool_call_id is None
    assert info.kind == ThreadKind.ROOT
    assert info.closed is False
    assert info.version == 1
    assert info.tail == 2
    assert await conv.get_thread(thread) == info


async def test_commit_assigns_one_based_gap_free_orders(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    items: list[HistoryItem] = [
        user("hello"),
        AssistantText("hi there"),
        ToolCallItem(ToolCall(id="tc-1", name="some_tool", arguments={"x": 1})),
    ]
    ids = ["m-1", "c-1", "c-2"]
    first = await conv.commit(thread, Commit(expected_version=0, rows=list(zip(items, ids, strict=True))))
    assert (first.version, first.tail) == (1, 3)
    second = await conv.commit(
        thread, Commit(expected_version=1, rows=[(ToolResultItem(ToolResult.text("tc-1", "out")), "tc-1")])
    )
    assert (second.version, second.tail) == (2, 4)
    rows = await load(conv, thread)
    assert [row.order for row in rows] == [1, 2, 3, 4]
    assert [row.message_id for row in rows] == ["m-1", "c-1", "c-2", "tc-1"]
    assert [row.item for row in rows] == [*items, ToolResultItem(ToolResult.text("tc-1", "out"))]


async def test_commit_returns_the_new_head(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    returned = await append(conv, thread, "a")
    assert await conv.get_thread(thread) == returned
    returned = await append(conv, thread, "b", "c", "d")
    assert (returned.version, returned.tail) == (2, 4)
    assert await conv.get_thread(thread) == returned


async def test_commit_without_rows_advances_version_not_tail(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await append(conv, thread, "a")
    info = await conv.commit(thread, Commit(expected_version=1, processed_message_ids=["m-x"]))
    assert (info.version, info.tail) == (2, 1)
    assert await state.filter_processed(thread, ["m-x"]) == {"m-x"}


async def test_threads_have_independent_logs(stores: StorePair) -> None:
    conv, _ = stores
    a, b = uid("a"), uid("b")
    await append(conv, a, "a1", "a2")
    await append(conv, b, "b1")
    assert await texts(conv, a) == ["a1", "a2"]
    assert await texts(conv, b) == ["b1"]
    assert [row.order for row in await load(conv, b)] == [1]


def full_commit(thread: str, expected_version: int, tag: str) -> Commit:
    return Commit(
        expected_version=expected_version,
        rows=[(user(f"row {tag}"), f"m-{tag}")],
        processed_message_ids=[f"m-{tag}"],
        answered_tool_calls=[f"tc-{tag}"],
        intents_added=[intent(f"tc-{tag}")],
        subscriptions_added=[f"sub-{tag}"],
        deferred_added=[deferred(thread, f"d-{tag}")],
        metadata=(thread, {"tag": tag}),
    )


@pytest.mark.parametrize("expected_version", [0, 2, 7])
async def test_version_conflict_raises_and_changes_nothing(stores: StorePair, expected_version: int) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(thread, full_commit(thread, 0, "first"))
    probe = ["m-first", "tc-first", "m-second", "tc-second", "m-extra"]
    before = await snapshot(stores, thread, probe)
    assert before.info is not None and before.info.version == 1

    losing = full_commit(thread, expected_version, "second")
    losing.subscriptions_removed = ["sub-first"]
    losing.deferred_removed = ["d-first"]
    losing.processed_message_ids = [*losing.processed_message_ids, "m-extra"]
    with pytest.raises(ConcurrentWriteError):
        await conv.commit(thread, losing)

    assert await snapshot(stores, thread, probe) == before
    assert await state.get_metadata(thread) == {"tag": "first"}


async def test_version_conflict_on_unknown_thread_creates_nothing(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    with pytest.raises(ConcurrentWriteError):
        await conv.commit(thread, full_commit(thread, 3, "x"))
    assert await conv.get_thread(thread) is None
    assert await load(conv, thread) == []
    assert await state.filter_processed(thread, ["m-x"]) == set()
    assert await state.open_intents(thread) == []
    assert await state.get_metadata(thread) is None


async def test_two_writers_from_the_same_head_one_wins(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await append(conv, thread, "base")
    await conv.commit(thread, Commit(expected_version=1, rows=[(user("winner"), "w")]))
    with pytest.raises(ConcurrentWriteError):
        await conv.commit(thread, Commit(expected_version=1, rows=[(user("loser"), "l")]))
    assert await texts(conv, thread) == ["base", "winner"]
    # The loser retries from the fresh head and lands after the winner.
    await conv.commit(thread, Commit(expected_version=2, rows=[(user("loser"), "l")]))
    assert await texts(conv, thread) == ["base", "winner", "loser"]


# ----------------------------------------------------------------------------------------------------------
# Atomicity of every Commit field: applied by a successful commit, absent after a rejected one


async def check_rows(stores: StorePair, thread: str, applied: bool) -> None:
    assert await texts(stores[0], thread) == (["field row"] if applied else [])


async def check_processed(stores: StorePair, thread: str, applied: bool) -> None:
    assert await stores[1].filter_processed(thread, ["pm-1", "pm-2"]) == (
        {"pm-1", "pm-2"} if applied else set()
    )


async def check_answered(stores: StorePair, thread: str, applied: bool) -> None:
    assert await stores[1].filter_answered(thread, ["ac-1", "ac-2"]) == (
        {"ac-1", "ac-2"} if applied else set()
    )


async def check_intents(stores: StorePair, thread: str, applied: bool) -> None:
    assert await stores[1].open_intents(thread) == ([intent("in-1"), intent("in-2")] if applied else [])


async def check_subs_added(stores: StorePair, thread: str, applied: bool) -> None:
    assert await stores[1].active_subscriptions(thread) == (
        {"base-sub", "new-sub"} if applied else {"base-sub"}
    )


async def check_subs_removed(stores: StorePair, thread: str, applied: bool) -> None:
    assert await stores[1].active_subscriptions(thread) == (set() if applied else {"base-sub"})


async def check_deferred_added(stores: StorePair, thread: str, applied: bool) -> None:
    expected = (
        [deferred(thread, "base-d"), deferred(thread, "new-d")] if applied else [deferred(thread, "base-d")]
    )
    assert await stores[1].deferred_inputs(thread) == expected


async def check_deferred_removed(stores: StorePair, thread: str, applied: bool) -> None:
    assert await stores[1].deferred_inputs(thread) == ([] if applied else [deferred(thread, "base-d")])


async def check_metadata(stores: StorePair, thread: str, applied: bool) -> None:
    assert await stores[1].get_metadata(thread) == ({"new": True} if applied else {"base": True})


FIELD_CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "rows": ({"rows": [(user("field row"), "fr-1")]}, check_rows),
    "processed_message_ids": ({"processed_message_ids": ["pm-1", "pm-2"]}, check_processed),
    "answered_tool_calls": ({"answered_tool_calls": ["ac-1", "ac-2"]}, check_answered),
    "intents_added": ({"intents_added": [intent("in-1"), intent("in-2")]}, check_intents),
    "subscriptions_added": ({"subscriptions_added": ["new-sub"]}, check_subs_added),
    "subscriptions_removed": ({"subscriptions_removed": ["base-sub"]}, check_subs_removed),
    "deferred_added": ({"deferred_added": "new-d"}, check_deferred_added),
    "deferred_removed": ({"deferred_removed": ["base-d"]}, check_deferred_removed),
    "metadata": ({"metadata": {"new": True}}, check_metadata),
}


@pytest.mark.parametrize("field_name", list(FIELD_CASES))
async def test_each_commit_field_is_atomic(stores: StorePair, field_name: str) -> None:
    conv, _ = stores
    thread = uid("t")
    # A baseline commit (version 1) holding one subscription, one deferred input and some metadata.
    await conv.commit(
        thread,
        Commit(
            expected_version=0,
            subscriptions_added=["base-sub"],
            deferred_added=[deferred(thread, "base-d")],
            metadata=(thread, {"base": True}),
        ),
    )
    spec, check = FIELD_CASES[field_name]
    kwargs = dict(spec)
    if field_name == "deferred_added":
        kwargs["deferred_added"] = [deferred(thread, "new-d")]
    if field_name == "metadata":
        kwargs["metadata"] = (thread, kwargs["metadata"])

    with pytest.raises(ConcurrentWriteError):
        await conv.commit(thread, Commit(expected_version=0, **kwargs))
    await check(stores, thread, False)
    assert await head(conv, thread) == 1

    info = await conv.commit(thread, Commit(expected_version=1, **kwargs))
    assert info.version == 2
    await check(stores, thread, True)


async def test_full_commit_lands_everything_together(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(thread, full_commit(thread, 0, "a"))
    assert await texts(conv, thread) == ["row a"]
    assert await state.filter_processed(thread, ["m-a"]) == {"m-a"}
    assert await state.filter_answered(thread, ["tc-a"]) == {"tc-a"}
    assert await state.open_intents(thread) == [intent("tc-a")]
    assert await state.active_subscriptions(thread) == {"sub-a"}
    assert await state.deferred_inputs(thread) == [deferred(thread, "d-a")]
    assert await state.get_metadata(thread) == {"tag": "a"}


async def test_commit_metadata_is_keyed_by_the_given_root(stores: StorePair) -> None:
    conv, state = stores
    root = uid("root")
    await append(conv, root, "r1")
    child = uid("child")
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="tc-spawn", kind=ThreadKind.CHILD)
    await conv.commit(child, Commit(expected_version=0, metadata=(root, {"from": "child"})))
    assert await state.get_metadata(root) == {"from": "child"}
    assert await state.get_metadata(child) is None


# ----------------------------------------------------------------------------------------------------------
# load_rows bounds


async def test_load_rows_bounds(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await append(conv, thread, *[f"r{i}" for i in range(1, 8)])
    assert await texts(conv, thread) == [f"r{i}" for i in range(1, 8)]
    assert await texts(conv, thread, after=3) == ["r4", "r5", "r6", "r7"]
    assert await texts(conv, thread, up_to=2) == ["r1", "r2"]
    assert await texts(conv, thread, after=2, up_to=5) == ["r3", "r4", "r5"]
    assert [row.order for row in await load(conv, thread, after=2, up_to=5)] == [3, 4, 5]
    assert await texts(conv, thread, up_to=0) == []
    assert await texts(conv, thread, after=4, up_to=4) == []
    assert await texts(conv, thread, after=5, up_to=3) == []
    assert await texts(conv, thread, after=7) == []
    assert await texts(conv, thread, after=100) == []
    # up_to past the tail is clamped to the tail.
    assert await texts(conv, thread, up_to=100) == [f"r{i}" for i in range(1, 8)]
    assert await texts(conv, thread, after=6, up_to=100) == ["r7"]


async def test_load_rows_across_many_commits(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    for i in range(1, 31):
        await append(conv, thread, f"r{i}")
    rows = await load(conv, thread)
    assert [row.order for row in rows] == list(range(1, 31))
    assert [text_of(row.item) for row in rows] == [f"r{i}" for i in range(1, 31)]
    assert [row.order for row in await load(conv, thread, after=25)] == [26, 27, 28, 29, 30]


async def test_rows_of_a_rejected_commit_never_appear(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await append(conv, thread, "a", "b")
    with pytest.raises(ConcurrentWriteError):
        await conv.commit(thread, Commit(expected_version=0, rows=[(user("ghost"), "g")]))
    assert await texts(conv, thread, up_to=10) == ["a", "b"]
    await append(conv, thread, "c")
    assert await texts(conv, thread) == ["a", "b", "c"]


async def test_each_commit_records_its_turn_flag_on_the_head(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    info = await conv.commit(thread, Commit(expected_version=0, rows=[(user("hi"), uid("m"))]))
    assert info.turn_complete is False  # the default: a commit that does not say so is mid-turn
    assert (await conv.get_thread(thread)).turn_complete is False  # type: ignore[union-attr]
    info = await conv.commit(
        thread, Commit(expected_version=1, rows=[(AssistantText("hello"), uid("m"))], turn_complete=True)
    )
    assert info.turn_complete is True
    assert (await conv.get_thread(thread)).turn_complete is True  # type: ignore[union-attr]
    # Only the flag: not a change by itself.
    assert Commit(expected_version=2, turn_complete=True).is_empty()
    info = await conv.commit(thread, Commit(expected_version=2, processed_message_ids=[uid("m")]))
    assert info.turn_complete is False


async def test_a_spawned_child_has_no_turn_flag_until_its_first_commit(stores: StorePair) -> None:
    conv, _ = stores
    parent = uid("p")
    await append(conv, parent, "p1")
    child = uid("c")
    info = await conv.spawn_thread(parent, child_id=child, spawn_tool_call_id="tc", kind=ThreadKind.CHILD)
    assert info.turn_complete is None
    assert (await conv.get_thread(child)).turn_complete is None  # type: ignore[union-attr]
    await conv.commit(child, Commit(expected_version=0, rows=[(user("seed"), uid("m"))], turn_complete=True))
    assert (await conv.get_thread(child)).turn_complete is True  # type: ignore[union-attr]
    assert [c.turn_complete for c in await conv.children(parent)] == [True]


# ----------------------------------------------------------------------------------------------------------
# Thread tree


async def test_spawn_default_order_is_parent_tail(stores: StorePair) -> None:
    conv, _ = stores
    parent = uid("p")
    await append(conv, parent, "p1", "p2", "p3")
    child = uid("c")
    info = await conv.spawn_thread(
        parent, child_id=child, spawn_tool_call_id="tc-spawn", kind=ThreadKind.CHILD
    )
    assert info == ThreadInfo(
        thread_id=child,
        root_id=parent,
        parent_id=parent,
        spawn_order=3,
        spawn_tool_call_id="tc-spawn",
        kind=ThreadKind.CHILD,
        closed=False,
        version=0,
        tail=0,
    )
    assert await conv.get_thread(child) == info
    # The parent's record is untouched and the child has no rows.
    parent_info = await conv.get_thread(parent)
    assert parent_info is not None and (parent_info.version, parent_info.tail) == (1, 3)
    assert await load(conv, child) == []


async def test_spawn_with_explicit_order(stores: StorePair) -> None:
    conv, _ = stores
    parent = uid("p")
    await append(conv, parent, "p1", "p2", "p3", "p4")
    child = uid("c")
    info = await conv.spawn_thread(
        parent, child_id=child, spawn_tool_call_id="tc-c", kind=ThreadKind.COMPACTION, spawn_order=2
    )
    assert info.spawn_order == 2
    assert info.kind == ThreadKind.COMPACTION
    zero = uid("z")
    assert (
        await conv.spawn_thread(
            parent, child_id=zero, spawn_tool_call_id="t", kind=ThreadKind.CHILD, spawn_order=0
        )
    ).spawn_order == 0


async def test_spawn_is_idempotent_by_child_id(stores: StorePair) -> None:
    conv, _ = stores
    parent = uid("p")
    await append(conv, parent, "p1")
    child = uid("c")
    first = await conv.spawn_thread(parent, child_id=child, spawn_tool_call_id="tc-1", kind=ThreadKind.CHILD)
    await append(conv, parent, "p2", "p3")
    again = await conv.spawn_thread(
        parent,
        child_id=child,
        spawn_tool_call_id="tc-other",
        kind=ThreadKind.SUBSCRIPTION_EVENT,
        spawn_order=3,
    )
    assert again == first
    assert await conv.get_thread(child) == first
    # A redelivered spawn after the child has committed does not reset its head.
    await append(conv, child, "c1")
    committed = await conv.get_thread(child)
    assert committed is not None and committed.version == 1
    assert (
        await conv.spawn_thread(parent, child_id=child, spawn_tool_call_id="tc-1", kind=ThreadKind.CHILD)
        == committed
    )
    assert await texts(conv, child) == ["c1"]


async def test_spawn_inherits_the_root(stores: StorePair) -> None:
    conv, _ = stores
    root = uid("r")
    await append(conv, root, "r1")
    child = uid("c")
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id="tc-c", kind=ThreadKind.CHILD)
    await append(conv, child, "c1", "c2")
    grandchild = uid("g")
    info = await conv.spawn_thread(
        child, child_id=grandchild, spawn_tool_call_id="tc-g", kind=ThreadKind.CHILD
    )
    assert info.root_id == root
    assert info.parent_id == child
    assert info.spawn_order == 2


async def test_spawn_creates_a_missing_parent_as_root(stores: StorePair) -> None:
    conv, _ = stores
    parent, child = uid("p"), uid("c")
    info = await conv.spawn_thread(parent, child_id=child, spawn_tool_call_id="tc", kind=ThreadKind.CHILD)
    assert info.spawn_order == 0
    assert info.root_id == parent
    parent_info = await conv.get_thread(parent)
    assert parent_info is not None
    assert parent_info.parent_id is None
    assert parent_info.root_id == parent
    assert parent_info.kind == ThreadKind.ROOT
    assert (parent_info.version, parent_info.tail) == (0, 0)
    # The implicitly created parent accepts its first commit at version 0.
    info_after = await append(conv, parent, "p1")
    assert (info_after.version, info_after.tail) == (1, 1)


@pytest.mark.parametrize("kind", [ThreadKind.CHILD, ThreadKind.SUBSCRIPTION_EVENT, ThreadKind.COMPACTION])
async def test_spawn_kinds_are_stored(stores: StorePair, kind: ThreadKind) -> None:
    conv, _ = stores
    parent, child = uid("p"), uid("c")
    await append(conv, parent, "p1")
    await conv.spawn_thread(parent, child_id=child, spawn_tool_call_id="tc", kind=kind)
    stored = await conv.get_thread(child)
    assert stored is not None and stored.kind == kind


async def test_child_commit_keeps_its_tree_record(stores: StorePair) -> None:
    conv, _ = stores
    parent, child = uid("p"), uid("c")
    await append(conv, parent, "p1", "p2")
    spawned = await conv.spawn_thread(parent, child_id=child, spawn_tool_call_id="tc", kind=ThreadKind.CHILD)
    info = await append(conv, child, "c1")
    assert info.parent_id == parent
    assert info.root_id == parent
    assert info.spawn_order == 2
    assert info.spawn_tool_call_id == "tc"
    assert info.kind == ThreadKind.CHILD
    assert (info.version, info.tail) == (spawned.version + 1, 1)
    # Parent's log is not affected by the child's commit.
    assert await texts(conv, parent) == ["p1", "p2"]


async def test_close_thread(stores: StorePair) -> None:
    conv, _ = stores
    parent, child = uid("p"), uid("c")
    await append(conv, parent, "p1")
    await conv.spawn_thread(parent, child_id=child, spawn_tool_call_id="tc", kind=ThreadKind.CHILD)
    await conv.close_thread(child)
    closed = await conv.get_thread(child)
    assert closed is not None and closed.closed
    parent_info = await conv.get_thread(parent)
    assert parent_info is not None and not parent_info.closed
    # Closing twice is harmless; the rest of the record is kept.
    await conv.close_thread(child)
    again = await conv.get_thread(child)
    assert again is not None and again.closed and again.parent_id == parent and again.spawn_order == 1


async def test_close_unknown_thread_is_a_no_op(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await conv.close_thread(thread)
    assert await conv.get_thread(thread) is None


async def test_close_root_with_rows_keeps_rows(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await append(conv, thread, "a")
    await conv.close_thread(thread)
    info = await conv.get_thread(thread)
    assert info is not None and info.closed and info.tail == 1
    assert await texts(conv, thread) == ["a"]


async def test_ancestor_chain(stores: StorePair) -> None:
    conv, _ = stores
    r, c, g = uid("r"), uid("c"), uid("g")
    await append(conv, r, *[f"r{i}" for i in range(1, 7)])
    await conv.spawn_thread(r, child_id=c, spawn_tool_call_id="tc-c", kind=ThreadKind.CHILD)
    await append(conv, c, "c1", "c2", "c3")
    await conv.spawn_thread(c, child_id=g, spawn_tool_call_id="tc-g", kind=ThreadKind.CHILD)
    assert await ancestor_chain(conv, g) == [AncestorLink(r, 6), AncestorLink(c, 3)]
    assert await ancestor_chain(conv, c) == [AncestorLink(r, 6)]
    assert await ancestor_chain(conv, r) == []
    assert await ancestor_chain(conv, uid("unknown")) == []


# ----------------------------------------------------------------------------------------------------------
# Summaries


async def test_summaries(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    assert await conv.latest_summary(thread) is None
    await conv.save_summary(thread, Summary("four", 4))
    await conv.save_summary(thread, Summary("eight", 8))
    assert await conv.latest_summary(thread) == Summary("eight", 8)
    assert await conv.latest_summary(thread, up_to=8) == Summary("eight", 8)
    assert await conv.latest_summary(thread, up_to=7) == Summary("four", 4)
    assert await conv.latest_summary(thread, up_to=4) == Summary("four", 4)
    assert await conv.latest_summary(thread, up_to=3) is None
    assert await conv.latest_summary(thread, up_to=100) == Summary("eight", 8)
    # Summaries are per thread.
    assert await conv.latest_summary(uid("other")) is None


async def test_summary_with_same_order_replaces(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await conv.save_summary(thread, Summary("first take", 5))
    await conv.save_summary(thread, Summary("second take", 5))
    assert await conv.latest_summary(thread) == Summary("second take", 5)
    assert await conv.latest_summary(thread, up_to=5) == Summary("second take", 5)


async def test_latest_summary_is_highest_order_not_last_saved(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await conv.save_summary(thread, Summary("late", 9))
    await conv.save_summary(thread, Summary("early, saved last", 3))
    assert await conv.latest_summary(thread) == Summary("late", 9)
    assert await conv.latest_summary(thread, up_to=8) == Summary("early, saved last", 3)


async def test_saving_a_summary_deletes_no_rows(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    await append(conv, thread, "a", "b", "c")
    await conv.save_summary(thread, Summary("a and b", 2))
    assert await texts(conv, thread) == ["a", "b", "c"]


# ----------------------------------------------------------------------------------------------------------
# Dedup reads


async def test_filter_processed_returns_only_the_asked_subset(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(thread, Commit(expected_version=0, processed_message_ids=["m-1", "m-2", "m-3"]))
    assert await state.filter_processed(thread, ["m-2", "m-9"]) == {"m-2"}
    assert await state.filter_processed(thread, ["m-9"]) == set()
    assert await state.filter_processed(thread, []) == set()
    assert await state.filter_processed(thread, ["m-1", "m-1", "m-3"]) == {"m-1", "m-3"}
    # Other threads do not see these ids.
    assert await state.filter_processed(uid("other"), ["m-1", "m-2", "m-3"]) == set()


async def test_filter_answered_returns_only_the_asked_subset(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(thread, Commit(expected_version=0, answered_tool_calls=["tc-1", "tc-2"]))
    assert await state.filter_answered(thread, ["tc-2", "tc-3"]) == {"tc-2"}
    assert await state.filter_answered(thread, []) == set()
    assert await state.filter_answered(uid("other"), ["tc-1"]) == set()
    # Answered calls and processed message ids are separate namespaces.
    assert await state.filter_processed(thread, ["tc-1"]) == set()


async def test_mark_processed(stores: StorePair) -> None:
    _, state = stores
    thread = uid("t")
    await state.mark_processed(thread, ["dup-1", "dup-2"])
    await state.mark_processed(thread, ["dup-2", "dup-3"])
    await state.mark_processed(thread, [])
    assert await state.filter_processed(thread, ["dup-1", "dup-2", "dup-3", "dup-4"]) == {
        "dup-1",
        "dup-2",
        "dup-3",
    }
    assert await state.filter_answered(thread, ["dup-1"]) == set()


async def test_processed_ids_accumulate_across_commits(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(thread, Commit(expected_version=0, processed_message_ids=["m-1"]))
    await state.mark_processed(thread, ["m-2"])
    await conv.commit(thread, Commit(expected_version=1, processed_message_ids=["m-3"]))
    assert await state.filter_processed(thread, ["m-1", "m-2", "m-3"]) == {"m-1", "m-2", "m-3"}


# ----------------------------------------------------------------------------------------------------------
# Metadata


async def test_metadata_set_get(stores: StorePair) -> None:
    _, state = stores
    root = uid("root")
    assert await state.get_metadata(root) is None
    await state.set_metadata(root, {"user_id": "u-123"})
    assert await state.get_metadata(root) == {"user_id": "u-123"}
    await state.set_metadata(root, {"other": [1, 2]})
    assert await state.get_metadata(root) == {"other": [1, 2]}  # replaced, not merged
    await state.set_metadata(root, "a string")
    assert await state.get_metadata(root) == "a string"
    assert await state.get_metadata(uid("other")) is None


async def test_metadata_is_deep_copied(stores: StorePair) -> None:
    conv, state = stores
    root = uid("root")
    value: dict[str, Any] = {"nested": {"list": [1, 2]}}
    await state.set_metadata(root, value)
    value["nested"]["list"].append(3)
    value["added"] = True
    read = await state.get_metadata(root)
    assert read == {"nested": {"list": [1, 2]}}
    read["nested"]["list"].append(99)
    assert await state.get_metadata(root) == {"nested": {"list": [1, 2]}}

    committed: dict[str, Any] = {"via": {"commit": [1]}}
    await conv.commit(root, Commit(expected_version=0, metadata=(root, committed)))
    committed["via"]["commit"].append(2)
    assert await state.get_metadata(root) == {"via": {"commit": [1]}}


# ----------------------------------------------------------------------------------------------------------
# Subscriptions


async def test_subscriptions_add_remove(stores: StorePair) -> None:
    _, state = stores
    thread = uid("t")
    assert await state.active_subscriptions(thread) == set()
    await state.add_subscription(thread, "sub-1")
    await state.add_subscription(thread, "sub-2")
    await state.add_subscription(thread, "sub-1")
    assert await state.active_subscriptions(thread) == {"sub-1", "sub-2"}
    await state.remove_subscription(thread, "sub-1")
    await state.remove_subscription(thread, "sub-missing")
    assert await state.active_subscriptions(thread) == {"sub-2"}
    assert await state.active_subscriptions(uid("other")) == set()


async def test_subscriptions_returned_set_is_a_copy(stores: StorePair) -> None:
    _, state = stores
    thread = uid("t")
    await state.add_subscription(thread, "sub-1")
    got = await state.active_subscriptions(thread)
    got.add("sneaky")
    assert await state.active_subscriptions(thread) == {"sub-1"}


async def test_subscriptions_via_commit(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    await conv.commit(thread, Commit(expected_version=0, subscriptions_added=["s-1", "s-2"]))
    await conv.commit(
        thread, Commit(expected_version=1, subscriptions_removed=["s-1"], subscriptions_added=["s-3"])
    )
    assert await state.active_subscriptions(thread) == {"s-2", "s-3"}


# ----------------------------------------------------------------------------------------------------------
# Pending user choices


async def test_pending_choices(stores: StorePair) -> None:
    _, state = stores
    thread = uid("t")
    assert await state.pending_choices(thread) == []
    await state.add_pending_choice(thread, choice("c-zeta"))
    await state.add_pending_choice(thread, choice("c-alpha"))
    await state.add_pending_choice(thread, choice("c-mid"))
    assert [c.id for c in await state.pending_choices(thread)] == ["c-zeta", "c-alpha", "c-mid"]
    assert await state.pending_choices(thread) == [choice("c-zeta"), choice("c-alpha"), choice("c-mid")]

    await state.add_pending_choice(thread, choice("c-alpha", prompt="Changed"))
    pending = await state.pending_choices(thread)
    assert {c.id for c in pending} == {"c-zeta", "c-alpha", "c-mid"}
    assert [c for c in pending if c.id == "c-alpha"] == [choice("c-alpha", prompt="Changed")]

    await state.remove_pending_choice(thread, "c-zeta")
    await state.remove_pending_choice(thread, "c-missing")
    assert [c.id for c in await state.pending_choices(thread)] in (["c-alpha", "c-mid"], ["c-mid", "c-alpha"])
    assert await state.pending_choices(uid("other")) == []


# ----------------------------------------------------------------------------------------------------------
# Dispatch intents (outbox)


async def test_open_intents_and_mark_done(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    assert await state.open_intents(thread) == []
    await conv.commit(thread, Commit(expected_version=0, intents_added=[intent("tc-zz"), intent("tc-aa")]))
    await conv.commit(thread, Commit(expected_version=1, intents_added=[intent("tc-mm", name="other")]))
    assert await state.open_intents(thread) == [
        intent("tc-zz"),
        intent("tc-aa"),
        intent("tc-mm", name="other"),
    ]
    await state.mark_intent_done(thread, "tc-aa")
    assert await state.open_intents(thread) == [intent("tc-zz"), intent("tc-mm", name="other")]
    await state.mark_intent_done(thread, "tc-aa")  # idempotent
    await state.mark_intent_done(thread, "tc-unknown")
    await state.mark_intent_done(thread, "tc-zz")
    await state.mark_intent_done(thread, "tc-mm")
    assert await state.open_intents(thread) == []
    assert await state.open_intents(uid("other")) == []


async def test_intent_fields_round_trip(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    full = DispatchIntent(
        tool_call_id="tc-9", tool_name="rap_tool", arguments={"nested": {"a": [1, "x", None]}}, call_id="c-9"
    )
    await conv.commit(thread, Commit(expected_version=0, intents_added=[full]))
    assert await state.open_intents(thread) == [full]


# ----------------------------------------------------------------------------------------------------------
# Deferred inputs


async def test_deferred_inputs_in_order(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    assert await state.deferred_inputs(thread) == []
    await conv.commit(
        thread,
        Commit(expected_version=0, deferred_added=[deferred(thread, "d-zz"), deferred(thread, "d-aa")]),
    )
    await conv.commit(thread, Commit(expected_version=1, deferred_added=[deferred(thread, "d-mm")]))
    assert await state.deferred_inputs(thread) == [deferred(thread, d) for d in ("d-zz", "d-aa", "d-mm")]
    await conv.commit(thread, Commit(expected_version=2, deferred_removed=["d-aa", "d-missing"]))
    assert await state.deferred_inputs(thread) == [deferred(thread, "d-zz"), deferred(thread, "d-mm")]
    await conv.commit(thread, Commit(expected_version=3, deferred_removed=["d-zz", "d-mm"]))
    assert await state.deferred_inputs(thread) == []


async def test_deferred_input_message_round_trips(stores: StorePair) -> None:
    conv, state = stores
    thread = uid("t")
    message = InputMessage.tool_result(
        thread,
        ToolResult.text("", "Report from child thread: x"),
        synthetic={"type": "parent_message", "tool_call_id": "t"},
    )
    await conv.commit(thread, Commit(expected_version=0, deferred_added=[DeferredInput("d-1", message)]))
    [got] = await state.deferred_inputs(thread)
    assert got.message == message
    assert got.message.to_json() == message.to_json()


# ----------------------------------------------------------------------------------------------------------
# load_history_with_ancestors — worked examples: a child sees its ancestors' rows up to where it was spawned,
# then its own; a summary replaces the rows it covers wherever they are seen


@dataclass
class Tree:
    r: str
    c: str
    g: str


async def build_rcg(conv: ConversationStore) -> Tree:
    """R has r1..r10; C spawned when R had 6 rows has c1..c5; G spawned from C at 3 has g1, g2."""
    tree = Tree(uid("R"), uid("C"), uid("G"))
    await append(conv, tree.r, *[f"r{i}" for i in range(1, 7)])
    await conv.spawn_thread(tree.r, child_id=tree.c, spawn_tool_call_id="tc-c", kind=ThreadKind.CHILD)
    await append(conv, tree.r, *[f"r{i}" for i in range(7, 11)])
    await append(conv, tree.c, "c1", "c2", "c3")
    await conv.spawn_thread(tree.c, child_id=tree.g, spawn_tool_call_id="tc-g", kind=ThreadKind.CHILD)
    await append(conv, tree.c, "c4", "c5")
    await append(conv, tree.g, "g1", "g2")
    return tree


async def test_rcg_tree_records(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    c = await conv.get_thread(tree.c)
    g = await conv.get_thread(tree.g)
    assert c is not None and g is not None
    assert (c.spawn_order, c.root_id, c.tail) == (6, tree.r, 5)
    assert (g.spawn_order, g.root_id, g.tail) == (3, tree.r, 2)
    assert await ancestor_chain(conv, tree.g) == [AncestorLink(tree.r, 6), AncestorLink(tree.c, 3)]


async def test_rcg_without_summaries(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    loaded = await load_history_with_ancestors(conv, tree.g)
    assert [text_of(i) for i in loaded.items] == [
        "r1",
        "r2",
        "r3",
        "r4",
        "r5",
        "r6",
        "c1",
        "c2",
        "c3",
        "g1",
        "g2",
    ]
    assert loaded.orders == [None] * 9 + [1, 2]
    assert loaded.ancestor_prefix_len == 9
    assert loaded.compacted_up_to is None
    assert loaded.rows_read == 11

    root = await load_history_with_ancestors(conv, tree.r)
    assert [text_of(i) for i in root.items] == [f"r{i}" for i in range(1, 11)]
    assert root.orders == list(range(1, 11))
    assert (root.ancestor_prefix_len, root.compacted_up_to) == (0, None)

    child = await load_history_with_ancestors(conv, tree.c)
    assert [text_of(i) for i in child.items] == [
        *(f"r{i}" for i in range(1, 7)),
        "c1",
        "c2",
        "c3",
        "c4",
        "c5",
    ]
    assert child.orders == [None] * 6 + [1, 2, 3, 4, 5]
    assert child.ancestor_prefix_len == 6


async def test_rcg_with_root_summaries(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    await conv.save_summary(tree.r, Summary("S1", 4))
    await conv.save_summary(tree.r, Summary("S2", 8))

    loaded = await load_history_with_ancestors(conv, tree.g)
    # S2 lies beyond the cutoff 6 and is ignored; S1 covers r1..r4.
    assert loaded.items[0] == Summary("S1", 4)
    assert [text_of(i) for i in loaded.items] == ["summary:S1", "r5", "r6", "c1", "c2", "c3", "g1", "g2"]
    assert loaded.orders == [None] * 6 + [1, 2]
    assert loaded.ancestor_prefix_len == 6
    assert loaded.compacted_up_to is None

    # C inherits r1..r6 as well: S1 applies there too.
    child = await load_history_with_ancestors(conv, tree.c)
    assert [text_of(i) for i in child.items] == ["summary:S1", "r5", "r6", "c1", "c2", "c3", "c4", "c5"]
    assert child.ancestor_prefix_len == 3

    # R itself uses its own latest summary and nothing before it.
    root = await load_history_with_ancestors(conv, tree.r)
    assert root.items == [Summary("S2", 8), user("r9"), user("r10")]
    assert root.orders == [8, 9, 10]
    assert (root.compacted_up_to, root.ancestor_prefix_len) == (8, 0)


async def test_rcg_with_child_summary(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    await conv.save_summary(tree.r, Summary("S1", 4))
    await conv.save_summary(tree.r, Summary("S2", 8))
    await conv.save_summary(tree.c, Summary("SC", 2))

    loaded = await load_history_with_ancestors(conv, tree.g)
    assert [text_of(i) for i in loaded.items] == ["summary:SC", "c3", "g1", "g2"]
    assert loaded.orders == [None, None, 1, 2]
    assert loaded.ancestor_prefix_len == 2
    assert loaded.compacted_up_to is None

    # For C, SC is its own summary: ancestors are not loaded at all.
    child = await load_history_with_ancestors(conv, tree.c)
    assert [text_of(i) for i in child.items] == ["summary:SC", "c3", "c4", "c5"]
    assert child.orders == [2, 3, 4, 5]
    assert (child.compacted_up_to, child.ancestor_prefix_len) == (2, 0)


async def test_rcg_with_child_summary_beyond_cutoff_falls_back_to_root(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    await conv.save_summary(tree.r, Summary("S1", 4))
    await conv.save_summary(tree.c, Summary("SC late", 4))  # beyond G's cutoff 3 in C
    loaded = await load_history_with_ancestors(conv, tree.g)
    assert [text_of(i) for i in loaded.items] == ["summary:S1", "r5", "r6", "c1", "c2", "c3", "g1", "g2"]
    assert loaded.ancestor_prefix_len == 6


async def test_rcg_with_leaf_summary(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    await conv.save_summary(tree.r, Summary("S1", 4))
    await conv.save_summary(tree.r, Summary("S2", 8))
    await conv.save_summary(tree.c, Summary("SC", 2))
    await conv.save_summary(tree.g, Summary("SG", 1))

    loaded = await load_history_with_ancestors(conv, tree.g)
    assert loaded.items == [Summary("SG", 1), user("g2")]
    assert loaded.orders == [1, 2]
    assert loaded.compacted_up_to == 1
    assert loaded.ancestor_prefix_len == 0


async def test_leaf_summary_alone_skips_ancestors(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    await conv.save_summary(tree.g, Summary("SG", 2))
    loaded = await load_history_with_ancestors(conv, tree.g)
    assert loaded.items == [Summary("SG", 2)]
    assert loaded.orders == [2]
    assert (loaded.compacted_up_to, loaded.ancestor_prefix_len) == (2, 0)


async def test_explicit_chain_is_used(stores: StorePair) -> None:
    conv, _ = stores
    tree = await build_rcg(conv)
    chain = await ancestor_chain(conv, tree.g)
    assert await load_history_with_ancestors(conv, tree.g, chain) == await load_history_with_ancestors(
        conv, tree.g
    )


async def test_unknown_thread_loads_empty(stores: StorePair) -> None:
    conv, _ = stores
    thread = uid("t")
    loaded = await load_history_with_ancestors(conv, thread)
    assert (loaded.items, loaded.orders, loaded.compacted_up_to, loaded.ancestor_prefix_len) == (
        [],
        [],
        None,
        0,
    )
    assert await conv.get_thread(thread) is None


def spawn_call(call_id: str) -> ToolCallItem:
    return ToolCallItem(ToolCall(id=call_id, name="spawn_thread", arguments={"instructions": "do the thing"}))


async def test_a_child_thread_compacted_by_its_own_grandchild(stores: StorePair) -> None:
    """A child thread compacts through its own compaction grandchild (root → child → compaction): loading
    each works, and the summary applies to the child's rows only."""
    conv, _ = stores
    root, child, compactor = uid("root"), uid("child"), uid("compaction")
    spawn_id = uid("tc-spawn")
    await conv.commit(
        root,
        Commit(
            expected_version=0,
            rows=[
                (user("root message one"), "m1"),
                (AssistantText("root reply one"), "a2"),
                (user("root message two"), "m3"),
                (AssistantText("root reply two"), "a4"),
                (user("spawn a child"), "m5"),
                (spawn_call(spawn_id), "a6"),
            ],
        ),
    )
    await conv.spawn_thread(root, child_id=child, spawn_tool_call_id=spawn_id, kind=ThreadKind.CHILD)
    await conv.commit(
        root,
        Commit(
            expected_version=1,
            rows=[
                (
                    ToolResultItem(
                        ToolResult.text(spawn_id, f"Child thread is successfully spawned: {child}")
                    ),
                    "s7",
                ),
                (AssistantText("ok, child spawned"), "a8"),
            ],
        ),
    )
    async_call = ToolCallItem(ToolCall(id="tc-async", name="async_tool", arguments={}))
    await conv.commit(
        child,
        Commit(
            expected_version=0,
            rows=[
                (ToolResultItem(ToolResult.text(spawn_id, "You are now INSIDE the thread")), spawn_id),
                (AssistantText("child first response"), "c2"),
                (AssistantText("child follow-up"), "c3"),
                (async_call, "c4"),
            ],
        ),
    )
    info = await conv.get_thread(child)
    assert info is not None and info.spawn_order == 6

    await conv.spawn_thread(
        child,
        child_id=compactor,
        spawn_tool_call_id=uid("tc-compact"),
        kind=ThreadKind.COMPACTION,
        spawn_order=3,
    )
    begin = ToolCallItem(ToolCall(id="tc-begin", name="__harness_begin_compaction__", arguments={}))
    instructions = ToolResultItem(ToolResult.text("tc-begin", "You are now INSIDE a compaction thread."))
    await conv.commit(
        compactor, Commit(expected_version=0, rows=[(begin, "tc-begin-compaction-call"), (instructions, "i")])
    )
    assert await ancestor_chain(conv, compactor) == [AncestorLink(root, 6), AncestorLink(child, 3)]

    loaded = await load_history_with_ancestors(conv, compactor)
    assert [text_of(i) for i in loaded.items] == [
        "root message one",
        "root reply one",
        "root message two",
        "root reply two",
        "spawn a child",
        "call:spawn_thread",
        "result:You are now INSIDE the thread",
        "child first response",
        "child follow-up",
        "call:__harness_begin_compaction__",
        "result:You are now INSIDE a compaction thread.",
    ]
    assert loaded.ancestor_prefix_len == 9
    assert loaded.orders == [None] * 9 + [1, 2]
    assert loaded.compacted_up_to is None

    # The summary lands on the child; the child's next load starts with it and drops the ancestors.
    await conv.save_summary(child, Summary("child summary", 3))
    await conv.commit(
        child,
        Commit(
            expected_version=1,
            rows=[
                (ToolResultItem(ToolResult.text("tc-async", "async result")), "tc-async"),
                (AssistantText("processed tool result"), "c6"),
                (user("message after compaction"), "m7"),
            ],
        ),
    )
    after = await load_history_with_ancestors(conv, child)
    assert after.items[0] == Summary("child summary", 3)
    assert [text_of(i) for i in after.items[1:]] == [
        "call:async_tool",
        "result:async result",
        "processed tool result",
        "message after compaction",
    ]
    assert after.orders == [3, 4, 5, 6, 7]
    assert (after.compacted_up_to, after.ancestor_prefix_len) == (3, 0)

    # The compaction grandchild (spawned at C:3) still sees exactly what it inherited: the summary on C covers
    # up to 3 ≤ its cutoff, so it now starts from that summary.
    regrown = await load_history_with_ancestors(conv, compactor)
    assert regrown.items[0] == Summary("child summary", 3)
    assert regrown.ancestor_prefix_len == 1
