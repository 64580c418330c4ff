"""The console's HTML, rendered on the server (pure functions of what :mod:`~stepagent.console.reads` read).

Every piece of text that comes from a user, a model, a tool or the stores goes through :func:`e`
(``html.escape`` with quotes), and links from notices are kept only when they are ``http(s)`` URLs, so
nothing stored in a conversation can inject markup or script. Forms that change something carry the
process's CSRF token.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from stepagent.aws.dlq import DeadLetter
from stepagent.console.reads import ConversationList, ConversationPage, ThreadPage
from stepagent.console.status import StatusReport

Item = dict[str, Any]


def e(value: object) -> str:
    """Escape text for HTML (element content and quoted attribute values)."""
    return html.escape("" if value is None else str(value), quote=True)


def safe_url(url: object) -> str | None:
    """``url`` if it is an absolute http(s) URL (a notice's link), else ``None``."""
    text = str(url or "")
    try:
        parts = urlsplit(text)
    except ValueError:
        return None
    return text if parts.scheme in ("http", "https") and parts.netloc else None


def path(*segments: str, **query: object) -> str:
    """A URL path with each segment percent-encoded, and a query string."""
    out = "/" + "/".join(quote(s, safe="") for s in segments)
    wanted = {k: v for k, v in query.items() if v not in (None, "")}
    return out + ("?" + urlencode(wanted) if wanted else "")


def layout(title: str, body: str, *, header: str, csrf: str, notice: str | None = None) -> str:
    """A whole HTML page: ``body`` in the console's frame. ``header`` is trusted markup and is not escaped;
    ``notice`` is shown as a flash message."""
    flash = f'<p class="flash">{e(notice)}</p>' if notice else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)} · stepagent console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{e(csrf)}">
<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/console.css"></head>
<body><header><a class="brand" href="/">stepagent console</a><span class="target">{header}</span>
<nav><a href="/">Conversations</a><a href="/dlq">Dead letters</a></nav></header>
<main>{flash}{body}</main><script src="/static/console.js"></script></body></html>"""


def badge(status: StatusReport | None) -> str:
    """A status as a badge (its label, its detail as the tooltip); ``?`` when the status is unknown."""
    if status is None:
        return '<span class="status">?</span>'
    detail = f' title="{e(status.detail)}"' if status.detail else ""
    return f'<span class="status status-{e(status.status.value)}"{detail}>{e(status.label)}</span>'


def csrf_field(csrf: str) -> str:
    """The hidden form field that carries the CSRF token."""
    return f'<input type="hidden" name="csrf" value="{e(csrf)}">'


def _when(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_ms / 1000))


def _dollars(cost: float) -> str:
    """A conversation's cost as people read it: cents for most, more digits below a cent."""
    return f"${cost:,.2f}" if cost >= 0.01 else f"${cost:.4f}"


# ---- the list ----------------------------------------------------------------------------------------------


