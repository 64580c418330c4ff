"""Shared builders for the lifecycle tests: a realistic thread tree written through the store ports, and
helpers to compare transcripts modulo thread ids."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from stepagent.history_items import (
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.lifecycle import export_lines
from stepagent.messages import (
    InputMessage,
    TextBlock,
    TextContent,
    ThreadReport,
    ToolCall,
    ToolResult,
    UserChoiceRequired,
)
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    DeferredInput,
    DispatchIntent,
    StateStore,
    ThreadKind,
)
from stepagent.transcript import tree_items

BIG = 5_000_000


def uid(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def call(call_id: str, name: str = "lookup", **arguments: Any) -> ToolCallItem:
    return ToolCallItem(ToolCall(id=call_id, name=name, arguments=arguments))


def result(call_id: str, text: str) -> ToolResultItem:
    return ToolResultItem(ToolResult(id=call_id, content=[TextBlock(text=text)]))


async def commit(conv: ConversationStore, thread: str, *items: tuple[HistoryItem, str], **extra: Any) -> None:
    info = await conv.get_thread(thread)
    await conv.commit(thread, Commit(expected_version=info.version if info else 0, rows=list(items), **extra))


async def build_tree(conv: ConversationStore, state: StateStore, *, big: bool = False) -> dict[str, str]:
    """A root with a spawned child (which has a grandchild), a closed event child, a compaction summary,
    an event row naming its child, a subscription, an open intent, a deferred report, a pending choice,
    metadata and (``big``) a 5 MB tool result. Returns the thread ids by role."""
    root = uid("root")
    child_id, grandchild_id, event_child_id = uid("child"), uid("grand"), uid("event")
    payload = ("x" * BIG + " ünïcode end") if big else "small result"
    await commit(
        conv,
        root,
        (user("hello"), "m1"),
        (AssistantText("let me spawn"), "c1"),
        (call("sp-1", "spawn_thread", instructions="do it", child_of=[root]), "c2"),
        indexed_calls=[ToolCall(id="sp-1", name="spawn_thread")],
        processed_message_ids=["m1"],
        metadata=(root, {"user": "ann", "n": 1}),
    )
    await conv.spawn_thread(root, child_id=child_id, spawn_tool_call_id="sp-1", kind=ThreadKind.CHILD)
    await commit(
        conv,
        root,
        (result("sp-1", f"spawned {child_id}"), "sp-1-sync-result"),
        (Reasoning("thinking", signature="sig"), "c3"),
        (call("big-1", "fetch", url="https://example.com"), "c4"),
        (result("big-1", payload), "big-1"),
        (call("sub-1", "subscribe", topic="news"), "c5"),
        (result("sub-1", "subscribed"), "sub-1"),
        subscriptions_added=["sub-1"],
        answered_tool_calls=["sp-1", "big-1", "sub-1"],
    )
    report = ToolResult.text("ev-1", "Report from child thread: done")
    invocation = ToolCall(
        id="ev-1", name="receive_event__injected", arguments={"original_tool_call_id": "sp-1"}
    )
    await commit(
        conv,
        root,
        (
            EventItem(result=report, tool_call_id="sp-1", child_thread_id=child_id, invocation=invocation),
            "rp-1",
        ),
        (AssistantText("thanks"), "c6"),
        (user("and now?"), "m2"),
        (call("pending-1", "remote_tool", q="later"), "c7"),
        intents_added=[DispatchIntent("pending-1", "remote_tool", {"q": "later"})],
        deferred_added=[
            DeferredInput(
                "rp-2",
                InputMessage.tool_result(
                    root,
                    ToolResult.text("", "second report"),
                    synthetic=ThreadReport(tool_call_id="sp-1", child_thread_id=child_id),
                ),
            )
        ],
    )
    await conv.save_summary(root, Summary(text="the story so far", up_to_order=5))
    await commit(
        conv,
        child_id,
        (result("sp-1", f"You are INSIDE {child_id}"), "sp-1"),
        (call("sp-2", "spawn_thread", instructions="deeper", child_of=[root, child_id]), "k1"),
        (result("sp-2", "spawned grandchild"), "sp-2-sync-result"),
    )
    await conv.spawn_thread(
        child_id, child_id=grandchild_id, spawn_tool_call_id="sp-2", kind=ThreadKind.CHILD, spawn_order=2
    )
    await commit(
        conv, grandchild_id, (result("sp-2", "inside grandchild"), "sp-2"), (AssistantText("ok"), "g1")
    )
    choice = UserChoiceRequired(id="ch-1", prompt="which?", choices=["a", "b"], response_url="https://x/r")
    await state.add_pending_choice(child_id, choice)
    await conv.spawn_thread(
        root,
        child_id=event_child_id,
        spawn_tool_call_id="sub-1",
        kind=ThreadKind.SUBSCRIPTION_EVENT,
        spawn_order=8,
    )
    await commit(
        conv, event_child_id, (call("ev-spawn", "spawn_thread"), "e1"), (result("ev-spawn", "seed"), "e2")
    )
    await conv.close_thread(event_child_id)
    return {"root": root, "child": child_id, "grandchild": grandchild_id, "event": event_child_id}


async def transcript(conv: ConversationStore, root: str) -> list[dict[str, Any]]:
    return [item async for item in tree_items(conv, root)]


def rename(items: list[dict[str, Any]], ids: dict[str, str]) -> list[dict[str, Any]]:
    """``items`` with every ``thread_id`` replaced through ``ids``."""
    return [{**item, "thread_id": ids.get(item["thread_id"], item["thread_id"])} for item in items]


async def export_to(conv: ConversationStore, state: StateStore, thread: str, path: Path) -> Path:
    with path.open("w", encoding="utf-8") as out:
        async for line in export_lines(conv, state, thread):
            out.write(line + "\n")
    return path
