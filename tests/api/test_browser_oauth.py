"""The README's OAuth walkthrough in headless Chromium, end to end: a person on the chat page asks for
their notes, which live behind a REAL OAuth-protected MCP server (``examples/oauth_mcp_server.py``: its own
authorization server with registration and PKCE); the page shows "Sign in to continue" with the link; the
person follows it (a new tab: the authorization server approves and sends the browser to the API's
``GET /v1/oauth/callback``, which says "Signed in to notes"); back on the chat page the call goes on, the
model answers with the signed-in user's real notes and the card says the call went on. Tokens are sealed
with the local key file in the stack's state directory, as ``stepagent run --api --state-dir`` keeps
them. The deployment-shaped stack of ``test_browser.py``: worker and tool runner on moto."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from stepagent.api.auth import DevAuth
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.tools.mcp_config import McpServer
from stepagent.tools.mcp_oauth import CALLBACK_PATH
from stepagent.tools.mcp_session import forget_all
from tests.api.test_browser import LiveApi, open_conversation, send, transcript
from tests.api.test_browser_signin import card_state
from tests.browser import wait_for
from tests.client.deployment import FunctionModel, Gate, call, deployment, say
from tests.console.test_browser import Background, browser  # noqa: F401 - the shared browser fixture
from tests.mcp.fixtures.oauth import oauth_server

NOTES = "notes of alice: buy milk; call Bob"


def reply(text: str, request: Any) -> list[Any]:
    if text == "show my notes":
        return call("notes__my_notes", "call-notes")
    if text.startswith("notes of"):
        return say(f"Here they are: {text}")
    return say("ok")


@pytest.fixture(scope="module")
def oauth_chat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveApi, Any]]:
    background = Background()
    stack = AsyncExitStack()
    dev = DevAuth.generate()
    state_dir: Path = tmp_path_factory.mktemp("oauth-state")

    async def start() -> tuple[LiveApi, Any]:
        forget_all()
        base, authority = await stack.enter_async_context(oauth_server())
        server = McpServer(name="notes", url=f"{base}/mcp", auth="oauth")
        d = await stack.enter_async_context(
            deployment(
                FunctionModel(reply),
                mcp_servers=(server,),
                settings_overrides={"state_dir": str(state_dir), "api_url": "http://127.0.0.1:9"},
            )
        )
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, dev.settings, port=0))
        # The tool runner learns where the API listens only now (``stepagent run --api`` knows its port
        # before it starts and sets STEPAGENT_API_URL itself).
        runtime = d.services.runtime
        assert runtime.oauth is not None
        runtime.oauth = dataclasses.replace(runtime.oauth, redirect_uri=url + CALLBACK_PATH)
        return LiveApi(background, url, dev.token("browser-user"), Gate()), authority

    try:
        yield background.run(start())
    finally:
        background.run(stack.aclose())
        background.stop()
        forget_all()


def test_sign_in_from_the_chat_page_and_the_call_resumes_with_the_real_result(
    oauth_chat: tuple[LiveApi, Any],
    browser: WebDriver,  # noqa: F811
) -> None:
    api, authority = oauth_chat
    open_conversation(browser, api, "page-oauth")
    send(browser, "show my notes")
    shown = wait_for(
        browser,
        lambda d: (s := card_state(d, "call-notes")) and s["href"] and s,
        "the sign-in card with its link",
    )
    assert "Sign in to continue" in shown["text"] and "Waiting for you to sign in" in shown["text"]
    assert shown["target"] == "_blank" and "code_challenge_method=S256" in shown["href"]
    assert NOTES not in transcript(browser)  # the call waits for the person

    chat = browser.current_window_handle
    browser.find_element(By.CSS_SELECTOR, "#signins .signin[data-tool-call-id='call-notes'] a").click()
    wait_for(browser, lambda d: len(d.window_handles) == 2, "the sign-in tab")
    [tab] = [handle for handle in browser.window_handles if handle != chat]
    browser.switch_to.window(tab)
    wait_for(
        browser,
        lambda d: "Signed in to notes. You can close this tab." in d.find_element(By.TAG_NAME, "body").text,
        "the callback's page",
    )
    assert CALLBACK_PATH in browser.current_url
    browser.close()
    browser.switch_to.window(chat)

    wait_for(browser, lambda d: f"Here they are: {NOTES}" in transcript(d), "the answer with the real notes")
    done = wait_for(
        browser, lambda d: (s := card_state(d, "call-notes")) and s["done"] and s, "the card done"
    )
    assert "went on" in done["text"] and done["links"] == 0
    assert authority.grants == ["authorization_code"]  # one sign-in, one code exchange