def conversations_page(listing: ConversationList, query: str) -> str:
    """The conversation list: one table row per conversation, with pager links and a warning when the scan
    stopped early."""
    rows = []
    for row in listing.rows:
        usage = row.usage.total if row.usage else None
        tokens = f"{usage.input_tokens:,} in / {usage.output_tokens:,} out" if usage else "—"
        if usage is not None and usage.cost_usd is not None:
            tokens += f" · {_dollars(usage.cost_usd)}"
        meta = json.dumps(row.metadata, ensure_ascii=False) if row.metadata not in (None, {}) else ""
        rows.append(
            f'<tr data-thread-id="{e(row.root.thread_id)}"><td><a href="{e(path("c", row.root.thread_id))}">'
            f"{e(row.root.thread_id)}</a></td><td>{badge(row.status)}"
            f'<span class="detail">{e(row.status.detail if row.status else "")}</span></td>'
            f"<td>{e(_when(row.root.created_at))}</td><td>{row.root.tail}</td><td>{e(tokens)}</td>"
            f'<td class="meta">{e(meta)}</td></tr>'
        )
    table = (
        '<table class="list"><thead><tr><th>conversation</th><th>status</th><th>created</th><th>rows</th>'
        "<th>tokens</th><th>metadata</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        if rows
        else '<p class="empty">No conversations' + (" match." if query else " yet.") + "</p>"
    )
    pager = []
    if listing.offset > 0:
        pager.append(
            f'<a href="{e(path("", q=query, offset=max(0, listing.offset - listing.limit)))}">newer</a>'
        )
    if listing.offset + listing.limit < listing.total:
        pager.append(f'<a href="{e(path("", q=query, offset=listing.offset + listing.limit))}">older</a>')
    shown = f"{listing.offset + 1}-{listing.offset + len(listing.rows)} of {listing.total}" if rows else ""
    incomplete = (
        '<p class="warn">The scan stopped before the end of the table: older conversations are missing.</p>'
        if not listing.complete
        else ""
    )
    return f"""<h1>Conversations</h1>
<form class="search" method="get" action="/"><input type="search" name="q" value="{e(query)}"
 placeholder="search by id or metadata"><button>Search</button></form>
<form class="open" method="get" action="/open"><input name="thread" placeholder="conversation id (empty: a new one)">
<button>Open or start a conversation</button></form>
{incomplete}{table}<p class="pager">{e(shown)} {" ".join(pager)}</p>
<p class="hint">Newest first. The list scans the whole conversation table (no index of conversations).</p>"""


# ---- one conversation -----------------------------------------------------------------------------------


def conversation_page(page: ConversationPage, csrf: str) -> str:
    """A conversation's page: its live fragment (re-rendered on change), export links and the send form."""
    root = page.root_id
    threads = [t for t in page.threads if not t.info.closed]
    options = "".join(
        f'<option value="{e(t.thread_id)}">{e(_thread_label(t, root))}</option>' for t in threads
    )
    return f"""<h1>Conversation <code>{e(root)}</code></h1>
<p class="toolbar"><a href="{e(path("c", root, "export"))}" download>Export (JSON lines)</a>
<a href="{e(path("api", "c", root))}">JSON</a></p>
<div id="live" data-root="{e(root)}" data-signature="{e(page.signature)}">{conversation_fragment(page, csrf)}</div>
<form id="send" class="send" method="post" action="{e(path("c", root, "send"))}" data-ajax>
{csrf_field(csrf)}<label>to <select name="thread">{options}</select></label>
<textarea name="text" rows="2" required placeholder="message"></textarea><button>Send</button></form>"""


def _thread_label(thread: ThreadPage, root: str) -> str:
    if thread.thread_id == root:
        return f"{thread.thread_id} (root)"
    return f"{'  ' * thread.depth}{thread.thread_id} ({thread.info.kind.value})"


def conversation_fragment(page: ConversationPage, csrf: str) -> str:
    """The part of the page that is re-rendered whenever the conversation changes."""
    usage = page.usage.total if page.usage else None
    tokens = (
        f"{usage.input_tokens:,} input · {usage.output_tokens:,} output · "
        f"{usage.cache_read_tokens:,} cache read · {usage.cache_write_tokens:,} cache write tokens · "
        f"{usage.completions} model call(s)"
        + (f" · {_dollars(usage.cost_usd)}" if usage.cost_usd is not None else "")
        if usage
        else ""
    )
    meta = (
        f'<p class="meta">metadata <code>{e(json.dumps(page.metadata, ensure_ascii=False))}</code></p>'
        if page.metadata not in (None, {})
        else ""
    )
    summary = (
        f'<p class="summary">{badge(page.status)} <span class="detail">{e(page.status.detail)}'
        f"{' (thread ' + e(page.status.thread_id) + ')' if page.status.thread_id not in ('', page.root_id) else ''}"
        f'</span> <span class="usage">{e(tokens)}</span></p>{meta}'
    )
    return summary + _tree(page) + "".join(_thread(t, page.root_id, csrf) for t in page.threads)


