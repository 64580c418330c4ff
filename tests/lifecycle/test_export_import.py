"""Export → import round trips, id rewriting, restore, and the import's validation (in-memory stores)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepagent.history_items import EventItem
from stepagent.ids import derived_id
from stepagent.lifecycle import ImportFormatError, ImportLimits, LifecycleError, export_lines, import_tree
from stepagent.messages import ThreadReport
from stepagent.stores.base import ThreadKind
from stepagent.stores.memory import memory_stores
from tests.lifecycle import build_tree, commit, export_to, rename, transcript, uid, user

Lines = list[dict[str, Any]]


def mapping(ids: dict[str, str], new_root: str) -> dict[str, str]:
    return {ids["root"]: new_root} | {
        v: derived_id("import", new_root, v) for k, v in ids.items() if k != "root"
    }


async def test_round_trip_as_a_new_root_copies_history_state_and_tree(tmp_path: Path) -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")

    result = await import_tree(conv, state, path, new_root="copy")
    assert (result.root_thread_id, result.threads, result.rows, result.replaced) == ("copy", 4, 20, 0)
    new = mapping(ids, "copy")
    assert await transcript(conv, "copy") == rename(await transcript(conv, ids["root"]), new)

    # Thread records: fresh ids, references rewritten, spawn data and flags kept.
    child = await conv.get_thread(new[ids["child"]])
    assert child is not None and (child.root_id, child.parent_id, child.spawn_order) == ("copy", "copy", 3)
    grandchild = await conv.get_thread(new[ids["grandchild"]])
    assert grandchild is not None and grandchild.parent_id == new[ids["child"]]
    event = await conv.get_thread(new[ids["event"]])
    assert event is not None and event.closed and event.kind == ThreadKind.SUBSCRIPTION_EVENT
    root = await conv.get_thread("copy")
    assert root is not None and root.parent_id is None and root.tail == 13

    # Event rows and deferred reports name the copied child, not the original.
    rows = [row async for row in conv.load_rows("copy")]
    event_row = rows[9].item
    assert isinstance(event_row, EventItem) and event_row.child_thread_id == new[ids["child"]]
    [deferred] = await state.deferred_inputs("copy")
    assert deferred.message.group_id == "copy"
    assert isinstance(deferred.message.synthetic, ThreadReport)
    assert deferred.message.synthetic.child_thread_id == new[ids["child"]]

    # State: metadata under the new root, intents, subscriptions, choices; the call index is rebuilt.
    assert await state.get_metadata("copy") == {"user": "ann", "n": 1}
    assert [i.tool_call_id for i in await state.open_intents("copy")] == ["pending-1"]
    assert await state.active_subscriptions("copy") == {"sub-1"}
    assert [c.id for c in await state.pending_choices(new[ids["child"]])] == ["ch-1"]
    assert (await state.indexed_call("copy", "sp-1")) is not None
    assert (await state.indexed_call("copy", "sub-1")) is not None
    assert (await state.indexed_call(new[ids["child"]], "sp-2")) is not None

    # Exporting the copy gives the same file, modulo the id fields; ids inside texts and tool-call
    # arguments are deliberately left alone (they are the model's words).
    again = await export_to(conv, state, "copy", tmp_path / "copy.jsonl")
    original = [relabel(json.loads(line), new) for line in path.read_text().splitlines()]
    assert [json.loads(line) for line in again.read_text().splitlines()] == original
    assert ids["root"] in again.read_text()  # e.g. spawn_thread(child_of=[<original root>])


ID_FIELDS = {"thread_id", "root_id", "parent_id", "child_thread_id", "group_id", "root_thread_id"}


def relabel(value: Any, ids: dict[str, str]) -> Any:
    """``value`` with the thread-id fields (only those) mapped through ``ids``."""
    if isinstance(value, dict):
        return {
            k: ids.get(v, v) if k in ID_FIELDS and isinstance(v, str) else relabel(v, ids)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [relabel(v, ids) for v in value]
    return value


async def test_export_is_deterministic_and_ends_with_totals() -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    first = [line async for line in export_lines(conv, state, ids["root"])]
    second = [line async for line in export_lines(conv, state, ids["root"])]
    assert first == second
    assert json.loads(first[0]) == {
        "type": "header",
        "format": "stepagent-export",
        "version": 1,
        "root_thread_id": ids["root"],
    }
    assert json.loads(first[-1]) == {"type": "end", "threads": 4, "rows": 20}
    with pytest.raises(LifecycleError, match="no thread"):
        [line async for line in export_lines(conv, state, uid("missing"))]


async def test_exporting_a_child_exports_its_subtree_and_imports_as_a_root(tmp_path: Path) -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    path = await export_to(conv, state, ids["child"], tmp_path / "child.jsonl")
    result = await import_tree(conv, state, path, new_root="solo")
    assert result.threads == 2
    solo = await conv.get_thread("solo")
    assert solo is not None and solo.parent_id is None and solo.root_id == "solo" and solo.tail == 3
    assert await state.get_metadata("solo") == {"user": "ann", "n": 1}  # the original root's metadata
    new = {ids["child"]: "solo", ids["grandchild"]: derived_id("import", "solo", ids["grandchild"])}
    assert await transcript(conv, "solo") == rename(await transcript(conv, ids["child"]), new)


async def test_import_refuses_existing_targets_and_restores_with_replace(tmp_path: Path) -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    before = await transcript(conv, ids["root"])
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")
    with pytest.raises(LifecycleError, match="already exists"):
        await import_tree(conv, state, path)

    # The tree moves on: more rows, a new child, an extra intent, a rewound child.
    await commit(conv, ids["root"], (user("later"), "m9"))
    await conv.spawn_thread(ids["root"], child_id="late-child", spawn_tool_call_id="x", kind=ThreadKind.CHILD)
    await commit(conv, ids["child"], (user("child later"), "k9"))
    result = await import_tree(conv, state, path, replace_existing=True)
    assert result.replaced == 4 and result.closed == ["late-child"]
    assert await transcript(conv, ids["root"]) == before
    late = await conv.get_thread("late-child")
    assert late is not None and late.closed
    # A commit after the restore continues the restored history.
    info = await conv.get_thread(ids["root"])
    assert info is not None and info.tail == 13
    await commit(conv, ids["root"], (user("after restore"), "m10"))
    root_items = [i for i in await transcript(conv, ids["root"]) if i["thread_id"] == ids["root"]]
    assert root_items[-1] == {"thread_id": ids["root"], "order": 14, "kind": "user", "text": "after restore"}


async def test_a_collision_with_another_tree_is_refused_before_writing(tmp_path: Path) -> None:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")
    other_conv, other_state = memory_stores()
    await commit(other_conv, ids["child"], (user("unrelated"), "u1"))  # same id, a root elsewhere
    with pytest.raises(LifecycleError, match="another tree"):
        await import_tree(other_conv, other_state, path)
    assert await other_conv.get_thread(ids["root"]) is None


# ---- validation ------------------------------------------------------------------------------------------


async def valid_lines() -> Lines:
    conv, state = memory_stores()
    ids = await build_tree(conv, state)
    return [json.loads(line) async for line in export_lines(conv, state, ids["root"])]


def index_of(lines: Lines, line_type: str, nth: int = 0, /, **match: Any) -> int:
    found = [
        i
        for i, line in enumerate(lines)
        if line["type"] == line_type and all(line.get(k) == v for k, v in match.items())
    ]
    return found[nth]


def drop(line_type: str, nth: int = 0, /) -> Callable[[Lines], None]:
    return lambda lines: lines.pop(index_of(lines, line_type, nth)) and None


def edit(line_type: str, nth: int = 0, /, **changes: Any) -> Callable[[Lines], None]:
    return lambda lines: lines[index_of(lines, line_type, nth)].update(changes)


def row_order(order: int, thread_nth: int = 0) -> Callable[[Lines], None]:
    def change(lines: Lines) -> None:
        thread = lines[index_of(lines, "thread", thread_nth)]["thread_id"]
        lines[index_of(lines, "row", 0, thread_id=thread, order=2)]["order"] = order

    return change


def swap_child_before_parent(lines: Lines) -> None:
    grand = index_of(lines, "thread", 2)
    section = lines[grand : grand + 3]
    del lines[grand : grand + 3]
    child = index_of(lines, "thread", 1)
    lines[child:child] = section


def duplicate_result(lines: Lines) -> None:
    at = index_of(lines, "row", 0, order=4)  # the root's result for sp-1
    lines[at + 1]["item"] = lines[at]["item"]


def orphan_result(lines: Lines) -> None:
    lines[index_of(lines, "row", 0, order=7)]["item"]["result"]["id"] = "nobody"


def unknown_event_child(lines: Lines) -> None:
    lines[index_of(lines, "row", 0, order=10)]["item"]["child_thread_id"] = "ghost"


BAD: dict[str, tuple[Callable[[Lines], None], str]] = {
    "version": (
        edit("header", version=2),
        "written by a newer stepagent \\(format v2; this release reads up to v1\\)",
    ),
    "format": (edit("header", format="other"), "not a stepagent-export file"),
    "missing end": (drop("end"), "without an end line"),
    "end totals": (edit("end", rows=3), "end line says 3 rows"),
    "order gap": (row_order(3), "row order 3, expected 2"),
    "order type": (row_order("2"), "row order '2', expected 2"),  # type: ignore[arg-type]
    "missing last row": (drop("row", 12), "declares 13 rows, has 12"),
    "missing row": (drop("row", 4), "row order 6, expected 5"),
    "child before parent": (swap_child_before_parent, "must come earlier in the file"),
    "second answer": (duplicate_result, "a second result for 'sp-1'"),
    "orphan result": (orphan_result, "result for 'nobody', which has no open call"),
    "unknown event child": (unknown_event_child, "names child thread 'ghost'"),
    "bad item": (edit("row", 2, item={"v": 1, "kind": "weird"}), "unknown kind 'weird'"),
    "summary past rows": (edit("summary", up_to_order=99), "covers order 99"),
    "unknown field": (edit("row", extra=1), "unknown fields \\['extra'\\]"),
    "bad kind": (edit("thread", 1, kind="nope"), "unknown thread kind 'nope'"),
    "bad intent": (edit("intent", arguments=[1]), "arguments must be an object"),
    "bad deferred": (edit("deferred", message={"content": 1}), "deferred line"),
    "state after rows": (
        lambda lines: lines.insert(index_of(lines, "row", 3), lines.pop(index_of(lines, "intent"))),
        "before summaries and rows",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_a_bad_line_refuses_the_whole_import_naming_the_line(tmp_path: Path, case: str) -> None:
    lines = await valid_lines()
    change, message = BAD[case]
    change(lines)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    conv, state = memory_stores()
    with pytest.raises(ImportFormatError, match=f"^line [0-9]+: .*{message}") as raised:
        await import_tree(conv, state, path, new_root="copy")
    assert 1 <= raised.value.line <= len(lines) + 1
    assert conv.backend.threads == {} and conv.backend.staged == {}  # nothing was written


async def test_line_numbers_point_at_the_bad_line(tmp_path: Path) -> None:
    lines = await valid_lines()
    at = index_of(lines, "row", 5)
    text = [json.dumps(line) for line in lines]
    text[at] = text[at][:-5]  # truncated JSON
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(ImportFormatError, match=f"^line {at + 1}: not valid JSON"):
        await import_tree(*memory_stores(), path)


async def test_limits_and_unreadable_input(tmp_path: Path) -> None:
    lines = await valid_lines()
    path = tmp_path / "tree.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ImportFormatError, match="more rows than the row limit"):
        await import_tree(*memory_stores(), path, limits=ImportLimits(max_rows=5))
    with pytest.raises(ImportFormatError, match="longer than the limit of 200 bytes"):
        await import_tree(*memory_stores(), path, limits=ImportLimits(max_line_bytes=200))
    with pytest.raises(ImportFormatError, match="more threads than the thread limit"):
        await import_tree(*memory_stores(), path, limits=ImportLimits(max_threads=2))
    with pytest.raises(LifecycleError, match="cannot read"):
        await import_tree(*memory_stores(), tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ImportFormatError, match=r"^line 1: the file is empty"):
        await import_tree(*memory_stores(), tmp_path / "empty.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(ImportFormatError, match=r"^line 1: not UTF-8"):
        await import_tree(*memory_stores(), tmp_path / "binary.jsonl")
