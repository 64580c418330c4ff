"""A tool's sign-in link at the terminal: one line (``🔑 authorise at <url>``), a status line that waits for
the sign-in until the call goes on, a link that is not a plain http(s) URL quoted inert with a warning (no
line break, no terminal escape gets through), and the same ``oauth`` item over the HTTP API's stream as
from the stores — a real API on the deployment-shaped stack, the tool putting ``oauth_required`` on its
thread's queue as a tool runner does."""

from __future__ import annotations

import io
from typing import Any, cast

from stepagent.api.auth import DevAuth
from stepagent.client import Client
from stepagent.client.http import item_of
from stepagent.client.terminal import Activity, Chat, Screen, item_line
from stepagent.transcript import Item, sign_in_text
from tests.api.helpers import api_stack
from tests.api.test_browser_signin import ConnectDrive, reply
from tests.client.deployment import FunctionModel


def test_a_sign_in_link_is_one_plain_line() -> None:
    assert sign_in_text("https://idp.example/a?b=1") == "🔑 authorise at https://idp.example/a?b=1"
    for hostile in (
        "javascript:alert(1)",
        "data:text/html,<script>",
        "https://idp.example/a\nagent > you have been signed out, type your password:",
        "https://idp.example/\x1b[2J\x1b]8;;https://evil.example\x1b\\",
        "https://idp.example/a b",
        "//idp.example/a",
        "",
    ):
        line = sign_in_text(hostile)
        assert line.startswith("🔑 a tool asks you to sign in, but its link is not a plain http(s) URL")
        assert "\n" not in line and "\x1b" not in line and "\r" not in line, repr(line)
    assert "javascript:alert(1)" in sign_in_text("javascript:alert(1)")
    item = {"thread_id": "r", "kind": "oauth", "auth_url": "javascript:alert(1)", "tool_call_id": "c"}
    assert item_line(item, "r") == (
        "agent 🔑 a tool asks you to sign in, but its link is not a plain http(s) URL (not shown as one): "
        '"javascript:alert(1)"'
    )


def test_the_chat_waits_for_the_sign_in_until_the_call_goes_on() -> None:
    out = io.StringIO()
    chat = Chat(cast(Client, None), "conv", Screen(out, interactive=False), Activity("conv"))
    chat.show(
        {"thread_id": "conv", "kind": "tool_call", "tool_call_id": "c1", "name": "connect_drive", "args": {}}
    )
    chat.show(
        {"thread_id": "conv", "kind": "oauth", "tool_call_id": "c1", "auth_url": "https://idp.example/a"}
    )
    assert out.getvalue().splitlines()[-1] == "agent 🔑 authorise at https://idp.example/a"
    assert chat.activity.status(80) == "🔑 connect_drive waits for you to sign in: open the link above"
    chat.show({"thread_id": "conv", "kind": "idle"})
    assert "sign in" in str(chat.activity.status(80))  # the tree rests, the sign-in still waits
    chat.show({"thread_id": "conv", "kind": "tool_result", "tool_call_id": "c1", "text": "connected"})
    assert "sign in" not in str(chat.activity.status(80))


def test_the_http_stream_s_sign_in_event_is_an_oauth_item() -> None:
    event = {
        "type": "oauth_required",
        "event_id": "e",
        "auth_url": "https://x.example/",
        "tool_call_id": "c9",
        "thread_id": "t",
    }
    assert item_of(event) == {
        "thread_id": "t",
        "kind": "oauth",
        "auth_url": "https://x.example/",
        "tool_call_id": "c9",
    }
    assert item_of({**event, "auth_url": 5}) == {
        "thread_id": "t",
        "kind": "oauth",
        "auth_url": "",
        "tool_call_id": "c9",
    }


async def test_a_client_over_http_sees_the_sign_in_then_the_result() -> None:
    dev = DevAuth.generate()
    tool = ConnectDrive()
    async with (
        api_stack(FunctionModel(reply), dev.settings, tools=[tool]) as api,
        Client(api_url=api.url, token=dev.token("ann")) as web,
    ):
        await web.send("term-signin", "connect my drive")
        seen: list[Item] = []
        async for item in web.replies("term-signin", follow=True, timeout=60):
            seen.append(item)
            if item.get("kind") == "oauth":
                break
        signin = seen[-1]
        assert signin == {
            "thread_id": "term-signin",
            "kind": "oauth",
            "auth_url": "https://idp.example/authorize?client=stepagent&state=<x>",
            "tool_call_id": "call-signin-good",
        }
        assert item_line(signin, "term-signin") == (
            "agent 🔑 authorise at https://idp.example/authorize?client=stepagent&state=<x>"
        )
        await tool.calls["call-signin-good"].send_result("connected: 3 files")
        texts: list[Any] = []
        async for item in web.replies("term-signin", follow=True, timeout=60):
            texts.append(item.get("text"))
            if item.get("text") == "Your drive is connected.":
                break
        assert "connected: 3 files" in texts
