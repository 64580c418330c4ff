"""The console's approval status and form: a thread whose last row is a call waiting for a person shows
``waiting for approval`` (after a choice, before work in urgency) and a decision form whose stored text
stays inert."""

from __future__ import annotations

from stepagent.console import pages
from stepagent.console.reads import waiting_approval
from stepagent.console.status import Status, ThreadFacts, thread_status, tree_status
from stepagent.stores.base import ThreadInfo
from tests.console.test_pages import EVIL, assert_inert, hostile_page


def test_a_call_waiting_for_a_person_is_its_own_status() -> None:
    busy = ThreadInfo("t", "t", version=3, tail=5, turn_complete=False)
    waiting = thread_status(ThreadFacts("t", busy, pending_call=("send_email", "c1"), approval="send_email"))
    assert waiting.status is Status.APPROVAL and "send_email" in waiting.detail
    assert thread_status(ThreadFacts("t", busy, choices=1, approval="x")).status is Status.CHOICE
    closed = ThreadInfo("t", "t", version=3, tail=5, closed=True)
    assert thread_status(ThreadFacts("t", closed, approval="x")).status is Status.IDLE
    working = thread_status(ThreadFacts("u", busy, open_intents=1))
    assert tree_status([working, waiting]).status is Status.APPROVAL


def test_waiting_is_read_from_the_last_row() -> None:
    call = {"kind": "tool_call", "name": "send_email", "approval": "pending"}
    assert waiting_approval([{"kind": "user"}, call]) == "send_email"
    assert waiting_approval([call, {"kind": "tool_result"}]) is None
    assert waiting_approval([{**call, "approval": "approved"}]) is None
    assert waiting_approval([]) is None


def test_the_approval_form_escapes_what_the_model_wrote() -> None:
    page = hostile_page()
    root = page.threads[0]
    root.pending_calls = [{"tool_call_id": EVIL, "name": EVIL, "args": {EVIL: EVIL}, "approval": "pending"}]
    html = pages.layout("t", pages.conversation_page(page, "tok"), header="h", csrf="tok")
    assert 'class="approval"' in html and 'name="decision" value="edit"' in html
    assert_inert(html.replace('<script src="/static/console.js"></script>', ""))