def _tree(page: ConversationPage) -> str:
    """The thread tree as nested lists (the threads come depth first, with their depths)."""
    out = ['<nav class="tree"><h2>Threads</h2>']
    previous = -1
    for thread in page.threads:
        if thread.depth > previous:
            out.append("<ul>" * (thread.depth - previous))
        else:
            out.append("</li>" + "</ul></li>" * (previous - thread.depth))
        kind = "root" if thread.thread_id == page.root_id else thread.info.kind.value
        closed = " closed" if thread.info.closed else ""
        out.append(
            f'<li class="node{closed}" data-node="{e(thread.thread_id)}"><a href="#t-{e(thread.thread_id)}">'
            f'{e(thread.thread_id)}</a> <span class="kind">{e(kind)}</span> {badge(thread.status)}'
        )
        previous = thread.depth
    if previous >= 0:
        out.append("</li>" + "</ul></li>" * previous + "</ul>")
    out.append("</nav>")
    return "".join(out)


def _thread(thread: ThreadPage, root: str, csrf: str) -> str:
    tid = thread.thread_id
    parts = [
        f'<section class="thread" id="t-{e(tid)}" data-thread-id="{e(tid)}" data-closed="{str(thread.info.closed).lower()}">',
        f"<h2>{'Root thread' if tid == root else e(thread.info.kind.value.replace('_', ' ').capitalize() + ' thread')} "
        f"<code>{e(tid)}</code> {badge(thread.status)}"
        + (' <span class="kind">closed</span>' if thread.info.closed else "")
        + "</h2>",
    ]
    if thread.info.parent_id:
        parts.append(
            f'<p class="parent">child of <a href="#t-{e(thread.info.parent_id)}">{e(thread.info.parent_id)}</a></p>'
        )
    parts.append(_waiting(thread, csrf, root))
    parts.append('<ol class="items">')
    parts.extend(_item(item, root) for item in thread.items)
    parts.append("</ol>")
    partial = thread.partial
    hidden = "" if partial else " hidden"
    text = e(partial["text"]) if partial else ""
    phase = e(_phase(partial)) if partial else ""
    parts.append(
        f'<div class="partial"{hidden} data-partial="{e(tid)}"><span class="phase">{phase}</span>'
        f'<div class="text">{text}</div></div>'
    )
    parts.append("</section>")
    return "".join(parts)


def _phase(partial: Item) -> str:
    phase = str(partial.get("phase") or "")
    return f"{phase} {partial['tool']}" if partial.get("tool") else phase


