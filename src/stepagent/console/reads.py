"""What the console reads: a conversation (thread tree) with everything its page shows, the list of
conversations, and the cheap signature a page polls to know when to refresh.

All reads go through an open :class:`~stepagent.client.Client` (its stores, and its reader for the heads and
``LIVE`` items of a whole tree in one ``BatchGetItem``), so they work wherever the client does. Costs:

- a conversation page: the tree walk (one Query + one BatchGetItem per thread with children), every
  thread's rows (a paginated Query each) and summaries, its state items (open intents, pending choices,
  subscriptions, held inputs: a Query each; a tool's question to the user: one GetItem for a thread whose
  last call is still open), the usage records (a Query per thread) and the root's metadata;
- its poll (every second while the page is open): one ``BatchGetItem`` for the tree's heads and ``LIVE``
  items, threads as of the last page render (a new child moves its parent's head, which re-renders);
- the conversation list: one full Scan of the conversation table
  (:func:`~stepagent.stores.dynamodb.roots.scan_roots`), then, for the page shown, each tree's status and
  usage as above but reading only the last rows of each thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

from stepagent.client import Client
from stepagent.console.status import (
    StatusJson,
    StatusReport,
    ThreadFacts,
    pending_call,
    thread_status,
    tree_status,
)
from stepagent.core.elicitation import read_question
from stepagent.notices import LiveNotice, UnknownNotice, limit_text
from stepagent.stores.base import ThreadInfo
from stepagent.stores.dynamodb.io import DynamoItem
from stepagent.stores.dynamodb.layout import head_inbox, info_from_item
from stepagent.stores.dynamodb.live import LiveState, decode_live
from stepagent.stores.dynamodb.roots import RootSummary, scan_roots
from stepagent.transcript import Item, describe, thread_items
from stepagent.usage import TurnUsage, UsageReport, thread_usage, turn_usage

T = TypeVar("T")


class ChoiceView(TypedDict):
    """A question a tool of the thread waits for the user to answer."""

    thread_id: str
    choice_id: str
    prompt: str
    choices: list[str]
    default: int


class SubscriptionView(TypedDict):
    """An active subscription: the call that made it, and its tool and arguments when still listed."""

    tool_call_id: str
    name: str | None
    args: dict[str, Any] | None


class HeldInputView(TypedDict):
    """An input the thread holds until its turn is over."""

    message_id: str
    #: The synthetic input's content (a report, an event, ...), ``None`` for user input.
    synthetic: Any
    text: str


class QuestionView(TypedDict):
    """A tool's question to the user during its call (an MCP elicitation), as the state store keeps it:
    ``message`` and a form (``requested_schema``, a JSON Schema) or a page to open (``url``); ``answered``
    once an answer was taken (the call then goes on with it)."""

    thread_id: str
    tool_call_id: str
    tool: str
    message: str
    requested_schema: dict[str, Any] | None
    url: str | None
    answered: bool


class OAuthNoticeView(TypedDict):
    """A link a tool asks the user to open (``open`` while its call still waits); ``tool``: the tool's
    name when its call is in the thread."""

    kind: Literal["oauth"]
    auth_url: str | None
    tool_call_id: str | None
    open: bool
    tool: NotRequired[str]


class ErrorNoticeView(TypedDict):
    """A failure the thread reported."""

    kind: Literal["error"]
    text: str
    retrying: bool


NoticeView = OAuthNoticeView | ErrorNoticeView


class PartialView(TypedDict):
    """The live text of a running completion and what the model is doing."""

    phase: str | None
    tool: str | None
    text: str


class PollView(TypedDict):
    """The poll's answer: the page's signature and each streaming thread's partial text."""

    signature: str
    partials: dict[str, PartialView]


