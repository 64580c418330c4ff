"""The chat page answers a tool's question (MCP elicitation) in headless Chromium: the page shows the
question with a field per form property, the person fills it in and presses Answer, and the tool's real
result reaches the transcript — against a real loopback MCP server (2026-07-28) and the deployment-shaped
stack of ``test_browser.py``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from stepagent.api.auth import DevAuth
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.rap.server import serve_in_background
from stepagent.tools.mcp_config import McpServer
from tests.api.test_browser import LiveApi, open_conversation, send, transcript
from tests.browser import wait_for
from tests.client.deployment import FunctionModel, Gate, call, deployment, say
from tests.console.test_browser import Background, browser  # noqa: F401 - the shared browser fixture
from tests.mcp.fixtures.eras import build


def reply(text: str, request: Any) -> list[Any]:
    if text.startswith(("deleted ", "kept ")):
        return say("Tool says: " + text)
    if text == "delete a.txt":
        return call("web__confirm_delete", "call-page-1", path="a.txt")
    return say("ok")


@pytest.fixture(scope="module")
def asking_api() -> Iterator[LiveApi]:
    background = Background()
    stack = AsyncExitStack()
    dev = DevAuth.generate()

    async def start() -> LiveApi:
        base = await stack.enter_async_context(serve_in_background(build().streamable_http_app()))
        server = McpServer(name="web", url=f"{base}/mcp")
        d = await stack.enter_async_context(deployment(FunctionModel(reply), mcp_servers=(server,)))
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, dev.settings, port=0))
        return LiveApi(background, url, dev.token("browser-user"), Gate())

    try:
        yield background.run(start())
    finally:
        background.run(stack.aclose())
        background.stop()


def test_answer_a_tools_question_on_the_chat_page(asking_api: LiveApi, browser: WebDriver) -> None:  # noqa: F811
    open_conversation(browser, asking_api, "page-ask")
    send(browser, "delete a.txt")
    field = wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, ".question input[name='reason']"),
        "the tool's question with its form",
    )
    assert "Why should I delete it?" in browser.find_element(By.ID, "questions").text
    field[0].send_keys("it is old")
    browser.find_element(By.CSS_SELECTOR, ".question button[data-action='accept']").click()
    wait_for(
        browser,
        lambda d: "Tool says: deleted a.txt because it is old" in transcript(d),
        "the tool's real result after the answer",
    )
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, ".question"), "the question gone")