def _waiting(thread: ThreadPage, csrf: str, root: str) -> str:
    """Pending calls, questions, links, held inputs, subscriptions and timers of a thread."""
    out: list[str] = []
    for choice in thread.choices:
        buttons = "".join(
            f'<button name="selected" value="{i}"{" class=default" if i == choice["default"] else ""}>{e(text)}</button>'
            for i, text in enumerate(choice["choices"])
        )
        out.append(
            f'<form class="choice" method="post" action="{e(path("c", root, "choice"))}" data-ajax>'
            f"{csrf_field(csrf)}"
            f'<input type="hidden" name="thread" value="{e(thread.thread_id)}">'
            f'<input type="hidden" name="choice_id" value="{e(choice["choice_id"])}">'
            f'<p class="prompt">{e(choice["prompt"])}</p>{buttons}</form>'
        )
    for notice in thread.notices:
        if notice["kind"] == "oauth":
            url = safe_url(notice["auth_url"])
            link = (
                f'<a class="oauth" href="{e(url)}" target="_blank" rel="noopener noreferrer">open the sign-in link</a>'
                if url
                else f"(refused a link that is not http(s): <code>{e(notice['auth_url'])}</code>)"
            )
            if notice["open"]:
                out.append(
                    f'<p class="notice oauth">sign-in needed: a tool waits for you to authorise it: {link}</p>'
                )
            else:
                out.append(
                    f'<p class="notice oauth done">a tool asked for a sign-in (it has answered since): {link}</p>'
                )
        elif notice["kind"] == "error":
            out.append(
                f'<p class="notice error">error: {e(notice["text"])}'
                + (" (retrying)" if notice["retrying"] else "")
                + "</p>"
            )
    for call in thread.pending_calls:
        if call.get("approval") == "pending" and not thread.info.closed:
            out.append(_approval_form(call, thread.thread_id, csrf, root))
            continue
        label = "timer" if thread.status.status.value == "timer" else "pending call"
        out.append(
            f'<p class="pending">{label}: <code>{e(call["name"])}</code> '
            f'<code class="args">{e(json.dumps(call.get("args"), ensure_ascii=False))}</code></p>'
        )
    for held in thread.held_inputs:
        out.append(
            f'<p class="held">held input ({e(held["synthetic"] or "message")}): {e(_short(held["text"]))}</p>'
        )
    for sub in thread.subscriptions:
        out.append(
            f'<p class="subscription">subscription <code>{e(sub["name"] or sub["tool_call_id"])}</code> '
            f'<code class="args">{e(json.dumps(sub.get("args"), ensure_ascii=False))}</code></p>'
        )
    return f'<div class="waiting">{"".join(out)}</div>' if out else ""


def _approval_form(call: Item, thread_id: str, csrf: str, root: str) -> str:
    """The decision form of a call that waits for a person: approve, edit (the arguments, as JSON),
    reject (with an optional message) or respond (the message is the call's result)."""
    args = json.dumps(call.get("args"), ensure_ascii=False, indent=1)
    return (
        f'<form class="approval" method="post" action="{e(path("c", root, "approval"))}" data-ajax>'
        f"{csrf_field(csrf)}"
        f'<input type="hidden" name="thread" value="{e(thread_id)}">'
        f'<input type="hidden" name="tool_call_id" value="{e(call["tool_call_id"])}">'
        f'<p class="prompt">⏸ <code>{e(call["name"])}</code> waits for your approval</p>'
        f'<label>arguments <textarea name="args" rows="4">{e(args)}</textarea></label>'
        f'<label>message <input name="message" placeholder="why (reject) or the answer (respond)"></label>'
        '<button name="decision" value="approve" class="default">approve</button>'
        '<button name="decision" value="edit">run with these arguments</button>'
        '<button name="decision" value="reject">reject</button>'
        '<button name="decision" value="respond">respond instead</button>'
        "</form>"
    )


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _item(item: Item, root: str) -> str:
    kind = str(item.get("kind"))
    order = item.get("order")
    thread = str(item["thread_id"])
    text = e(item.get("text", ""))
    if kind == "user":
        body = f'<span class="who">user</span><div class="text">{text}</div>'
    elif kind == "assistant":
        body = f'<span class="who">assistant</span><div class="text">{text}</div>'
    elif kind == "reasoning":
        body = f'<details><summary class="who">reasoning</summary><div class="text">{text}</div></details>'
    elif kind == "tool_call":
        args = e(json.dumps(item.get("args"), ensure_ascii=False, indent=1))
        body = (
            f'<span class="who">tool call</span> <code class="tool">{e(item.get("name"))}</code>'
            f'<pre class="args">{args}</pre>'
        )
    elif kind == "tool_result":
        body = f'<details open><summary class="who">tool result</summary><pre class="text">{text}</pre></details>'
    elif kind == "event":
        body = f'<span class="who">event / report</span><div class="text">{text}</div>'
    elif kind == "summary":
        body = f'<details><summary class="who">compaction summary (up to {e(order)})</summary><div class="text">{text}</div></details>'
    else:
        body = f'<span class="who">{e(kind)}</span><div class="text">{text}</div>'
    rewind = (
        f' <a class="rewind" href="{e(path("c", root, "rewind", thread=thread, order=order))}" title="drop everything after this">rewind here</a>'
        if kind != "summary" and order is not None
        else ""
    )
    return f'<li class="item {e(kind)}" data-order="{e(order)}"><span class="order">{e(order)}</span>{body}{rewind}</li>'