class ThreadJson(TypedDict):
    """One thread of a conversation in the JSON API."""

    thread_id: str
    parent_id: str | None
    kind: str
    closed: bool
    depth: int
    version: int
    status: StatusJson
    items: list[Item]
    choices: list[ChoiceView]
    questions: list[QuestionView]
    pending_calls: list[Item]
    held_inputs: list[HeldInputView]
    subscriptions: list[SubscriptionView]
    notices: list[NoticeView]
    partial: PartialView | None


class ConversationJson(TypedDict):
    """A conversation in the JSON API."""

    root_id: str
    exists: bool
    status: StatusJson
    signature: str
    metadata: Any
    usage: dict[str, Any] | None
    threads: list[ThreadJson]


class ConversationRowJson(TypedDict):
    """One row of the conversation list in the JSON API."""

    thread_id: str
    created_at: int | None
    closed: bool
    rows: int
    metadata: Any
    status: StatusJson | None
    usage: dict[str, Any] | None


class ConversationListJson(TypedDict):
    """One page of the conversation list in the JSON API."""

    conversations: list[ConversationRowJson]
    total: int
    complete: bool
    offset: int
    limit: int


#: Rows read from the end of each thread for the list's status (the pending call is among the last few).
STATUS_ROWS = 6
_CONCURRENCY = 8


