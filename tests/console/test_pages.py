"""The console's HTML never lets stored text become markup (XSS), and links only go to http(s)."""

from __future__ import annotations

from html.parser import HTMLParser

from stepagent.aws.dlq import DeadLetter
from stepagent.console import pages
from stepagent.console.reads import ConversationList, ConversationPage, ConversationRow, ThreadPage
from stepagent.console.status import StatusReport, ThreadFacts, thread_status
from stepagent.stores.base import ThreadInfo, ThreadKind
from stepagent.stores.dynamodb.roots import RootSummary

EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'><svg onload=alert(3)>"


def hostile_page() -> ConversationPage:
    root_info = ThreadInfo(EVIL, EVIL, version=2, tail=6, turn_complete=False)
    child_info = ThreadInfo(EVIL + "c", EVIL, parent_id=EVIL, kind=ThreadKind.CHILD, version=1, tail=1)
    items = [
        {"thread_id": EVIL, "order": n, "kind": kind, "text": EVIL}
        for n, kind in enumerate(["user", "assistant", "reasoning", "tool_result", "event"], start=1)
    ]
    items.append(
        {
            "thread_id": EVIL,
            "order": 6,
            "kind": "tool_call",
            "name": EVIL,
            "args": {EVIL: EVIL},
            "tool_call_id": EVIL,
        }
    )
    items.append({"thread_id": EVIL, "kind": "summary", "order": 6, "text": EVIL})
    root = ThreadPage(
        root_info,
        0,
        ThreadFacts(EVIL, root_info),
        StatusReport(thread_status(ThreadFacts(EVIL, root_info)).status, EVIL, EVIL),
        items=items,
        choices=[
            {"thread_id": EVIL, "choice_id": EVIL, "prompt": EVIL, "choices": [EVIL, "b"], "default": 0}
        ],
        pending_calls=[{"tool_call_id": EVIL, "name": EVIL, "args": {"x": EVIL}}],
        held_inputs=[{"message_id": EVIL, "synthetic": EVIL, "text": EVIL}],
        subscriptions=[{"tool_call_id": EVIL, "name": EVIL, "args": [EVIL]}],
        notices=[
            {"kind": "oauth", "auth_url": "javascript:alert(4)", "tool_call_id": EVIL, "open": True},
            {
                "kind": "oauth",
                "auth_url": 'https://example.com/a?b=<x>&c="',
                "tool_call_id": "t",
                "open": True,
            },
            {"kind": "error", "text": EVIL, "retrying": False},
        ],
        partial={"phase": EVIL, "tool": EVIL, "text": EVIL},
    )
    child = ThreadPage(
        child_info,
        1,
        ThreadFacts(child_info.thread_id, child_info),
        thread_status(ThreadFacts(child_info.thread_id, child_info)),
    )
    return ConversationPage(True, EVIL, [root, child], root.status, None, {EVIL: EVIL}, EVIL)


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for name, value in attrs:
            self.attributes.add(name)
            if name == "href":
                self.hrefs.append(value or "")


def assert_inert(html: str) -> None:
    """Parsed as a browser would, the page holds only the console's own elements and attributes: the
    hostile text made no tag, no event handler, no script link."""
    markup = _Markup()
    markup.feed(html)
    assert not markup.tags & {"script", "img", "svg", "iframe"}, markup.tags
    assert not [a for a in markup.attributes if a.startswith("on")], markup.attributes
    links = [h for h in markup.hrefs if h != "data:,"]  # the empty favicon
    assert not [h for h in links if h.lower().startswith(("javascript", "data"))], links


def test_every_stored_text_is_escaped_in_the_conversation_page() -> None:
    html = pages.layout(
        "t", pages.conversation_page(hostile_page(), "tok"), header=EVIL, csrf="tok", notice=EVIL
    )
    assert_inert(html.replace('<script src="/static/console.js"></script>', ""))
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") > 10
    markup = _Markup()
    markup.feed(html)
    # the notice's http(s) link is kept, its hostile characters escaped inside the quoted attribute
    assert 'https://example.com/a?b=<x>&c="' in markup.hrefs
    assert "&lt;x&gt;&amp;c=" in html
    assert "refused a link that is not http(s)" in html
    assert 'rel="noopener noreferrer"' in html


def test_the_list_and_the_dlq_page_escape_too() -> None:
    letter = DeadLetter("input", EVIL, EVIL, EVIL, 3, EVIL, EVIL, None, "rh")
    html = pages.dead_letters_page([letter], {EVIL: EVIL}, EVIL, "tok")
    assert_inert(html)
    confirm = pages.rewind_confirm(EVIL, EVIL, 3, 2, [{"order": 3, "kind": "user", "text": EVIL}], 4, "tok")
    assert_inert(confirm)
    for other in (pages.refused(EVIL), pages.not_found(EVIL)):
        assert_inert(other)
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in other
    root = RootSummary(EVIL, 1_700_000_000_000, 3, 7, False, True)
    status = thread_status(ThreadFacts(EVIL, ThreadInfo(EVIL, EVIL)))
    listing = ConversationList([ConversationRow(root, {EVIL: EVIL}, status)], 30, False, 10, 10)
    page = pages.conversations_page(listing, EVIL)
    assert_inert(page)
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # id, link text, metadata, query
    assert "older conversations are missing" in page and ">newer</a>" in page and ">older</a>" in page


def test_safe_url_and_paths() -> None:
    assert pages.safe_url("https://x.test/a") == "https://x.test/a"
    for bad in ("javascript:alert(1)", "data:text/html,x", "//x.test", "/relative", "", None, "http://"):
        assert pages.safe_url(bad) is None
    assert pages.path("c", "a/b c", "send") == "/c/a%2Fb%20c/send"
    assert pages.path("", q="x&y") == "/?q=x%26y"


def test_the_conversation_shows_its_tokens_and_cost() -> None:
    from stepagent.usage import TokenTotals, UsageReport

    page = hostile_page()
    totals = TokenTotals(1_200, 80, 9_000, 1_500, completions=3, steps=2, cost_usd=0.0421)
    page.usage = UsageReport(page.root_id, totals)
    html = pages.conversation_fragment(page, "tok")
    assert "1,200 input · 80 output · 9,000 cache read · 1,500 cache write tokens" in html
    assert "3 model call(s) · $0.04" in html
    page.usage = UsageReport(page.root_id, TokenTotals(10, 1, cost_usd=0.000123))
    assert "$0.0001" in pages.conversation_fragment(page, "tok")  # below a cent: more digits
    page.usage = UsageReport(page.root_id, TokenTotals(10, 1))  # prices unknown: no cost shown
    assert "$" not in pages.conversation_fragment(page, "tok")
