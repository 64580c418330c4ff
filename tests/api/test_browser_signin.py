"""The chat page's sign-in card in headless Chromium: a tool that needs the user to sign in first puts an
``oauth_required`` notice on its thread's queue (as a tool runner does), and the page shows "Sign in to
continue" with the tool's name, the link (a new tab, ``rel=noopener``) and a waiting state; when the tool
then delivers its result the card says the call went on. A link that is not http(s) is never made a
link: it is shown as text with a warning. The deployment-shaped stack of ``test_browser.py``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any, ClassVar

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from stepagent.api.auth import DevAuth
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.messages import InputMessage, OAuthRequired, ToolResult
from stepagent.tools.base import Tool, ToolContext
from tests.api.test_browser import LiveApi, open_conversation, send, transcript
from tests.browser import wait_for
from tests.client.deployment import FunctionModel, Gate, call, deployment, say
from tests.console.test_browser import Background, browser  # noqa: F401 - the shared browser fixture

GOOD_URL = "https://idp.example/authorize?client=stepagent&state=<x>"
BAD_URL = "javascript:document.title='pwned'"


class ConnectDrive(Tool):
    """A tool that needs the user's sign-in: it asks for one, and answers once the test says the user
    signed in (what an OAuth-protected server's call does once the callback resumed it)."""

    name: ClassVar[str] = "connect_drive"
    description: ClassVar[str] = "Connect the user's drive (needs their sign-in)."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"url": {"type": "string"}},
        "required": ["url"],
    }
    wait: ClassVar[str] = "rap"

    def __init__(self) -> None:
        self.calls: dict[str, ToolContext] = {}

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | None:
        self.calls[context.tool_call_id] = context
        notice = OAuthRequired(id=context.tool_call_id, call_id=context.call_id, auth_url=arguments["url"])
        message = InputMessage(content=notice, group_id=context.thread_id)
        await context.sender.send(message, f"oauth-{context.tool_call_id}")
        return None


def reply(text: str, request: Any) -> list[Any]:
    if text == "connect my drive":
        return call("connect_drive", "call-signin-good", url=GOOD_URL)
    if text == "connect the odd drive":
        return call("connect_drive", "call-signin-bad", url=BAD_URL)
    if text.startswith("connected"):
        return say("Your drive is connected.")
    return say("ok")


@pytest.fixture(scope="module")
def signin_api() -> Iterator[tuple[LiveApi, ConnectDrive]]:
    background = Background()
    stack = AsyncExitStack()
    dev = DevAuth.generate()
    tool = ConnectDrive()

    async def start() -> LiveApi:
        d = await stack.enter_async_context(deployment(FunctionModel(reply), tools=[tool]))
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, dev.settings, port=0))
        return LiveApi(background, url, dev.token("browser-user"), Gate())

    try:
        yield background.run(start()), tool
    finally:
        background.run(stack.aclose())
        background.stop()


def card(driver: WebDriver, call_id: str) -> Any:
    found = driver.find_elements(By.CSS_SELECTOR, f"#signins .signin[data-tool-call-id='{call_id}']")
    return found[0] if found else None


def card_state(driver: WebDriver, call_id: str) -> dict[str, Any] | None:
    """The card as one script reads it (the page redraws between two WebDriver calls)."""
    return driver.execute_script(  # type: ignore[no-any-return]
        "const c = document.querySelector(`#signins .signin[data-tool-call-id='${arguments[0]}']`);"
        "if (!c) return null; const a = c.querySelector('a');"
        "return {text: c.innerText, done: c.classList.contains('done'), links: c.querySelectorAll('a').length,"
        " href: a && a.getAttribute('href'), target: a && a.target, rel: a && a.rel};",
        call_id,
    )


def test_a_sign_in_card_waits_then_shows_done(
    signin_api: tuple[LiveApi, ConnectDrive],
    browser: WebDriver,  # noqa: F811
) -> None:
    api, tool = signin_api
    open_conversation(browser, api, "page-signin")
    send(browser, "connect my drive")
    shown = wait_for(
        browser,
        lambda d: (s := card_state(d, "call-signin-good")) and "connect_drive" in s["text"] and s,
        "the sign-in card for the tool",
    )
    assert "Sign in to continue" in shown["text"] and "Waiting for you to sign in" in shown["text"]
    assert shown["href"] == "https://idp.example/authorize?client=stepagent&state=%3Cx%3E"
    assert shown["target"] == "_blank" and "noopener" in shown["rel"].split()
    assert not shown["done"]

    # A reload while it waits shows the card again (the stream replays only newer notices).
    browser.refresh()
    again = wait_for(
        browser,
        lambda d: (s := card_state(d, "call-signin-good")) and "connect_drive" in s["text"] and s,
        "the card after a reload",
    )
    assert again["href"] == shown["href"] and not again["done"]

    # The user signed in: the call goes on and the tool delivers its result.
    context = tool.calls["call-signin-good"]
    api.background.run(context.send_result("connected: 12 files"))
    wait_for(browser, lambda d: "Your drive is connected." in transcript(d), "the reply after the result")
    done = wait_for(
        browser, lambda d: (s := card_state(d, "call-signin-good")) and s["done"] and s, "the card done"
    )
    assert "Signed in" in done["text"] and "went on" in done["text"] and done["links"] == 0
    assert "Waiting" not in done["text"]


def test_a_sign_in_link_that_is_not_http_is_shown_as_text(
    signin_api: tuple[LiveApi, ConnectDrive],
    browser: WebDriver,  # noqa: F811
) -> None:
    api, _ = signin_api
    open_conversation(browser, api, "page-signin-bad")
    send(browser, "connect the odd drive")
    shown = wait_for(
        browser,
        lambda d: (s := card_state(d, "call-signin-bad")) and "connect_drive" in s["text"] and s,
        "the sign-in card",
    )
    assert shown["links"] == 0
    assert "not an http(s) link" in shown["text"] and BAD_URL in shown["text"]
    assert browser.title == "stepagent chat"  # nothing ran
