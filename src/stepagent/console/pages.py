"""The console's HTML, rendered on the server (pure functions of what :mod:`~stepagent.console.reads` read).

The pages are Jinja2 templates (``console/templates/``) rendered with autoescaping on: every value a
template prints is escaped (quotes included) unless this module wrapped it in :class:`~markupsafe.Markup`
— which it does only for fragments it rendered itself and for fixed tags — so nothing stored in a
conversation (a user's, a model's or a tool's text, an id, metadata) can inject markup or script, and a
new template is safe by default. Links from notices and tools' questions are kept only when they are
``http(s)`` URLs (anything else is shown as text, with a warning). Forms that change something carry the
process's CSRF token.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from stepagent.aws.dlq import DeadLetter
from stepagent.console.questions import question_form
from stepagent.console.reads import ConversationList, ConversationPage, PartialView, ThreadPage
from stepagent.transcript import Item


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


def _json(value: object, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _phase(partial: PartialView) -> str:
    phase = str(partial.get("phase") or "")
    return f"{phase} {partial['tool']}" if partial.get("tool") else phase


@functools.cache
def _templates() -> Environment:
    """The template environment, made on first use (the console's import stays light for the CLI)."""
    env = Environment(
        loader=PackageLoader("stepagent.console", "templates"),
        autoescape=True,  # every template, whatever its name: nothing stored reaches a page unescaped
        undefined=StrictUndefined,  # a misspelt variable fails the render instead of printing nothing
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )
    env.filters["json"] = _json
    env.filters["short"] = _short
    env.globals.update(path=path, safe_url=safe_url, phase=_phase, form_of=question_form)
    return env


def _render(template: str, **values: object) -> str:
    return _templates().get_template(template).render(**values)


def layout(title: str, body: str, *, header: str, csrf: str, notice: str | None = None) -> str:
    """A whole HTML page: ``body`` (a page rendered here: trusted markup, not escaped again) in the console's
    frame; ``header`` (which deployment: text) and ``notice`` (a flash message) are escaped."""
    return _render("layout.html", title=title, body=Markup(body), header=header, csrf=csrf, notice=notice)


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
        rows.append(
            {
                "id": row.root.thread_id,
                "href": path("c", row.root.thread_id),
                "status": row.status,
                "detail": row.status.detail if row.status else "",
                "created": _when(row.root.created_at),
                "tail": row.root.tail,
                "tokens": tokens,
                "meta": _json(row.metadata) if row.metadata not in (None, {}) else "",
            }
        )
    newer = path("", q=query, offset=max(0, listing.offset - listing.limit)) if listing.offset > 0 else None
    more = listing.offset + listing.limit < listing.total
    older = path("", q=query, offset=listing.offset + listing.limit) if more else None
    shown = f"{listing.offset + 1}-{listing.offset + len(listing.rows)} of {listing.total}" if rows else ""
    return _render(
        "conversations.html",
        rows=rows,
        query=query,
        complete=listing.complete,
        newer=newer,
        older=older,
        shown=shown,
    )


# ---- one conversation -----------------------------------------------------------------------------------


def conversation_page(
    page: ConversationPage, csrf: str, edits: Mapping[tuple[str, str], str] | None = None
) -> str:
    """A conversation's page: its live fragment (re-rendered on change), export links and the send form.
    ``edits``: arguments a person typed for waiting calls (``(thread, call id)`` → text), shown in their
    forms instead of the model's."""
    root = page.root_id
    options = [(t.thread_id, _thread_label(t, root)) for t in page.threads if not t.info.closed]
    return _render(
        "conversation.html",
        root=root,
        signature=page.signature,
        fragment=Markup(conversation_fragment(page, csrf, edits)),
        options=options,
        csrf=csrf,
    )


def _thread_label(thread: ThreadPage, root: str) -> str:
    if thread.thread_id == root:
        return f"{thread.thread_id} (root)"
    return f"{'  ' * thread.depth}{thread.thread_id} ({thread.info.kind.value})"


def conversation_fragment(
    page: ConversationPage, csrf: str, edits: Mapping[tuple[str, str], str] | None = None
) -> str:
    """The part of the page that is re-rendered whenever the conversation changes (``edits``: as for
    :func:`conversation_page`)."""
    usage = page.usage.total if page.usage else None
    tokens = (
        f"{usage.input_tokens:,} input · {usage.output_tokens:,} output · "
        f"{usage.cache_read_tokens:,} cache read · {usage.cache_write_tokens:,} cache write tokens · "
        f"{usage.completions} model call(s)"
        + (f" · {_dollars(usage.cost_usd)}" if usage.cost_usd is not None else "")
        if usage
        else ""
    )
    tree, tree_end = _tree(page)
    return _render(
        "fragment.html",
        root=page.root_id,
        status=page.status,
        tokens=tokens,
        metadata=page.metadata,
        tree=tree,
        tree_end=tree_end,
        threads=page.threads,
        csrf=csrf,
        edits=edits or {},
        turns=page.turns,
    )


def _tree(page: ConversationPage) -> tuple[list[dict[str, Any]], Markup]:
    """The thread tree as nested lists (the threads come depth first, with their depths): each node with
    the fixed tags that open it (``opening``), and the tags that close the tree. The tags are the only
    unescaped markup; the template prints each thread's id and kind escaped."""
    nodes = []
    previous = -1
    for thread in page.threads:
        if thread.depth > previous:
            opening = "<ul>" * (thread.depth - previous)
        else:
            opening = "</li>" + "</ul></li>" * (previous - thread.depth)
        kind = "root" if thread.thread_id == page.root_id else thread.info.kind.value
        nodes.append({"opening": Markup(opening), "thread": thread, "kind": kind})
        previous = thread.depth
    end = "</li>" + "</ul></li>" * previous + "</ul>" if previous >= 0 else ""
    return nodes, Markup(end)


def rewind_confirm(
    root: str, thread: str, requested: int, effective: int, dropped: Iterable[Item], version: int, csrf: str
) -> str:
    """The confirmation page of a rewind: the rows it drops, where the cut moved and why, and the form that
    does it (conditioned on ``version``)."""
    return _render(
        "rewind_confirm.html",
        root=root,
        thread=thread,
        requested=requested,
        effective=effective,
        rows=list(dropped),
        version=version,
        csrf=csrf,
    )


# ---- the DLQs -----------------------------------------------------------------------------------------------


def dead_letters_page(
    letters: list[DeadLetter], roots: dict[str, str], problem: str | None, csrf: str
) -> str:
    """The dead letters: one row per message with its reason, a link to its thread and a redrive form."""
    rows = []
    for letter in letters:
        thread = letter.thread_id or ""
        root = roots.get(thread)
        href = f"{path('c', root)}#t-{thread}" if root else None
        rows.append({"letter": letter, "thread": thread, "href": href})
    return _render("dead_letters.html", rows=rows, problem=problem, csrf=csrf)


def refused(error: str) -> str:
    """The page of an action refused with a clear error (a bad rewind, an unknown thread...)."""
    return _render("refused.html", error=error)


def not_found(what: str) -> str:
    """The not-found page; ``what`` says what was not found."""
    return _render("not_found.html", what=what)
