"""Following a thread tree in the stores: new items, live progress, and when the tree is idle.

Everything is read from the conversation and state tables with strongly consistent reads; nothing is
consumed from the shared output queue. One poll is one ``BatchGetItem`` (the ``HEAD`` of every open
thread of the tree and its ``LIVE`` item; one more for the children it finds, so their rows come in the
same poll); rows, children and pending choices are read only for a thread whose head version moved. The
items of one poll are put in causal order across threads (:mod:`stepagent.client.interleave`).

**Idle**, the end of :meth:`TreeWatch.replies`: every message the client is waiting for has been
processed, and every thread of the tree is settled —

- an open thread: its last commit said the turn is complete (``turn_complete``: no open call, no held
  input, no compaction about to start; a thread with rows but no flag, e.g. imported, counts as complete;
  a child that has not processed its seed does not) and its ``inbox`` is empty (no message from another
  thread on its way or waiting);
- a closed thread: no dispatch of its still in progress (its last call may be sending its parent a report);

- an open thread whose last commit left a tool call waiting for a person's decision (it waits on nobody
  but the person, who is told by the call's item with ``approval: "pending"``);
- an open thread whose tool asked the person a question (an ``input`` item) and whose head has not moved
  since (the answer, the result or an interruption moves it);

— seen the same in two consecutive polls (same head versions), so a change that lands between the reads of
one poll cannot make a busy tree look idle. A non-retrying ``error`` notice that names an awaited
message id (it was rejected, or given up on) ends the wait for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from stepagent.client.interleave import interleave
from stepagent.history_items import ApprovalItem, ToolCallItem, ToolResultItem
from stepagent.notices import UnknownNotice
from stepagent.stores.base import ThreadInfo
from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore
from stepagent.stores.dynamodb.io import DynamoIo, DynamoItem, item_key
from stepagent.stores.dynamodb.layout import HEAD_SK, head_inbox, info_from_item
from stepagent.stores.dynamodb.live import LIVE_SK, LiveState, decode_live
from stepagent.transcript import Item, choice_item, describe, describe_row, notice_item

Cursor = dict[str, int]


@dataclass(slots=True)
class WatchedThread:
    """What a watch knows of one thread."""

    info: ThreadInfo | None = None
    inbox: frozenset[str] = frozenset()
    live: LiveState = field(default_factory=LiveState)
    listed_at: int = -1  # the head version at which rows, children and choices were last read
    closed_settled: bool = False
    notice_seq: int | None = None  # notices already reported (None: set from the first read)
    partial: tuple[str | None, str, str | None] | None = None  # the last partial reported: phase, text, tool
    choices: set[str] = field(default_factory=set)
    pending_calls: dict[str, str] = field(default_factory=dict)  # unanswered tool call id -> tool name
    waiting_approval: set[str] = field(default_factory=set)  # calls waiting for a person's decision
    #: Calls whose tool asked the person a question, with the head version the question was seen at: the
    #: thread waits on the person until its head moves again (an answer, a result, an interruption).
    waiting_input: dict[str, int] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        info = self.info
        if info is None:
            return True  # never created (nothing was sent to it)
        if info.closed:
            return self.closed_settled
        if self.inbox or self.listed_at != info.version:
            return False
        if info.turn_complete is None:
            return info.tail > 0  # imported or older data: nothing says it is working
        asks = any(version == info.version for version in self.waiting_input.values())
        return info.turn_complete or bool(self.waiting_approval) or asks


class StoreReader:
    """The reads a watch makes, on one pair of DynamoDB stores."""

    def __init__(self, conversation: DynamoConversationStore, state: DynamoStateStore, io: DynamoIo) -> None:
        self.conversation = conversation
        self.state = state
        self.io = io
        self.conversation_table = conversation.table
        self.state_table = state.table

    async def heads_and_live(
        self, thread_ids: Iterable[str]
    ) -> dict[str, tuple[DynamoItem | None, DynamoItem | None]]:
        """``{thread: (HEAD item, LIVE item)}``: one consistent ``BatchGetItem`` per 50 threads (the I/O
        module's batch read: 100 keys a request, ``UnprocessedKeys`` sent again)."""
        ids = list(dict.fromkeys(thread_ids))
        found: dict[str, tuple[DynamoItem | None, DynamoItem | None]] = {t: (None, None) for t in ids}
        keys = [
            pair
            for t in ids
            for pair in (
                (self.conversation_table, item_key(t, HEAD_SK)),
                (self.state_table, item_key(t, LIVE_SK)),
            )
        ]
        for items in (await self.io.batch_get_many(keys)).values():
            for item in items:
                thread = str(item["pk"]["S"])
                head, live = found[thread]
                found[thread] = (item, live) if item["sk"]["S"] == HEAD_SK else (head, item)
        return found


class TreeWatch:
    """Polls one thread tree: yields its new items and ends when it is idle (see the module docstring)."""

    def __init__(
        self,
        reader: StoreReader,
        root: str,
        cursor: Cursor,
        *,
        awaited: set[str] | None = None,
        partial: bool = False,
        notice_seq: dict[str, int] | None = None,
        awaited_in: set[tuple[str, str]] | None = None,
        announced: set[tuple[str, str]] | None = None,
    ) -> None:
        self.reader = reader
        self.root = root
        #: ``(thread, message id)`` awaited in a descendant (a person's decision on a child's call).
        self.awaited_in = awaited_in if awaited_in is not None else set()
        self._awaited_in_checked: dict[str, int] = {}
        #: ``(thread, call id)`` of waiting calls already shown to this watch's caller (not shown again).
        self.announced = announced if announced is not None else set()
        #: Per thread, the last order reported; threads not in it are reported from their first row.
        self.cursor = cursor
        self.awaited = awaited if awaited is not None else set()
        self.partial = partial
        self.threads: dict[str, WatchedThread] = {root: WatchedThread()}
        for thread, seq in (notice_seq or {}).items():
            self.threads.setdefault(thread, WatchedThread()).notice_seq = seq
        self._last_signature: tuple[Any, ...] | None = None
        self._awaited_checked_at: int | None = None

    # ---- one poll ---------------------------------------------------------------------------------------

    async def poll(self) -> tuple[list[Item], bool]:
        """One round of reads: the new items, and whether the tree is idle (twice in a row)."""
        out: list[Item] = []
        watched = [t for t, view in self.threads.items() if not view.closed_settled]
        polled: set[str] = set()
        while watched:  # children found in this poll are read in it too: their lines come in order
            read = await self.reader.heads_and_live(watched)
            for thread in watched:
                head, live_item = read[thread]
                view = self.threads[thread]
                view.info = info_from_item(head) if head else None
                view.inbox = head_inbox(head) if head else frozenset()
                view.live = decode_live(live_item)
            for thread in watched:
                view = self.threads[thread]
                if view.info is not None and view.listed_at != view.info.version:
                    out.extend(await self._catch_up(thread, view))
                out.extend(self._notices(thread, view))
                if self.partial:
                    out.extend(self._partial(thread, view))
                if view.info is not None and view.info.closed and not view.closed_settled:
                    view.closed_settled = not await self.reader.state.open_intents(thread)
            polled.update(watched)
            watched = [t for t, view in self.threads.items() if t not in polled and not view.closed_settled]
        parents = {t: v.info.parent_id if v.info is not None else None for t, v in self.threads.items()}
        out = interleave(out, parents, self.root)
        root = self.threads[self.root].info
        root_version = root.version if root is not None else 0
        if self.awaited and root_version != self._awaited_checked_at:
            # Processed markers land with a commit, which moves the head: no need to look before that.
            done = await self.reader.state.filter_processed(self.root, sorted(self.awaited))
            self.awaited -= done
            self._awaited_checked_at = root_version
        for waiting_thread in sorted({t for t, _ in self.awaited_in}):
            known = self.threads.get(waiting_thread)
            version = known.info.version if known is not None and known.info is not None else 0
            if self._awaited_in_checked.get(waiting_thread) == version:
                continue
            ids = sorted(m for t, m in self.awaited_in if t == waiting_thread)
            done = await self.reader.state.filter_processed(waiting_thread, ids)
            self.awaited_in -= {(waiting_thread, m) for m in done}
            self._awaited_in_checked[waiting_thread] = version
        idle = (
            not self.awaited and not self.awaited_in and all(view.settled for view in self.threads.values())
        )
        signature = tuple(
            (t, v.info.version if v.info else 0, v.info.closed if v.info else False)
            for t, v in sorted(self.threads.items())
        )
        confirmed = idle and signature == self._last_signature
        self._last_signature = signature if idle else None
        return out, confirmed

    @property
    def looks_idle(self) -> bool:
        """Whether the last poll saw the tree idle (the next one confirms it)."""
        return self._last_signature is not None

    async def _catch_up(self, thread: str, view: WatchedThread) -> list[Item]:
        """New rows, new children and pending choices of a thread whose head moved."""
        assert view.info is not None
        version = view.info.version
        out: list[Item] = []
        after = self.cursor.get(thread, 0)
        if view.listed_at < 0 and 0 < view.info.tail <= after:
            # Watching from the tail: a call already waiting for a person must still be shown to them.
            tail = view.info.tail  # only the last row this head covers (later ones are read below)
            async for row in self.reader.conversation.load_rows(thread, after=tail - 1, up_to=tail):
                if isinstance(row.item, ToolCallItem) and row.item.needs_approval:
                    view.waiting_approval.add(row.item.call.id)
                    if (thread, row.item.call.id) not in self.announced:
                        self.announced.add((thread, row.item.call.id))
                        out.append(describe(thread, row.order, row.item))
        if view.info.tail > after:
            async for row in self.reader.conversation.load_rows(thread, after=after):
                item = describe_row(thread, row)
                if isinstance(row.item, ToolCallItem):
                    view.pending_calls[row.item.call.id] = row.item.call.name
                    if row.item.needs_approval:
                        view.waiting_approval.add(row.item.call.id)
                        self.announced.add((thread, row.item.call.id))
                elif isinstance(row.item, ToolResultItem):
                    view.pending_calls.pop(row.item.result.id, None)
                    view.waiting_approval.discard(row.item.result.id)
                elif isinstance(row.item, ApprovalItem):
                    view.waiting_approval.discard(row.item.tool_call_id)
                out.append(item)
                self.cursor[thread] = row.order
        for child in await self.reader.conversation.children(thread):
            if child.thread_id not in self.threads:
                self.threads[child.thread_id] = WatchedThread(notice_seq=0)
        choices = await self.reader.state.pending_choices(thread)
        for choice in choices:
            if choice.id not in view.choices:
                view.choices.add(choice.id)
                out.append(choice_item(thread, choice))
        view.choices &= {choice.id for choice in choices}
        view.listed_at = version
        return out

    def _notices(self, thread: str, view: WatchedThread) -> list[Item]:
        live = view.live
        if view.notice_seq is None:
            view.notice_seq = live.notice_seq  # notices from before this watch began are old news
            return []
        out: list[Item] = []
        for notice in live.new_notices(view.notice_seq):
            if isinstance(notice, UnknownNotice):
                if notice.type == "error":
                    # An error whose fields do not read as they should is still an error: shown with
                    # what can be read, and a waited-for message it names is still over.
                    self._error(thread, notice.fields.get("message"), notice.fields.get("retrying"), out)
                continue  # any other kind: one this client does not know how to show
            if notice["type"] == "input_required":
                view.waiting_input[notice["tool_call_id"]] = view.info.version if view.info else 0
            item = notice_item(thread, notice)
            if item is not None:
                out.append(item)
                self._end_wait(item)
        view.notice_seq = live.notice_seq
        return out

    def _error(self, thread: str, message: object, retrying: object, out: list[Item]) -> None:
        """An ``error`` item; a failure that will not be retried ends the wait for a message it names."""
        text = message if isinstance(message, str) else ""
        again = retrying is True
        item: Item = {"thread_id": thread, "kind": "error", "text": text, "retrying": again}
        out.append(item)
        self._end_wait(item)

    def _end_wait(self, item: Item) -> None:
        """A failure that will not be retried ends the wait for a message it names."""
        text = item.get("text", "")
        if item["kind"] == "error" and not item.get("retrying") and text:
            self.awaited -= {m for m in self.awaited if m in text}

    def _partial(self, thread: str, view: WatchedThread) -> list[Item]:
        live = view.live
        current = view.info is not None and live.partial_after(view.info.version)
        if view.info is None and live.version == 0 and live.phase is not None:
            current = True  # the thread's very first step (no head yet)
        state = (live.phase, live.text, live.tool) if current else (None, "", None)
        if state == (view.partial or (None, "", None)):
            return []
        view.partial = state
        phase, text, tool = state
        after = view.info.tail if view.info is not None else 0
        return [
            {
                "thread_id": thread,
                "kind": "partial",
                "after": after,
                "phase": phase,
                "tool": tool,
                "text": (text if live.offset == 0 else "…" + text) if phase else "",
            }
        ]

    # ---- the loop -----------------------------------------------------------------------------------------

    async def replies(
        self, *, interval: float, follow: bool = False, limit: float | None = None
    ) -> AsyncIterator[Item]:
        """Poll every ``interval`` seconds; end when idle (unless ``follow``); ``TimeoutError`` after
        ``limit`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        was_idle = False
        while True:
            items, idle = await self.poll()
            for item in items:
                yield item
            if idle and not follow:
                return
            if idle and not was_idle:
                # Following: say when the tree goes quiet (a person's prompt, a script's cue).
                yield {"thread_id": self.root, "kind": "idle"}
            was_idle = idle or (was_idle and self.looks_idle and not items)
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(self._busy_reason(limit))
            await asyncio.sleep(interval)

    def _busy_reason(self, limit: float | None) -> str:
        if self.awaited:
            return f"thread {self.root} has not processed message(s) {', '.join(sorted(self.awaited))} after {limit:.0f} s"
        working = [t for t, v in self.threads.items() if not v.settled]
        return f"thread {self.root} was still working after {limit:.0f} s (busy: {', '.join(working)})"

    def running(self) -> list[tuple[str, str]]:
        """``(thread, tool name)`` of every tool call of the tree that is still waiting for its result."""
        return [
            (t, name)
            for t, view in self.threads.items()
            for call, name in view.pending_calls.items()
            if call not in view.waiting_approval
        ]

    def waiting_for_approval(self) -> list[tuple[str, str]]:
        """``(thread, tool call id)`` of every call of the tree waiting for a person's decision."""
        return [(t, call) for t, view in self.threads.items() for call in sorted(view.waiting_approval)]
