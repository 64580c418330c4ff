"""A tool's question and a sign-in link on the console's page: the form built from the question's JSON
Schema (each field kind, required marked, defaults), the typed answer checked against it, a page to open
shown as a link only when it is http(s), and everything the tool or model wrote kept inert."""

from __future__ import annotations

import pytest

from stepagent.console import pages
from stepagent.console.questions import AnswerInvalid, answer_from_form, question_form
from stepagent.console.reads import QuestionView
from tests.console.test_pages import EVIL, _Markup, assert_inert, hostile_page

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Your name", "description": "as on the card"},
        "age": {"type": "integer"},
        "ratio": {"type": "number", "default": 0.5},
        "ok": {"type": "boolean", "default": True},
        "size": {"type": "string", "enum": ["s", "m"], "enumNames": ["Small", "Medium"]},
        "tone": {"type": "string", "oneOf": [{"const": "warm", "title": "Warm"}, {"const": "cold"}]},
    },
    "required": ["name", "age", "size"],
}


def test_the_form_follows_the_schema() -> None:
    fields = {f.name: f for f in question_form(SCHEMA).fields}
    assert list(fields) == ["name", "age", "ratio", "ok", "size", "tone"]
    assert [f.kind for f in fields.values()] == ["string", "integer", "number", "boolean", "enum", "enum"]
    assert [n for n, f in fields.items() if f.required] == ["name", "age", "size"]
    assert fields["name"].label == "Your name" and fields["name"].description == "as on the card"
    assert (
        fields["age"].label == "age" and fields["ratio"].default == "0.5" and fields["ok"].default == "true"
    )
    assert fields["size"].options == (("s", "Small"), ("m", "Medium"))
    assert fields["tone"].options == (("warm", "Warm"), ("cold", "cold"))
    assert fields["name"].input_name == "field.name"
    for nothing in (None, "x", {"type": "object"}, {"properties": []}):
        assert question_form(nothing).fields == ()


def test_a_typed_answer_is_checked_and_typed() -> None:
    form = question_form(SCHEMA)
    given = {
        "field.name": " Ann ",
        "field.age": "41",
        "field.ratio": "1e-1",
        "field.ok": "false",
        "field.size": "m",
    }
    assert answer_from_form(form, given) == {
        "name": " Ann ",
        "age": 41,
        "ratio": 0.1,
        "ok": False,
        "size": "m",
    }
    assert answer_from_form(form, {**given, "field.ratio": "3"})["ratio"] == 3
    assert answer_from_form(form, {**given, "field.age": "7.0"})["age"] == 7
    with pytest.raises(AnswerInvalid) as caught:
        answer_from_form(
            form, {"field.age": "x", "field.ratio": "nan", "field.ok": "maybe", "field.tone": "hot"}
        )
    message = str(caught.value)
    assert message.startswith("the answer was not sent: ")
    for reason in (
        "Your name is required",
        "age: 'x' is not a whole number",
        "ratio: 'nan' is not a number",
        "ok: choose yes or no",
        "size is required",
        "tone: 'hot' is not one of warm, cold",
    ):
        assert reason in message


def _question(**overrides: object) -> QuestionView:
    asked: QuestionView = {
        "thread_id": EVIL,
        "tool_call_id": EVIL,
        "tool": EVIL,
        "message": EVIL,
        "requested_schema": {
            "type": "object",
            "properties": {
                EVIL: {"type": "string", "title": EVIL, "description": EVIL, "default": EVIL},
                "pick": {"type": "string", "enum": [EVIL, "b"]},
                "yes": {"type": "boolean"},
            },
            "required": [EVIL],
        },
        "url": None,
        "answered": False,
    }
    return {**asked, **overrides}  # type: ignore[typeddict-item]


def _page_html(*questions: QuestionView) -> str:
    page = hostile_page()
    page.threads[0].questions = list(questions)
    html = pages.layout("t", pages.conversation_page(page, "tok"), header="h", csrf="tok")
    return html.replace('<script src="/static/console.js"></script>', "")


def test_the_question_form_is_inert_and_complete() -> None:
    html = _page_html(_question())
    assert_inert(html)
    assert 'class="question"' in html and 'name="action" value="accept"' in html
    assert 'name="action" value="decline"' in html and 'name="action" value="cancel"' in html
    assert '<abbr class="required" title="required">*</abbr>' in html
    assert 'name="field.&lt;script&gt;' in html  # the property's name, escaped in the attribute
    assert '<option value="true">yes</option><option value="false">no</option>' in html
    assert "a tool asks you" not in html  # the old "cannot answer it here" notice is gone


def test_a_page_to_open_is_a_link_only_when_it_is_http() -> None:
    html = _page_html(
        _question(requested_schema=None, url="javascript:alert(5)", tool_call_id="c-js"),
        _question(requested_schema=None, url="https://example.com/verify?a=<b>", tool_call_id="c-ok"),
    )
    assert_inert(html)
    markup = _Markup()
    markup.feed(html)
    assert "https://example.com/verify?a=<b>" in markup.hrefs
    assert "not http(s), not made a link: <code>javascript:alert(5)</code>" in html
    assert (
        'class="question-url" href="https://example.com/verify?a=&lt;b&gt;" target="_blank" rel="noopener noreferrer"'
        in html
    )


def test_an_answered_question_shows_no_buttons() -> None:
    html = _page_html(_question(answered=True))
    assert "answered: the tool goes on with your answer" in html
    assert 'name="action"' not in html


def test_the_sign_in_notice_names_the_tool_and_says_when_it_is_done() -> None:
    page = hostile_page()
    page.threads[0].notices = [
        {
            "kind": "oauth",
            "auth_url": "https://idp.example/authorize",
            "tool_call_id": "c1",
            "open": True,
            "tool": EVIL,
        },
        {"kind": "oauth", "auth_url": "javascript:alert(6)", "tool_call_id": "c2", "open": True},
        {
            "kind": "oauth",
            "auth_url": "https://idp.example/done",
            "tool_call_id": "c3",
            "open": False,
            "tool": "drive",
        },
    ]
    html = pages.conversation_fragment(page, "tok")
    assert_inert(html)
    assert "<strong>Sign in to continue</strong>: <code>&lt;script&gt;" in html
    assert 'href="https://idp.example/authorize" target="_blank" rel="noopener noreferrer"' in html
    assert "waiting for the sign-in" in html
    assert "refused a link that is not http(s): <code>javascript:alert(6)</code>" in html
    assert "✔ signed in: <code>drive</code> went on" in html
