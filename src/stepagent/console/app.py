"""The console's web application (Starlette): pages, the JSON API and the actions.

Routes (``{root}`` is a conversation's root thread id):

====================================  ==========================================================================
``GET /``                             the conversations, newest first (``q``: search id and metadata; ``offset``)
``GET /open``                         go to the conversation ``thread`` (a new id when none is given)
``GET /c/{root}``                     the conversation: thread tree, histories, what it waits for, actions
``GET /c/{root}/fragment``            the re-rendered part of that page (the page's script fetches it)
``GET /c/{root}/export``              the tree as JSON lines (``stepagent export``), as a download
``GET /c/{root}/rewind``              the confirmation page of a rewind (``thread``, ``order``)
``POST /c/{root}/send``               send ``text`` to ``thread`` (the root or one of its descendants)
``POST /c/{root}/choice``             answer a pending choice (``thread``, ``choice_id``, ``selected``)
``POST /c/{root}/approval``           decide a call waiting for approval (``thread``, ``tool_call_id``,
                                      ``decision``; ``args`` JSON for ``edit``, ``message``)
``POST /c/{root}/elicitation``        answer a tool's question (``thread``, ``tool_call_id``, ``action``:
                                      accept / decline / cancel; the form's ``field.<name>`` values)
``POST /c/{root}/rewind``             rewind ``thread`` to ``order`` (``confirm=yes``, ``expected_version``)
``GET /dlq``, ``POST /dlq/redrive``   the dead-lettered messages; redrive ``message_id`` (repeatable) or ``all``
``GET /api/conversations``            JSON of the list; ``/api/c/{root}`` of a conversation; ``/api/dlq``
``GET /api/c/{root}/poll``            ``{"signature", "partials"}``: one read, what the page polls every second
====================================  ==========================================================================

Safety: every ``POST`` must carry the process's CSRF token (form field ``csrf`` or header
``X-CSRF-Token``), else 403. When the server is bound to a loopback address, requests whose ``Host``
is not a loopback name are refused (DNS rebinding). Responses carry a Content-Security-Policy that allows
only the console's own script and styles, so even markup that slipped through could not run script.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from stepagent.client import Client
from stepagent.console import pages
from stepagent.console.dead_letters import DeadLetters
from stepagent.console.questions import AnswerInvalid, answer_from_form, question_form
from stepagent.console.reads import conversation_list, conversation_page, poll
from stepagent.core.elicitation import read_question
from stepagent.errors import StepagentError
from stepagent.lifecycle.export import export_lines
from stepagent.lifecycle.rewind import effective_cut, rewind_thread
from stepagent.transcript import thread_items

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_STATIC = {"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"}


class ActionRefused(StepagentError):
    """A request the console will not carry out (bad form, thread outside the conversation, ...)."""

    default_disposition = "fatal"


@dataclass(slots=True)
class ConsoleState:
    """What the application needs: an open client, the DLQs, the CSRF token and the header text."""

    client: Client
    dead_letters: DeadLetters
    header: str = ""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    loopback_only: bool = True
    #: Per conversation, its threads as of the last render (what the poll reads).
    trees: dict[str, list[str]] = field(default_factory=dict)
    #: The arguments a person last typed for a waiting call, by ``(thread, tool call id)``: shown again in
    #: the call's form while it waits, so an edit the runtime (or the console) refused is not lost.
    edits: dict[tuple[str, str], str] = field(default_factory=dict)


class _Routes:
    """The console's route handlers and the helpers they share (one instance per application)."""

    def __init__(self, console: ConsoleState) -> None:
        self.console = console
        self.client = console.client

    def html(self, body: str, title: str, *, status: int = 200, notice: str | None = None) -> HTMLResponse:
        page = pages.layout(title, body, header=self.console.header, csrf=self.console.csrf, notice=notice)
        return HTMLResponse(page, status_code=status, headers=_SECURITY_HEADERS)

    def json_response(self, data: Any, status: int = 200) -> JSONResponse:
        return JSONResponse(data, status_code=status, headers=_SECURITY_HEADERS)

    async def letters_by_thread(self) -> dict[str, int]:
        try:
            return await self.console.dead_letters.counts()
        except Exception as error:  # the DLQs are optional for reading conversations
            self.console.dead_letters.problem = f"could not read the DLQs: {error}"
            return {}

    async def page_of(self, root: str) -> Any:
        page = await conversation_page(self.client, root, dead_letters=await self.letters_by_thread())
        self.console.trees[root] = [t.thread_id for t in page.threads]
        return page

    # ---- pages ------------------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        listing = await conversation_list(
            self.client,
            query=query,
            offset=_int(request.query_params.get("offset"), 0),
            dead_letters=await self.letters_by_thread(),
        )
        if request.url.path.startswith("/api/"):
            return self.json_response(listing.as_dict())
        return self.html(
            pages.conversations_page(listing, query), "Conversations", notice=request.query_params.get("msg")
        )

    async def conversation(self, request: Request) -> Response:
        root = request.path_params["root"]
        page = await self.page_of(root)
        if request.url.path.startswith("/api/"):
            return self.json_response(page.as_dict())
        notice = request.query_params.get("msg")
        if not page.exists and notice is None:
            notice = f"No conversation {root!r} yet: send a message to start it."
        body = pages.conversation_page(page, self.console.csrf, self.console.edits)
        return self.html(body, root, notice=notice)

    async def open_conversation(self, request: Request) -> Response:
        thread = request.query_params.get("thread", "").strip() or f"console-{secrets.token_hex(4)}"
        return RedirectResponse(pages.path("c", thread), status_code=303)

    async def fragment(self, request: Request) -> Response:
        root = request.path_params["root"]
        page = await self.page_of(root)
        return HTMLResponse(
            pages.conversation_fragment(page, self.console.csrf, self.console.edits),
            headers={**_SECURITY_HEADERS, "X-Signature": page.signature},
        )

    async def poll_route(self, request: Request) -> Response:
        root = request.path_params["root"]
        threads = self.console.trees.get(root) or [root]
        return self.json_response(await poll(self.client, threads))

    async def export(self, request: Request) -> Response:
        root = request.path_params["root"]
        if await self.client.conversation.get_thread(root) is None:
            return self.html(pages.not_found(f"No conversation {root!r}."), "Not found", status=404)

        async def lines() -> AsyncIterator[bytes]:
            async for line in export_lines(self.client.conversation, self.client.state, root):
                yield (line + "\n").encode()

        name = re.sub(r"[^A-Za-z0-9._-]", "_", root)[:100] or "conversation"
        return StreamingResponse(
            lines(),
            media_type="application/x-ndjson",
            headers={**_SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{name}.jsonl"'},
        )

    async def rewind_page(self, request: Request) -> Response:
        root = request.path_params["root"]
        thread = request.query_params.get("thread", root)
        order = _int(request.query_params.get("order"), -1)
        info = await _thread_of(self.client, root, thread)
        if order < 0 or order > info.tail:
            raise ActionRefused(f"order {order} is not in thread {thread} (1..{info.tail})")
        cut = await effective_cut(self.client.conversation, info, order)
        dropped = [
            i
            async for i in thread_items(self.client.conversation, thread)
            if int(i.get("order", 0)) > cut and i.get("kind") != "summary"
        ]
        body = pages.rewind_confirm(root, thread, order, cut, dropped, info.version, self.console.csrf)
        return self.html(body, f"Rewind {thread}")

    async def dlq_page(self, request: Request) -> Response:
        letters = await self.console.dead_letters.letters()
        if request.url.path.startswith("/api/"):
            return self.json_response(
                {"dead_letters": [f.summary() for f in letters], "problem": self.console.dead_letters.problem}
            )
        roots: dict[str, str] = {}
        for thread in {f.thread_id for f in letters if f.thread_id}:
            info = await self.client.conversation.get_thread(thread)
            if info is not None:
                roots[thread] = info.root_id
        body = pages.dead_letters_page(letters, roots, self.console.dead_letters.problem, self.console.csrf)
        return self.html(body, "Dead letters", notice=request.query_params.get("msg"))

    # ---- actions ------------------------------------------------------------------------------------------

    async def send(self, request: Request, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
        root = request.path_params["root"]
        thread = form.get("thread") or root
        text = form.get("text", "").strip()
        if not text:
            raise ActionRefused("the message is empty")
        if thread != root:
            info = await _thread_of(self.client, root, thread)
            if info.closed:
                raise ActionRefused(f"thread {thread} is closed: send to an open thread")
        message_id = await self.client.send(thread, text)
        return f"sent to {thread}", {"message_id": message_id, "thread_id": thread}

    async def choice(self, request: Request, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
        root = request.path_params["root"]
        thread = form.get("thread") or root
        await _thread_of(self.client, root, thread)
        selected: int | str | None = form.get("selected")
        if selected in (None, ""):
            selected = None
        index = await self.client.answer_choice(thread, form.get("choice_id") or None, selected)
        return f"answered choice {index}", {"index": index, "thread_id": thread}

    async def approval(self, request: Request, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
        root = request.path_params["root"]
        thread = form.get("thread") or root
        await _thread_of(self.client, root, thread)
        decision = form.get("decision") or "approve"
        call_id = form.get("tool_call_id", "")
        if not call_id:
            raise ActionRefused("name the waiting call (tool_call_id)")
        args = None
        if decision == "edit":
            self.console.edits[(thread, call_id)] = form.get("args") or ""
            try:
                args = json.loads(form.get("args") or "")
            except json.JSONDecodeError as error:
                raise ActionRefused(f"the arguments are not JSON: {error}") from None
            if not isinstance(args, dict):
                raise ActionRefused("the arguments must be a JSON object")
        message = (form.get("message") or "").strip() or None
        message_id = await self.client.approve(thread, call_id, decision, args, message)
        return f"sent {decision} for {call_id}", {"message_id": message_id, "thread_id": thread}

    async def elicitation(self, request: Request, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
        """Answer a tool's question: only one that still waits, and an ``accept`` only with a form that fits
        the question's schema (else the reason, and nothing is sent). The runtime checks again when the
        answer arrives: an answer that lost a race to another is refused there, and the page shows it."""
        root = request.path_params["root"]
        thread = form.get("thread") or root
        await _thread_of(self.client, root, thread)
        call_id = form.get("tool_call_id", "")
        if not call_id:
            raise ActionRefused("name the tool call whose question you answer (tool_call_id)")
        action = form.get("action") or ""
        if action not in ("accept", "decline", "cancel"):
            raise ActionRefused(f"answer with accept, decline or cancel, not {action!r}")
        kept = await read_question(self.client.state, thread, call_id)
        if kept is None:
            raise ActionRefused(f"no question waits on tool call {call_id} in thread {thread}")
        if kept.answered_by is not None:
            raise ActionRefused(f"the question of tool call {call_id} was already answered")
        content = None
        if action == "accept" and kept.notice.get("url") is None:
            try:
                content = answer_from_form(question_form(kept.notice.get("requested_schema")), form)
            except AnswerInvalid as error:
                raise ActionRefused(str(error)) from None
        message_id = await self.client.answer_input(thread, call_id, action, content)
        return f"sent {action} to the question of {call_id}", {"message_id": message_id, "thread_id": thread}

    async def rewind(self, request: Request, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
        root = request.path_params["root"]
        thread = form.get("thread") or root
        if form.get("confirm") != "yes":
            raise ActionRefused("a rewind needs confirmation (confirm=yes)")
        await _thread_of(self.client, root, thread)
        expected = form.get("expected_version")
        result = await rewind_thread(
            self.client.conversation,
            self.client.state,
            thread,
            _int(form.get("order"), -1),
            expected_version=int(expected) if expected and expected.isdigit() else None,
        )
        return (
            f"rewound {thread} to order {result.effective}: {result.dropped_rows} row(s) dropped",
            {"effective": result.effective, "dropped_rows": result.dropped_rows, "thread_id": thread},
        )

    async def redrive(self, request: Request, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
        ids = [v for k, v in form.items() if k == "message_id" and v]
        if not ids and form.get("all") != "yes":
            raise ActionRefused("name a message_id to redrive, or all=yes")
        moved = await self.console.dead_letters.redrive(ids or None)
        return f"redrove {len(moved)} message(s)", {"redriven": [m.message_id for m in moved]}

    def action(
        self,
        handler: Callable[[Request, dict[str, str]], Awaitable[tuple[str, dict[str, Any]]]],
        back: Callable[[Request], str],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            raw = await request.form()
            form = {k: str(v) for k, v in raw.multi_items()}
            token = request.headers.get("x-csrf-token") or form.get("csrf", "")
            if not secrets.compare_digest(token.encode(), self.console.csrf.encode()):
                return PlainTextResponse(
                    "missing or wrong CSRF token", status_code=403, headers=_SECURITY_HEADERS
                )
            ajax = request.headers.get("x-requested-with") == "fetch"
            try:
                message, data = await handler(request, form)
            except StepagentError as error:
                if ajax:
                    return self.json_response({"error": str(error)}, 400)
                return RedirectResponse(_with_msg(back(request), f"refused: {error}"), status_code=303)
            if ajax:
                return self.json_response({"ok": True, "message": message, **data})
            return RedirectResponse(_with_msg(back(request), message), status_code=303)

        return endpoint

    def to_conversation(self, request: Request) -> str:
        return pages.path("c", request.path_params["root"])

    def to_dlq(self, request: Request) -> str:
        return "/dlq"

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return PlainTextResponse("not found", status_code=404)
        data = (resources.files("stepagent.console") / "static" / name).read_bytes()
        return Response(
            data,
            media_type=_STATIC[name],
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )


def build_app(console: ConsoleState) -> Starlette:
    """The Starlette application serving ``console``."""
    r = _Routes(console)
    routes = [
        Route("/", r.index),
        Route("/api/conversations", r.index),
        Route("/open", r.open_conversation),
        Route("/c/{root:path}/fragment", r.fragment),
        Route("/c/{root:path}/export", r.export),
        Route("/c/{root:path}/rewind", r.rewind_page, methods=["GET"]),
        Route("/c/{root:path}/rewind", r.action(r.rewind, r.to_conversation), methods=["POST"]),
        Route("/c/{root:path}/send", r.action(r.send, r.to_conversation), methods=["POST"]),
        Route("/c/{root:path}/choice", r.action(r.choice, r.to_conversation), methods=["POST"]),
        Route("/c/{root:path}/approval", r.action(r.approval, r.to_conversation), methods=["POST"]),
        Route("/c/{root:path}/elicitation", r.action(r.elicitation, r.to_conversation), methods=["POST"]),
        Route("/c/{root:path}", r.conversation),
        Route("/api/c/{root:path}/poll", r.poll_route),
        Route("/api/c/{root:path}", r.conversation),
        Route("/dlq", r.dlq_page),
        Route("/api/dlq", r.dlq_page),
        Route("/dlq/redrive", r.action(r.redrive, r.to_dlq), methods=["POST"]),
        Route("/static/{name}", r.static),
    ]

    async def refused(request: Request, error: Exception) -> Response:
        if request.url.path.startswith("/api/"):
            return r.json_response({"error": str(error)}, 400)
        return r.html(pages.refused(str(error)), "Refused", status=400)

    app = Starlette(routes=routes, exception_handlers={StepagentError: refused})

    async def guard(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and console.loopback_only:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
            if name not in LOOPBACK_HOSTS:
                response = PlainTextResponse(
                    "this console answers only on loopback addresses", status_code=421
                )
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    guard.app = app  # type: ignore[attr-defined]
    return guard  # type: ignore[return-value]


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _with_msg(url: str, message: str) -> str:
    return url + ("&" if "?" in url else "?") + "msg=" + quote(message, safe="")


async def _thread_of(client: Client, root: str, thread: str) -> Any:
    """The thread's record, if it belongs to the conversation ``root`` (else :class:`ActionRefused`)."""
    info = await client.conversation.get_thread(thread)
    if info is None or info.root_id != root:
        raise ActionRefused(f"thread {thread!r} is not part of conversation {root!r}")
    return info


__all__ = ["ActionRefused", "ConsoleState", "build_app"]
