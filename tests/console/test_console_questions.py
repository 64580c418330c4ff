"""The console answers a tool's question (an MCP elicitation) inline, on a deployment-shaped stack on moto
with a real loopback MCP server (2026-07-28): the conversation shows the question with a field per form
property, an invalid answer is refused with its reason and nothing is sent, a valid one reaches the tool
typed as the schema says (the server's SDK validates it), and an answer to a question already answered is
refused — by the console, and by the runtime when the answer reaches it anyway."""

from __future__ import annotations

from typing import Any

from stepagent.core.elicitation import read_question
from stepagent.messages import InputMessage, InputRequired
from stepagent.rap.server import serve_in_background
from stepagent.senders.sqs import SqsSender
from stepagent.tools.mcp_config import McpServer
from tests.console.asking import booking_model, build
from tests.console.helpers import ConsoleStack, console_stack
from tests.console.test_console_api import settle, texts, until


def question(d: dict[str, Any]) -> dict[str, Any] | None:
    asked = d["threads"][0]["questions"]
    return asked[0] if asked else None


async def answered_by(c: ConsoleStack, thread: str) -> str | None:
    kept = await read_question(c.client.state, thread, "call-book")
    assert kept is not None
    return kept.answered_by


async def test_answer_a_tools_question_in_the_console() -> None:
    async with serve_in_background(build().streamable_http_app()) as base:
        server = McpServer(name="hotel", url=f"{base}/mcp")
        async with console_stack(booking_model(), mcp_servers=(server,)) as c:
            await c.client.send("ask-1", "book a room")
            waiting = await until(c, "/api/c/ask-1", question)
            asked = question(waiting)
            assert asked is not None
            assert asked["message"] == "How should I book the room?" and asked["tool"] == "hotel__book"
            assert not asked["answered"] and waiting["status"]["status"] == "choice"

            html = (await c.http.get("/c/ask-1")).text
            assert 'action="/c/ask-1/elicitation"' in html
            for name in ("guests", "budget", "vegetarian", "room", "note"):
                assert f'name="field.{name}"' in html
            assert 'inputmode="numeric"' in html and 'inputmode="decimal"' in html
            assert '<option value="double">double</option>' in html
            assert 'value="100.0"' in html  # the schema's default
            assert html.count('<abbr class="required"') == 3  # guests, vegetarian, room

            form = {"thread": "ask-1", "tool_call_id": "call-book", "action": "accept"}
            good = {
                "field.guests": "2",
                "field.budget": "120.5",
                "field.vegetarian": "true",
                "field.room": "double",
            }
            # Invalid answers: the reason, and nothing sent.
            empty = await c.post("/c/ask-1/elicitation", {**form, **good, "field.guests": " "})
            assert empty.status_code == 400 and "Guests is required" in empty.json()["error"]
            wrong = await c.post(
                "/c/ask-1/elicitation", {**form, **good, "field.guests": "two", "field.budget": "lots"}
            )
            reason = wrong.json()["error"]
            assert wrong.status_code == 400 and reason.startswith("the answer was not sent")
            assert "'two' is not a whole number" in reason and "'lots' is not a number" in reason
            fraction = await c.post("/c/ask-1/elicitation", {**form, **good, "field.guests": "2.5"})
            assert "'2.5' is not a whole number" in fraction.json()["error"]
            outside = await c.post("/c/ask-1/elicitation", {**form, **good, "field.room": "suite"})
            assert "'suite' is not one of single, double" in outside.json()["error"]
            unset = await c.post("/c/ask-1/elicitation", {**form, **good, "field.vegetarian": ""})
            assert "Vegetarian is required" in unset.json()["error"]
            assert await answered_by(c, "ask-1") is None
            still = await c.http.get("/api/c/ask-1")
            assert question(still.json()) == asked

            # The guards of every action: the CSRF token, and a thread of this conversation.
            forged = await c.http.post("/c/ask-1/elicitation", data={**form, **good})
            assert forged.status_code == 403
            elsewhere = await c.post("/c/other/elicitation", {**form, **good})
            assert elsewhere.status_code == 400 and "not part of conversation" in elsewhere.json()["error"]

            sent = await c.post("/c/ask-1/elicitation", {**form, **good})
            assert sent.status_code == 200 and sent.json()["ok"], sent.text
            done = await until(c, "/api/c/ask-1", lambda d: any("Tool says" in (t or "") for t in texts(d)))
            assert (
                "Tool says: booked 2 guests in Lisbon, budget 120.5, vegetarian True, double room, note ''"
                in texts(done)
            )
            await settle(c.client, "ask-1")

            # Answered: the console refuses another answer...
            again = await c.post("/c/ask-1/elicitation", {**form, "action": "decline"})
            assert again.status_code == 400
            assert again.json()["error"] == "the question of tool call call-book was already answered"
            back = await c.post("/c/ask-1/elicitation", {**form, "action": "decline"}, ajax=False)
            assert back.status_code == 303 and "already%20answered" in back.headers["location"]
            # ...and one that reaches the runtime anyway is refused there, which the page shows.
            await c.client.answer_input("ask-1", "call-book", "decline")
            refused = await until(
                c,
                "/api/c/ask-1",
                lambda d: [n for n in d["threads"][0]["notices"] if "answer refused" in n.get("text", "")],
            )
            assert refused["threads"][0]["questions"] == []  # the call is over: nothing to answer
            page = (await c.http.get("/c/ask-1")).text
            assert "answer refused: there is no tool call call-book waiting for an answer" in page
            assert 'class="question"' not in page