async def _bounded(tasks: Iterable[Callable[[], Awaitable[T]]], limit: int = _CONCURRENCY) -> list[T]:
    gate = asyncio.Semaphore(limit)

    async def one(task: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await task()

    return list(await asyncio.gather(*(one(t) for t in tasks)))


@dataclass(slots=True)
class ThreadPage:
    """One thread of a conversation page."""

    info: ThreadInfo
    depth: int
    facts: ThreadFacts
    status: StatusReport
    items: list[Item] = field(default_factory=list)
    choices: list[ChoiceView] = field(default_factory=list)
    questions: list[QuestionView] = field(default_factory=list)
    pending_calls: list[Item] = field(default_factory=list)
    held_inputs: list[HeldInputView] = field(default_factory=list)
    subscriptions: list[SubscriptionView] = field(default_factory=list)
    notices: list[NoticeView] = field(default_factory=list)
    partial: PartialView | None = None

    @property
    def thread_id(self) -> str:
        return self.info.thread_id


@dataclass(slots=True)
class ConversationPage:
    """Everything a conversation's page shows: the thread tree, its status, usage and metadata."""

    #: False for a root with no commit yet (nothing stored; perhaps its first step is running).
    exists: bool
    root_id: str
    threads: list[ThreadPage]
    status: StatusReport
    usage: UsageReport | None
    metadata: Any
    signature: str
    #: What each turn spent (full pages only).
    turns: list[TurnUsage] = field(default_factory=list)

    def as_dict(self) -> ConversationJson:
        """The JSON API's shape of a conversation."""
        return {
            "root_id": self.root_id,
            "exists": self.exists,
            "status": self.status.as_dict(),
            "signature": self.signature,
            "metadata": self.metadata,
            "usage": self.usage.as_dict() if self.usage else None,
            "threads": [
                {
                    "thread_id": t.thread_id,
                    "parent_id": t.info.parent_id,
                    "kind": t.info.kind.value,
                    "closed": t.info.closed,
                    "depth": t.depth,
                    "version": t.info.version,
                    "status": t.status.as_dict(),
                    "items": t.items,
                    "choices": t.choices,
                    "questions": t.questions,
                    "pending_calls": t.pending_calls,
                    "held_inputs": t.held_inputs,
                    "subscriptions": t.subscriptions,
                    "notices": t.notices,
                    "partial": t.partial,
                }
                for t in self.threads
            ],
        }


async def thread_tree(client: Client, root_id: str) -> list[tuple[ThreadInfo, int]] | None:
    """``(thread, depth)`` of the tree, depth first in spawn order; ``None`` if the root does not exist."""
    conversation = client.conversation
    root = await conversation.get_thread(root_id)
    if root is None:
        return None
    out: list[tuple[ThreadInfo, int]] = []
    pending: list[tuple[ThreadInfo, int]] = [(root, 0)]
    while pending:
        info, depth = pending.pop(0)
        out.append((info, depth))
        pending[0:0] = [(child, depth + 1) for child in await conversation.children(info.thread_id)]
    return out


def signature(heads: dict[str, tuple[DynamoItem | None, DynamoItem | None]]) -> str:
    """What changes when the page must re-render: head versions, closed flags, inboxes, whether a
    completion streams, and the notices. (The partial text itself is updated in place.)"""
    parts = []
    for thread, (head, live_item) in sorted(heads.items()):
        info = info_from_item(head) if head else None
        live = decode_live(live_item)
        streaming = bool(info and live.partial_after(info.version))
        parts.append(
            [
                thread,
                info.version if info else -1,
                bool(info and info.closed),
                sorted(head_inbox(head)) if head else [],
                streaming,
                live.tool if streaming else None,
                live.notice_seq,
            ]
        )
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def partial_of(info: ThreadInfo | None, live: LiveState) -> PartialView | None:
    """The live partial text of a running completion, if it follows the current head."""
    current = (info is not None and live.partial_after(info.version)) or (
        (info is None or info.version == 0) and live.phase is not None
    )
    if not current:
        return None
    return {
        "phase": live.phase,
        "tool": live.tool,
        "text": live.text if live.offset == 0 else "…" + live.text,
    }


async def poll(client: Client, thread_ids: list[str]) -> PollView:
    """The poll: the signature of ``thread_ids`` and their partial texts (one BatchGetItem)."""
    heads = await client.reader.heads_and_live(thread_ids)
    partials: dict[str, PartialView] = {}
    for thread, (head, live_item) in heads.items():
        found = partial_of(info_from_item(head) if head else None, decode_live(live_item))
        if found is not None:
            partials[thread] = found
    return {"signature": signature(heads), "partials": partials}


async def conversation_page(
    client: Client, root_id: str, *, dead_letters: dict[str, int] | None = None, full: bool = True
) -> ConversationPage:
    """Everything the conversation page shows (``full=False``: only what the list needs — status from
    the last rows of each thread, usage, metadata). ``dead_letters``: per thread, messages in a DLQ."""
    tree = await thread_tree(client, root_id)
    exists = tree is not None
    if tree is None:
        # Not committed yet (or never): a page for it still shows its first completion as it streams.
        tree = [(ThreadInfo(thread_id=root_id, root_id=root_id), 0)]
    letters = dead_letters or {}
    state = client.state
    ids = [info.thread_id for info, _ in tree]
    heads = await client.reader.heads_and_live(ids)

    async def rows(info: ThreadInfo) -> list[Item]:
        if full:
            return [item async for item in thread_items(client.conversation, info.thread_id)]
        after = max(0, info.tail - STATUS_ROWS)
        return [
            describe(info.thread_id, row.order, row.item)
            async for row in client.conversation.load_rows(info.thread_id, after=after)
        ]

    async def one(pair: tuple[ThreadInfo, int]) -> ThreadPage:
        listed, depth = pair
        head, live_item = heads.get(listed.thread_id, (None, None))
        info = info_from_item(head) if head else listed
        live = decode_live(live_item)
        if head is None:
            empty = ThreadFacts(info.thread_id, None, live=live)
            page = ThreadPage(info, depth, empty, thread_status(empty))
            page.partial = partial_of(None, live)
            return page
        items, intents, choices, subscriptions, held = await asyncio.gather(
            rows(info),
            state.open_intents(info.thread_id),
            state.pending_choices(info.thread_id),
            state.active_subscriptions(info.thread_id),
            state.deferred_inputs(info.thread_id),
        )
        committed = [i for i in items if i.get("kind") != "summary"]
        last_open = pending_call(committed)
        questions = await _questions(client, info.thread_id, None if info.closed else last_open)
        facts = ThreadFacts(
            thread_id=info.thread_id,
            info=info,
            inbox=head_inbox(head) if head else frozenset(),
            live=live,
            open_intents=len(intents),
            choices=len(choices) + sum(1 for q in questions if not q["answered"]),
            subscriptions=len(subscriptions),
            held_inputs=len(held),
            pending_call=last_open,
            last_row_kind=committed[-1]["kind"] if committed else None,
            dead_letters=letters.get(info.thread_id, 0),
            approval=waiting_approval(committed),
        )
        page = ThreadPage(info, depth, facts, thread_status(facts))
        if not full:
            return page
        calls = {str(i["tool_call_id"]): i for i in committed if i.get("kind") == "tool_call"}
        answered = {str(i.get("tool_call_id")) for i in committed if i.get("kind") == "tool_result"}
        page.items = items
        # A closed thread waits for nothing (its last call, close_thread, never gets a result).
        page.pending_calls = [] if info.closed else [c for cid, c in calls.items() if cid not in answered]
        page.choices = [
            {
                "thread_id": info.thread_id,
                "choice_id": c.id,
                "prompt": c.prompt,
                "choices": list(c.choices),
                "default": c.default,
            }
            for c in choices
        ]
        page.questions = questions
        page.subscriptions = [_subscription(sub, calls.get(sub)) for sub in sorted(subscriptions)]
        page.held_inputs = [_held(d.message_id, d.message) for d in held]
        pending_ids = {str(c["tool_call_id"]) for c in page.pending_calls}
        names = {cid: str(c.get("name")) for cid, c in calls.items()}
        shown = (_notice(n, pending_ids, names) for n in live.notices[-5:])
        page.notices = [n for n in shown if n is not None]
        page.partial = partial_of(info, live)
        return page

    threads = await _bounded([lambda pair=pair: one(pair) for pair in tree])  # type: ignore[misc]
    usage, metadata, turns = await asyncio.gather(
        thread_usage(client.conversation, root_id),
        state.get_metadata(root_id),
        turn_usage(client.conversation, root_id) if full else asyncio.sleep(0, None),
    )
    return ConversationPage(
        exists=exists,
        root_id=root_id,
        threads=threads,
        status=tree_status(t.status for t in threads),
        usage=usage,
        metadata=metadata,
        signature=signature(heads),
        turns=turns or [],
    )


def waiting_approval(committed: list[Item]) -> str | None:
    """The tool name of the thread's last row when it is a call waiting for a person's decision."""
    last = committed[-1] if committed else None
    if last is not None and last.get("kind") == "tool_call" and last.get("approval") == "pending":
        return str(last.get("name"))
    return None


async def _questions(client: Client, thread_id: str, open_call: tuple[str, str] | None) -> list[QuestionView]:
    """The question a tool asks during the thread's open call, if it asks one (one GetItem)."""
    if open_call is None:
        return []
    name, call_id = open_call
    kept = await read_question(client.state, thread_id, call_id)
    if kept is None:
        return []
    notice = kept.notice
    schema = notice.get("requested_schema")
    url = notice.get("url")
    return [
        {
            "thread_id": thread_id,
            "tool_call_id": call_id,
            "tool": name,
            "message": str(notice.get("message", "")),
            "requested_schema": schema if isinstance(schema, dict) else None,
            "url": url if isinstance(url, str) else None,
            "answered": kept.answered_by is not None,
        }
    ]


def _subscription(call_id: str, call: Item | None) -> SubscriptionView:
    return {
        "tool_call_id": call_id,
        "name": None if call is None else call.get("name"),
        "args": None if call is None else call.get("args"),
    }


def _held(message_id: str, message: Any) -> HeldInputView:
    content = getattr(message, "content", None)
    text = getattr(content, "text", None)
    if text is None:
        text = (
            message.model_dump_json(exclude_none=True)
            if hasattr(message, "model_dump_json")
            else str(message)
        )
    return {"message_id": message_id, "synthetic": getattr(message, "synthetic", None), "text": str(text)}


def _notice(
    notice: LiveNotice, pending_ids: set[str], names: dict[str, str] | None = None
) -> NoticeView | None:
    """How the page shows a notice (``None``: not as a notice); ``names``: the thread's calls' tools."""
    if isinstance(notice, UnknownNotice):
        # A kind this console does not know, or a known one with fields it cannot read: shown as an error,
        # with the message it may carry, else its type (never an empty box).
        fields = notice.fields
        message = fields.get("message")
        return {
            "kind": "error",
            "text": message if isinstance(message, str) and message else f"[{notice.type} notice]",
            "retrying": fields.get("retrying") is True,
        }
    if notice["type"] == "oauth_required":
        view: OAuthNoticeView = {
            "kind": "oauth",
            "auth_url": notice["auth_url"],
            "tool_call_id": notice["tool_call_id"],
            "open": notice["tool_call_id"] in pending_ids,
        }
        if names and notice["tool_call_id"] in names:
            view["tool"] = names[notice["tool_call_id"]]
        return view
    if notice["type"] == "error":
        return {"kind": "error", "text": notice["message"], "retrying": notice["retrying"]}
    if notice["type"] == "input_required":
        return None  # asked inline from the state store's copy (the thread's ``questions``)
    return {"kind": "error", "text": limit_text(notice), "retrying": False}


@dataclass(slots=True)
class ConversationRow:
    """One row of the conversation list."""

    root: RootSummary
    metadata: Any = None
    status: StatusReport | None = None
    usage: UsageReport | None = None

    def as_dict(self) -> ConversationRowJson:
        return {
            "thread_id": self.root.thread_id,
            "created_at": self.root.created_at,
            "closed": self.root.closed,
            "rows": self.root.tail,
            "metadata": self.metadata,
            "status": self.status.as_dict() if self.status else None,
            "usage": self.usage.total.as_dict() if self.usage else None,
        }


@dataclass(slots=True)
class ConversationList:
    """One page of the conversation list; ``total`` counts every match, ``complete`` is false when the scan
    stopped before the end of the table."""

    rows: list[ConversationRow]
    total: int
    complete: bool
    offset: int
    limit: int

    def as_dict(self) -> ConversationListJson:
        return {
            "conversations": [r.as_dict() for r in self.rows],
            "total": self.total,
            "complete": self.complete,
            "offset": self.offset,
            "limit": self.limit,
        }


def matches(query: str, root: RootSummary, metadata: Any) -> bool:
    """Whether ``query`` (case-insensitive) is in the conversation's id or its metadata JSON."""
    needle = query.casefold()
    if needle in root.thread_id.casefold():
        return True
    return metadata is not None and needle in json.dumps(metadata, ensure_ascii=False).casefold()


async def conversation_list(
    client: Client,
    *,
    query: str = "",
    offset: int = 0,
    limit: int = 25,
    max_pages: int | None = None,
    dead_letters: dict[str, int] | None = None,
) -> ConversationList:
    """Root conversations, newest first, filtered by ``query`` (id or metadata), one page of them with
    status and usage. A query reads every root's metadata (one GetItem each)."""
    listing = await scan_roots(client.conversation, max_pages=max_pages)
    rows = [ConversationRow(root) for root in listing.roots]
    if query.strip():
        metadata = await _bounded(
            [lambda r=r: client.state.get_metadata(r.root.thread_id) for r in rows]  # type: ignore[misc]
        )
        for row, meta in zip(rows, metadata, strict=True):
            row.metadata = meta
        rows = [r for r in rows if matches(query.strip(), r.root, r.metadata)]
    shown = rows[offset : offset + limit]

    async def fill(row: ConversationRow) -> None:
        page = await conversation_page(client, row.root.thread_id, dead_letters=dead_letters, full=False)
        row.status, row.usage, row.metadata = page.status, page.usage, page.metadata

    await _bounded([lambda r=r: fill(r) for r in shown])  # type: ignore[misc]
    return ConversationList(shown, len(rows), listing.complete, offset, limit)
