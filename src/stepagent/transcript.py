"""The stored transcript of a thread tree, as ``stepagent history`` shows it.

Each item has ``thread_id``, ``kind`` (``user``, ``assistant``, ``reasoning``, ``tool_call``,
``tool_result``, ``event``, ``summary``), ``order`` (its position in the thread's own log — the number
``rewind --to`` takes; a summary carries the order it covers) and ``text`` where it has text. A child lists
its own items only, never the prefix it inherited. Rows are streamed; memory stays bounded by two rows.
:class:`Item` declares the shape (every key, and each kind there is, replies' notices included), so the
type checker follows an item from where it is built to everything that reads it.

A call that waited for a person's decision carries ``approval``: ``pending`` while it waits, else
``approved``, ``edited`` (its ``args`` are then the edited ones), ``rejected`` or ``responded``; the
decision rows themselves are not listed (their orders are skipped). A waiting call that user text
interrupted was never decided and carries no ``approval``.

What a step refused or gave up on is kept with the thread (its usage record) and listed after the row
that step left last (``order`` is that row's): ``error`` (``text``, ``retrying: false``, and the
``tool_call_id`` of a refused decision) and ``limit`` (``text``: the limit that stopped the agent).

One rendering of items as text lines serves every place that shows them (``stepagent history``, the
terminal chat, ``tail``, the test helper's transcript): :func:`item_glyph_text` gives an item's glyph and
content — ``>`` model text, ``⚙`` a tool call, ``←`` its result, ``✉`` a report or event, ``?`` a
question, ``🔑`` a link to open, ``!`` an error, ``⏹`` a limit, ``✔``/``✎``/``✗``/``↩`` a person's
decision — and :func:`item_line` puts who said it in front; :func:`format_transcript` lays out the lines of
``stepagent history``, under one header per thread.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, NotRequired, TypedDict
from urllib.parse import urlsplit

from stepagent.history_items import (
    APPROVAL_STATES,
    ApprovalItem,
    ApprovalState,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import ApprovalDecisionKind, UserChoiceRequired
from stepagent.notices import Notice, limit_text
from stepagent.output_schema import OUTPUT_CHECK_ID
from stepagent.outputs.build import record_notices
from stepagent.stores.base import ConversationStore, StoredRow, tree_threads

#: What an item is: the stored kinds ``history`` lists, then the notices only replies carry (a question
#: to answer, a link to open, a limit, an error, live partial text, and the tree going quiet).
ItemKind = Literal[
    "user",
    "assistant",
    "reasoning",
    "tool_call",
    "tool_result",
    "event",
    "summary",
    "approval",
    "choice",
    "oauth",
    "input",
    "limit",
    "error",
    "partial",
    "idle",
]


class Item(TypedDict):
    """One item of a thread tree's transcript or replies (the ``stepagent history --json`` shape;
    ``stepagent.client.Item`` is this type). Only ``thread_id`` and ``kind`` are always there; which other
    keys an item has depends on its kind (see the module docstring and the client's ``replies``)."""

    thread_id: str
    kind: ItemKind
    #: Position in the thread's own log (stored kinds; a summary carries the order it covers).
    order: NotRequired[int]
    text: NotRequired[str]
    #: ``tool_call``: the tool and its arguments (the model's JSON; an ``edited`` call's are the edited
    #: ones); ``approval``: the edited arguments.
    name: NotRequired[str]
    args: NotRequired[dict[str, Any]]
    #: The call a ``tool_call``, ``tool_result``, ``event``, ``approval`` or ``oauth`` item is about.
    tool_call_id: NotRequired[str]
    #: ``approval``: the person's decision.
    decision: NotRequired[ApprovalDecisionKind]
    #: ``tool_call`` that waited for a person, and ``approval``: where the decision left the call.
    approval: NotRequired[ApprovalState]
    #: ``choice``: a tool's question, answered with ``answer_choice``.
    choice_id: NotRequired[str]
    prompt: NotRequired[str]
    choices: NotRequired[list[str]]
    default: NotRequired[int]
    #: ``oauth``: the link to open.
    auth_url: NotRequired[str]
    #: ``input``: a tool's question during call ``tool_call_id`` (``text``), answered with
    #: ``answer_input``: the form to fill (a JSON Schema) or the page to open.
    requested_schema: NotRequired[dict[str, Any]]
    url: NotRequired[str]
    #: ``error``: whether the failed input will be tried again.
    retrying: NotRequired[bool]
    #: ``partial`` (from the stores): the order the text follows, what the model is doing (``thinking``,
    #: ``writing``, ``calling`` a ``tool``, ``retrying``; ``None`` once it is over).
    after: NotRequired[int]
    phase: NotRequired[str | None]
    tool: NotRequired[str | None]
    #: ``partial`` (over the HTTP API): the text streamed since the last one.
    delta: NotRequired[str]
    #: ``user``: the runtime's feedback on an answer that did not match the output schema (the model saw it
    #: as a user message; nobody typed it).
    output_check: NotRequired[bool]


def describe(thread_id: str, order: int, item: HistoryItem) -> Item:
    """One transcript item for a stored row."""
    out: Item
    match item:
        case UserItem():
            text = item.text if item.text is not None else f"[{item.content.type}]"
            out = {"thread_id": thread_id, "order": order, "kind": "user", "text": text}
        case AssistantText(text=text):
            out = {"thread_id": thread_id, "order": order, "kind": "assistant", "text": text}
        case Reasoning(text=text):
            out = {"thread_id": thread_id, "order": order, "kind": "reasoning", "text": text}
        case ToolCallItem(call=call):
            out = {
                "thread_id": thread_id,
                "order": order,
                "kind": "tool_call",
                "name": call.name,
                "args": call.arguments,
                "tool_call_id": call.id,
            }
            if item.needs_approval:
                out["approval"] = "pending"
        case ToolResultItem(result=result):
            out = {
                "thread_id": thread_id,
                "order": order,
                "kind": "tool_result",
                "tool_call_id": result.id,
                "text": result.joined_text(),
            }
        case EventItem(result=result, tool_call_id=original):
            out = {
                "thread_id": thread_id,
                "order": order,
                "kind": "event",
                "tool_call_id": original,
                "text": result.joined_text(),
            }
        case ApprovalItem(tool_call_id=call_id, decision=decision):
            out = {
                "thread_id": thread_id,
                "order": order,
                "kind": "approval",
                "tool_call_id": call_id,
                "decision": decision,
                "approval": APPROVAL_STATES[decision],
            }
            if item.args is not None:
                out["args"] = item.args
            if item.message is not None:
                out["text"] = item.message
        case Summary(text=text):
            # Summaries are stored apart from the rows and never reach this function from a store
            # (``thread_items`` lists each one after the last row it covers); the case keeps the match
            # total over ``HistoryItem`` for the type checker, with ``order`` as given.
            out = {"thread_id": thread_id, "order": order, "kind": "summary", "text": text}
    return out


def settle(call: Item, following: HistoryItem) -> None:
    """Give the described waiting ``call`` the state the row after it decides: a decision on it, or (any
    other row, e.g. an interruption) no state at all."""
    if isinstance(following, ApprovalItem) and following.tool_call_id == call.get("tool_call_id"):
        call["approval"] = APPROVAL_STATES[following.decision]
        if following.decision == "edit" and following.args is not None:
            call["args"] = following.args
    else:
        call.pop("approval", None)


def choice_item(thread_id: str, choice: UserChoiceRequired) -> Item:
    """The ``choice`` item of a question a tool of ``thread_id`` is waiting for the user to answer."""
    return {
        "thread_id": thread_id,
        "kind": "choice",
        "choice_id": choice.id,
        "prompt": choice.prompt,
        "choices": list(choice.choices),
        "default": choice.default,
    }


def describe_row(thread_id: str, row: StoredRow) -> Item:
    """:func:`describe` for a stored row, marking the output-schema feedback among user rows (by its row id,
    :data:`stepagent.output_schema.OUTPUT_CHECK_ID`)."""
    out = describe(thread_id, row.order, row.item)
    if out["kind"] == "user" and OUTPUT_CHECK_ID in row.message_id:
        out["output_check"] = True
    return out


def notice_item(thread_id: str, notice: Notice, order: int | None = None) -> Item | None:
    """The item of a notice: ``error`` (``text``, ``retrying``, the ``tool_call_id`` a refused decision
    named), ``limit`` (``text``), ``oauth`` (the link), ``input`` (a tool's question); ``order``: the row it follows, for a notice kept
    in the thread's history."""
    item: Item
    if notice["type"] == "error":
        item = {
            "thread_id": thread_id,
            "kind": "error",
            "text": notice["message"],
            "retrying": notice["retrying"],
        }
        if "tool_call_id" in notice:
            item["tool_call_id"] = notice["tool_call_id"]
    elif notice["type"] == "oauth_required":
        item = {
            "thread_id": thread_id,
            "kind": "oauth",
            "tool_call_id": notice["tool_call_id"],
            "auth_url": notice["auth_url"],
        }
    elif notice["type"] == "input_required":
        item = {
            "thread_id": thread_id,
            "kind": "input",
            "tool_call_id": notice["tool_call_id"],
            "text": notice["message"],
        }
        if "url" in notice:
            item["url"] = notice["url"]
        if "requested_schema" in notice:
            item["requested_schema"] = notice["requested_schema"]
    else:
        item = {"thread_id": thread_id, "kind": "limit", "text": limit_text(notice)}
    if order is not None:
        item["order"] = order
    return item


async def _kept_notices(store: ConversationStore, thread_id: str) -> list[tuple[int, Item]]:
    """The notices the thread's steps kept (refusals, answers given up on, limit stops), each with the
    row it follows."""
    found: list[tuple[int, Item]] = []
    async for record in store.usage_records(thread_id):
        for notice in record_notices(thread_id, record):
            tail = record.tail if record.tail is not None else 0
            item = notice_item(thread_id, notice, tail)
            if item is not None:
                found.append((tail, item))
    return found


async def thread_items(store: ConversationStore, thread_id: str) -> AsyncIterator[Item]:
    """The thread's own rows, with each compaction summary after the last row it covers and each kept
    notice after the row its step left last."""
    summaries = await _summaries(store, thread_id)
    notices = await _kept_notices(store, thread_id)
    held: list[Item] = []  # a waiting call (first) and what follows it until the next row
    while notices and notices[0][0] <= 0:
        yield notices.pop(0)[1]
    async for row in store.load_rows(thread_id):
        if held:
            settle(held[0], row.item)
            for out in held:
                yield out
            held = []
        if not isinstance(row.item, ApprovalItem):
            described = describe_row(thread_id, row)
            if "approval" in described:
                held.append(described)
            else:
                yield described
        while summaries and summaries[0][0] == row.order:
            order, text = summaries.pop(0)
            summary: Item = {"thread_id": thread_id, "kind": "summary", "order": order, "text": text}
            if held:
                held.append(summary)
            else:
                yield summary
        while notices and notices[0][0] <= row.order:
            # A refusal leaves a waiting call waiting: it is listed after the call, which stays pending.
            if held:
                held.append(notices.pop(0)[1])
            else:
                yield notices.pop(0)[1]
    for out in held:
        yield out
    # Notices left over follow rows a rewind dropped: they went with them.


async def _summaries(store: ConversationStore, thread_id: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    bound: int | None = None
    while (summary := await store.latest_summary(thread_id, bound)) is not None:
        found.append((summary.up_to_order, summary.text))
        if summary.up_to_order <= 0:
            break
        bound = summary.up_to_order - 1
    return sorted(found)


async def tree_items(store: ConversationStore, root_id: str) -> AsyncIterator[Item]:
    """The thread's transcript, then each descendant's (depth first, in spawn order)."""
    async for thread_id in tree_threads(store, root_id):
        async for item in thread_items(store, thread_id):
            yield item


def clip(text: str, limit: int = 300) -> str:
    """``text`` on one line (white space folded), cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_VERDICTS = {"approved": "✔ approved", "edited": "✎ edited", "rejected": "✗ rejected"}


def item_glyph_text(item: Item, *, limit: int | None = 300) -> str | None:
    """An item's glyph and content (``None`` for kinds that are not lines: user text, whose line depends on
    who reads it, reasoning, summaries, partial text, idle markers). Results, events and decision messages
    are put on one line and cut to ``limit`` characters (``None``: shown whole, as stored)."""
    kind = item.get("kind")
    text = str(item.get("text", ""))
    shown = text if limit is None else clip(text, limit)
    if kind == "assistant":
        return f"> {text}"
    if kind == "user" and item.get("output_check"):
        return f"↻ output check: {shown}"
    if kind == "tool_call":
        args = json.dumps(item.get("args") or {}, ensure_ascii=False)
        return f"⚙ {item.get('name')}({'' if args == '{}' else args})"
    if kind == "approval":
        line = f"{_VERDICTS.get(str(item.get('approval')), '↩ answered')} {item.get('tool_call_id')}"
        if item.get("approval") == "edited":
            line += " → " + json.dumps(item.get("args") or {}, ensure_ascii=False)
        return line + (f": {shown}" if text else "")
    if kind == "tool_result":
        return f"← {shown}"
    if kind == "event":
        return f"✉ {shown}"
    if kind == "error":
        return f"! {text}" + (" (retrying)" if item.get("retrying") else "")
    if kind == "limit":
        return f"⏹ {text}"
    if kind == "oauth":
        return sign_in_text(item.get("auth_url"))
    if kind == "choice":
        choices = ", ".join(f"{i}: {c}" for i, c in enumerate(item.get("choices", [])))
        return f"? {item.get('prompt')} [{choices}]"
    if kind == "input":
        url = item.get("url")
        return f"? {text}" + (f" (open {url})" if url else "")
    return None


def sign_in_text(url: object) -> str:
    """The one line of a sign-in link: ``🔑 authorise at <url>`` for an http(s) URL written in printable
    characters; anything else (another scheme, a line break or terminal escape in it) is quoted with its
    characters escaped and a warning, so a link can neither run as something else nor break the line."""
    text = str(url or "")
    try:
        parts = urlsplit(text)
    except ValueError:
        parts = None
    clean = text.isprintable() and " " not in text
    if parts is not None and parts.scheme in ("http", "https") and parts.netloc and clean:
        return f"🔑 authorise at {text}"
    quoted = json.dumps(text)  # escapes line breaks and control characters: one inert line
    return (
        f"🔑 a tool asks you to sign in, but its link is not a plain http(s) URL (not shown as one): {quoted}"
    )


def item_line(item: Item, root: str) -> str | None:
    """The line of a reply item as a conversation shows it, prefixed by who said it (``agent`` for the
    root thread, ``[child <id>]`` for a child); ``None``: nothing to show."""
    thread = str(item.get("thread_id", ""))
    who = "agent" if thread == root else f"[child {thread[:8]}]"
    if item.get("kind") == "user" and not item.get("output_check"):
        text = item.get("text", "")
        return f"{who} · user: {text}" if thread != root else f"user > {text}"
    body = item_glyph_text(item)
    return None if body is None else f"{who} {body}"


#: How ``history`` marks a call that waited for a person (the chat's marks for the decision).
APPROVAL_MARKS = {
    "pending": "⏸ waiting for a decision",
    "approved": "✔ approved",
    "edited": "✎ edited (the arguments shown are the person's)",
    "rejected": "✗ rejected",
    "responded": "↩ responded",
}


def format_transcript(
    items: Sequence[Item], *, root_id: str, closed: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """Human-readable transcript lines under one header per thread (marked root and/or closed): each item
    by its order, with the glyphs the chat shows (:func:`item_glyph_text`), whole."""
    lines: list[str] = []
    current: str | None = None
    for item in items:
        thread = item["thread_id"]
        if thread != current:
            current = thread
            marks = [m for m, on in (("root", thread == root_id), ("closed", thread in closed)) if on]
            lines.append(f"── thread {thread}" + (f" ({', '.join(marks)})" if marks else ""))
        body = item_glyph_text(item, limit=None) or f"{item['kind']}: {item.get('text', '')}"
        if "approval" in item:
            body += f"  {APPROVAL_MARKS.get(str(item['approval']), item['approval'])}"
        lines.append(f"{item['order']:>4} {body}")
    return lines