async def test_decline_a_tools_question_in_the_console() -> None:
    async with serve_in_background(build().streamable_http_app()) as base:
        server = McpServer(name="hotel", url=f"{base}/mcp")
        async with console_stack(booking_model(), mcp_servers=(server,)) as c:
            await c.client.send("ask-2", "book a room")
            await until(c, "/api/c/ask-2", question)
            # Declining needs no form: the empty required fields do not stop it.
            declined = await c.post(
                "/c/ask-2/elicitation", {"thread": "ask-2", "tool_call_id": "call-book", "action": "decline"}
            )
            assert declined.json()["ok"], declined.text
            done = await until(c, "/api/c/ask-2", lambda d: any("Tool says" in (t or "") for t in texts(d)))
            assert "Tool says: not booked in Lisbon: the user declined" in texts(done)


async def test_a_question_that_asks_to_open_a_page() -> None:
    """A question with a page to open (a URL-mode elicitation), put on the thread's queue as the tool runner
    does while the call waits: the link (http(s) only; anything else as text with a warning), and an
    Accept that sends no form."""
    async with console_stack() as c:
        await c.post("/c/ask-3/send", {"text": "nap a while"})
        napping = await until(c, "/api/c/ask-3", lambda d: d["status"]["status"] == "timer")
        call_id = napping["threads"][0]["pending_calls"][0]["tool_call_id"]
        sender = SqsSender(c.sqs, str(c.deployment.settings.input_queue_url))
        for n, url in enumerate(("javascript:alert(1)", "https://pay.example/confirm?id=<7>")):
            asked = InputRequired(id=call_id, message=f"Confirm the payment ({n})", url=url, era="session")
            await sender.send(InputMessage(content=asked, group_id="ask-3"), f"ask-3-url-{n}")
            await until(
                c, "/api/c/ask-3", lambda d, n=n: (q := question(d)) and q["message"].endswith(f"({n})")
            )
            html = (await c.http.get("/c/ask-3")).text
            if n == 0:
                assert "not http(s), not made a link: <code>javascript:alert(1)</code>" in html
                assert 'class="question-url"' not in html
        assert (
            'class="question-url" href="https://pay.example/confirm?id=&lt;7&gt;" target="_blank" '
            'rel="noopener noreferrer"' in html
        )
        assert 'name="field.' not in html
        sent = await c.post(
            "/c/ask-3/elicitation", {"thread": "ask-3", "tool_call_id": call_id, "action": "accept"}
        )
        assert sent.json()["ok"], sent.text
        answered = await until(c, "/api/c/ask-3", lambda d: (q := question(d)) and q["answered"])
        assert question(answered)["url"] == "https://pay.example/confirm?id=<7>"  # type: ignore[index]
        kept = await read_question(c.client.state, "ask-3", call_id)
        assert kept is not None and kept.answer == {"action": "accept", "content": {}}
        assert "answered: the tool goes on with your answer" in (await c.http.get("/c/ask-3")).text