def rewind_confirm(
    root: str, thread: str, requested: int, effective: int, dropped: Iterable[Item], version: int, csrf: str
) -> str:
    """The confirmation page of a rewind: the rows it drops, where the cut moved and why, and the form that
    does it (conditioned on ``version``)."""
    rows = list(dropped)
    listing = "".join(
        f"<li>{e(i.get('order'))} {e(i.get('kind'))}: {e(_short(str(i.get('text') or i.get('name') or ''), 120))}</li>"
        for i in rows
    )
    moved = (
        f" (moved from {requested}: the cut was inside a tool call/result pair)"
        if effective != requested
        else ""
    )
    return f"""<h1>Rewind thread <code>{e(thread)}</code>?</h1>
<p>Keep orders up to <strong>{effective}</strong>{e(moved)} and drop {len(rows)} row(s); children spawned after
the cut are closed. Inputs whose turns are dropped stay processed.</p><ol class="dropped">{listing}</ol>
<form method="post" action="{e(path("c", root, "rewind"))}">{csrf_field(csrf)}
<input type="hidden" name="thread" value="{e(thread)}"><input type="hidden" name="order" value="{effective}">
<input type="hidden" name="expected_version" value="{version}"><input type="hidden" name="confirm" value="yes">
<button class="danger">Rewind</button> <a href="{e(path("c", root))}">cancel</a></form>"""


# ---- the DLQs -----------------------------------------------------------------------------------------------


def dead_letters_page(
    letters: list[DeadLetter], roots: dict[str, str], problem: str | None, csrf: str
) -> str:
    """The dead letters: one row per message with its reason, a link to its thread and a redrive form."""
    rows = []
    for letter in letters:
        thread = letter.thread_id or ""
        root = roots.get(thread)
        link = f'<a href="{e(path("c", root))}#t-{e(thread)}">{e(thread)}</a>' if root else e(thread or "—")
        body = letter.body if len(letter.body) <= 200 else letter.body[:200] + "…"
        rows.append(
            f'<tr data-message-id="{e(letter.message_id)}"><td>{e(letter.queue)}</td><td><code>{e(letter.message_id)}</code></td>'
            f"<td>{link}</td><td>{letter.receive_count}</td>"
            f'<td class="reason">{e(letter.reason or "failed its last allowed attempt")}</td>'
            f'<td><code class="body">{e(body)}</code></td><td><form method="post" action="/dlq/redrive" data-ajax data-reload>'
            f'{csrf_field(csrf)}<input type="hidden" name="message_id" value="{e(letter.message_id)}">'
            "<button>Redrive</button></form></td></tr>"
        )
    problem_html = f'<p class="warn">{e(problem)}</p>' if problem else ""
    if not rows:
        return f'<h1>Dead letters</h1>{problem_html}<p class="empty" id="dlq-empty">The DLQs are empty.</p>'
    return f"""<h1>Dead letters</h1>{problem_html}
<form method="post" action="/dlq/redrive" data-ajax data-reload>{csrf_field(csrf)}<input type="hidden" name="all" value="yes">
<button>Redrive all ({len(rows)})</button></form>
<table class="list dlq"><thead><tr><th>queue</th><th>message</th><th>thread</th><th>receives</th><th>reason</th>
<th>body</th><th></th></tr></thead><tbody>{"".join(rows)}</tbody></table>
<p class="hint">Redrive sends a message back to its queue unchanged (same thread group) after you fixed the cause.</p>"""


def not_found(what: str) -> str:
    """The not-found page; ``what`` says what was not found."""
    return f'<h1>Not found</h1><p>{e(what)}</p><p><a href="/">all conversations</a></p>'
