"""The console's JSON API and pages on a deployment-shaped stack on moto (the real worker, tool runner and
RAP servers), through the application itself (in-process HTTP, no socket): list and search, the thread
tree, every action, the guards (CSRF, Host), export, rewind, and the DLQs with redrive."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from stepagent.aws import dlq
from stepagent.client import Client
from stepagent.messages import InputMessage
from tests.client.deployment import FunctionModel, Gate, say
from tests.console.helpers import ConsoleStack, console_stack
from tests.polling import eventually


async def settle(client: Client, thread: str) -> None:
    async for _ in client.replies(thread, timeout=60):
        pass


async def until(c: ConsoleStack, url: str, check: Any, within: float = 30.0) -> Any:
    """GET ``url`` (JSON) until ``check(data)`` holds."""

    async def satisfied() -> Any:
        data = (await c.http.get(url)).json()
        return data if check(data) else None

    return await eventually(satisfied, f"{url} to satisfy the check", within=within, interval=0.2)


def texts(conversation: dict[str, Any]) -> list[str]:
    return [i.get("text") or i.get("name") for t in conversation["threads"] for i in t["items"]]


async def test_list_tree_actions_guards_export_rewind_and_dlq() -> None:
    async with console_stack() as c:
        client = c.client
        await client.send("conv-a", "plan the day")
        await settle(client, "conv-a")
        await client.send("conv-b", "<script>alert(1)</script> hi", metadata={"user": "ann <b>"})
        await settle(client, "conv-b")

        # The list: newest first, with status and usage; search by id and by metadata.
        listing = (await c.http.get("/api/conversations")).json()
        assert [r["thread_id"] for r in listing["conversations"]] == ["conv-b", "conv-a"]
        assert all(r["status"]["status"] == "idle" for r in listing["conversations"])
        assert listing["conversations"][1]["usage"]["output_tokens"] > 0 and listing["complete"]
        found = (await c.http.get("/api/conversations", params={"q": "ANN <b"})).json()
        assert [r["thread_id"] for r in found["conversations"]] == ["conv-b"]
        found = (await c.http.get("/api/conversations", params={"q": "conv-a"})).json()
        assert [r["thread_id"] for r in found["conversations"]] == ["conv-a"]
        page = await c.http.get("/")
        assert page.status_code == 200 and 'href="/c/conv-a"' in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")

        # The tree: the root ran a RAP tool and spawned a child that reported and closed.
        tree = (await c.http.get("/api/c/conv-a")).json()
        root, child = tree["threads"]
        assert child["parent_id"] == "conv-a" and child["kind"] == "child" and child["closed"]
        assert [i["name"] for i in root["items"] if i["kind"] == "tool_call"] == ["get_time", "spawn_thread"]
        assert [i["name"] for i in child["items"] if i["kind"] == "tool_call"] == [
            "report_to_parent",
            "close_thread",
        ]
        assert texts(tree)[-1] is not None and "Got the report." in texts(tree)
        html = (await c.http.get("/c/conv-a")).text
        assert f'id="t-{child["thread_id"]}"' in html and 'data-node="conv-a"' in html
        html = (await c.http.get("/c/conv-b")).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt; hi" in html and "<script>alert(1)" not in html
        assert "ann &lt;b&gt;" in html

        # Guards: no CSRF token, a wrong one, a foreign Host.
        refused = await c.http.post("/c/conv-b/send", data={"thread": "conv-b", "text": "x"})
        assert refused.status_code == 403
        refused = await c.http.post("/c/conv-b/send", data={"text": "x", "csrf": "wrong"})
        assert refused.status_code == 403
        rebound = await c.http.get("/", headers={"Host": "evil.example:8321"})
        assert rebound.status_code == 421
        outside = await c.post("/c/conv-b/send", {"thread": "conv-a", "text": "x"})
        assert outside.status_code == 400 and "not part of conversation" in outside.json()["error"]
        closed = await c.post("/c/conv-a/send", {"thread": child["thread_id"], "text": "x"})
        assert closed.status_code == 400 and "is closed" in closed.json()["error"]

        # Send, answer a choice, then a timer: each visible in the status.
        sent = await c.post("/c/conv-b/send", {"thread": "conv-b", "text": "hello"})
        assert sent.json()["ok"] and sent.json()["message_id"]
        await until(c, "/api/c/conv-b", lambda d: "Hello back, friend." in texts(d))
        await c.post("/c/conv-b/send", {"text": "pick a color"})
        asking = await until(c, "/api/c/conv-b", lambda d: d["threads"][0]["choices"])
        assert asking["status"]["status"] == "choice"
        choice = asking["threads"][0]["choices"][0]
        assert choice["choices"] == ["red", "green", "blue"]
        answered = await c.post(
            "/c/conv-b/choice", {"thread": "conv-b", "choice_id": choice["choice_id"], "selected": "2"}
        )
        assert answered.json()["index"] == 2
        await until(
            c, "/api/c/conv-b", lambda d: "Blue it is." in texts(d) and d["status"]["status"] == "idle"
        )
        await c.post("/c/conv-b/send", {"text": "connect my account"})
        signed = await until(c, "/api/c/conv-b", lambda d: d["threads"][0]["notices"])
        assert signed["threads"][0]["notices"][-1]["auth_url"] == "https://example.com/oauth/authorize?demo=1"
        await settle(client, "conv-b")
        html = (await c.http.get("/c/conv-b")).text
        assert (
            'href="https://example.com/oauth/authorize?demo=1" target="_blank" rel="noopener noreferrer"'
            in html
        )
        await c.post("/c/conv-b/send", {"text": "nap a while"})
        napping = await until(c, "/api/c/conv-b", lambda d: d["status"]["status"] == "timer")
        assert napping["threads"][0]["pending_calls"][0]["name"] == "sleep"

        # Rewind: a confirmation page, refused without confirmation, then done.
        orders = [i["order"] for i in napping["threads"][0]["items"]]
        keep = (
            orders.index(
                next(
                    i["order"]
                    for i in napping["threads"][0]["items"]
                    if i.get("text") == "Hello back, friend."
                )
            )
            + 1
        )
        confirm = await c.http.get("/c/conv-b/rewind", params={"thread": "conv-b", "order": keep})
        assert confirm.status_code == 200 and f'name="order" value="{keep}"' in confirm.text
        assert "pick a color" in confirm.text  # what would be dropped
        beyond = await c.http.get("/c/conv-b/rewind", params={"thread": "conv-b", "order": 10**6})
        assert beyond.status_code == 400 and "<h1>Refused</h1>" in beyond.text  # the page says why
        unconfirmed = await c.post("/c/conv-b/rewind", {"thread": "conv-b", "order": keep})
        assert unconfirmed.status_code == 400
        done = await c.post("/c/conv-b/rewind", {"thread": "conv-b", "order": keep, "confirm": "yes"})
        assert done.json()["effective"] == keep and done.json()["dropped_rows"] == len(orders) - keep
        after = (await c.http.get("/api/c/conv-b")).json()
        assert texts(after)[-1] == "Hello back, friend." and after["status"]["status"] == "idle"
        back = await c.post(
            "/c/conv-b/rewind", {"thread": "conv-b", "order": 1, "confirm": "yes"}, ajax=False
        )
        assert back.status_code == 303 and back.headers["location"].startswith("/c/conv-b?msg=rewound")

        # Export: the tree as JSON lines, as a download.
        export = await c.http.get("/c/conv-a/export")
        lines = [json.loads(line) for line in export.text.splitlines()]
        assert export.headers["content-disposition"] == 'attachment; filename="conv-a.jsonl"'
        assert lines[0]["type"] == "header" and lines[-1] == {
            "type": "end",
            "threads": 2,
            "rows": lines[-1]["rows"],
        }

        # The DLQ: a dead-lettered message fails its conversation until it is redriven and processed.
        input_dlq = await dlq.dead_letter_queue(c.sqs, str(c.deployment.settings.input_queue_url))
        body = InputMessage.user_text("conv-a", "hello again", id="dead-1").model_dump_json()
        await c.sqs.send_message(
            QueueUrl=input_dlq,
            MessageBody=body,
            MessageGroupId="conv-a",
            MessageDeduplicationId="dead-1",
            MessageAttributes={"stepagent_error": {"DataType": "String", "StringValue": "provider <down>"}},
        )
        letters = (await c.http.get("/api/dlq")).json()["dead_letters"]
        assert [(f["queue"], f["thread_id"], f["reason"]) for f in letters] == [
            ("input", "conv-a", "provider <down>")
        ]
        dlq_html = (await c.http.get("/dlq")).text
        assert "provider &lt;down&gt;" in dlq_html and 'href="/c/conv-a#t-conv-a"' in dlq_html
        failed = (await c.http.get("/api/c/conv-a")).json()
        assert failed["status"]["status"] == "failed" and "dead-lettered" in failed["status"]["detail"]
        moved = await c.post("/dlq/redrive", {"message_id": letters[0]["message_id"]})
        assert moved.json()["redriven"] == [letters[0]["message_id"]]
        again = await c.post("/dlq/redrive", {"message_id": letters[0]["message_id"]})
        assert again.status_code == 400 and "not in a DLQ" in again.json()["error"]
        await until(
            c,
            "/api/c/conv-a",
            lambda d: texts(d).count("Hello back, friend.") == 1 and d["status"]["status"] == "idle",
        )
        assert (await c.http.get("/api/dlq")).json()["dead_letters"] == []


async def test_the_poll_shows_the_live_partial_text_then_the_commit() -> None:
    gate = Gate()
    model = FunctionModel(lambda text, _: say("Thinking about ", gate, "it."))
    async with console_stack(model) as c:
        await c.client.send("conv-live", "go")
        await asyncio.wait_for(gate.reached.wait(), 30)
        streaming = await until(c, "/api/c/conv-live/poll", lambda d: d["partials"])
        assert streaming["partials"]["conv-live"]["text"] == "Thinking about "
        assert streaming["partials"]["conv-live"]["phase"] == "writing"
        page = (await c.http.get("/api/c/conv-live")).json()
        assert (
            page["status"]["status"] == "working"
            and page["threads"][0]["partial"]["text"] == "Thinking about "
        )
        gate.open()
        await settle(c.client, "conv-live")
        done = (await c.http.get("/api/c/conv-live/poll")).json()
        assert done["partials"] == {} and done["signature"] != streaming["signature"]
        assert texts((await c.http.get("/api/c/conv-live")).json()) == ["go", "Thinking about it."]
