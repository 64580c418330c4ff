"""The console answers a tool's question in a real browser (headless Chromium, as ``test_browser.py``):
the conversation page shows the question's form, an Accept with a required field empty says why and
sends nothing, and a filled-in form reaches the tool (a real loopback MCP server, 2026-07-28), whose result
then appears without a reload."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from stepagent.client import Client
from stepagent.console.server import open_console
from stepagent.rap.server import serve_in_background
from stepagent.tools.mcp_config import McpServer
from tests.browser import wait_for
from tests.client.deployment import deployment
from tests.console.asking import booking_model, build
from tests.console.test_browser import (
    Background,
    LiveConsole,
    browser,  # noqa: F401 - the shared browser fixture
    screenshot,
    text_shown,
)


def on_the_form(driver: WebDriver, act: Callable[[WebElement], None], message: str) -> None:
    """Run ``act`` on the question's form as it is now: the page redraws its live part when the thread
    changes (what was typed is carried over), so an element found a moment ago may be gone — find it again
    and retry until ``act`` ran on a live form."""

    def attempt(d: WebDriver) -> bool:
        try:
            act(d.find_element(By.CSS_SELECTOR, "form.question"))
            return True
        except StaleElementReferenceException:
            return False

    wait_for(driver, attempt, message)


@pytest.fixture(scope="module")
def asking_console() -> Iterator[LiveConsole]:
    background = Background()
    stack = AsyncExitStack()

    async def start() -> LiveConsole:
        base = await stack.enter_async_context(serve_in_background(build().streamable_http_app()))
        server = McpServer(name="hotel", url=f"{base}/mcp")
        d = await stack.enter_async_context(deployment(booking_model(), mcp_servers=(server,)))
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_console(client, port=0))
        return LiveConsole(background, d, client, url)

    try:
        yield background.run(start())
    finally:
        background.run(stack.aclose())
        background.stop()


def test_answer_a_tools_question_in_the_console(asking_console: LiveConsole, browser: WebDriver) -> None:  # noqa: F811
    asking_console.background.run(asking_console.client.send("web-ask", "book a room"))
    browser.get(asking_console.url + "/c/web-ask")
    wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "form.question input[name='field.guests']"),
        "the tool's question with its form",
    )
    asked = browser.find_element(By.CSS_SELECTOR, "form.question").text
    assert "hotel__book asks you: How should I book the room?" in asked
    assert "waiting on a choice" in browser.find_element(By.CSS_SELECTOR, ".summary").text

    # A required field left empty: the reason, and the question still waits.
    on_the_form(
        browser, lambda form: form.find_element(By.CSS_SELECTOR, "button[value='accept']").click(), "accept"
    )
    flash = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#flash-js.error"), "the refusal")[0]
    assert "the answer was not sent" in flash.text and "Guests is required" in flash.text
    assert "Vegetarian is required" in flash.text and "Room is required" in flash.text

    def fill(form: WebElement) -> None:
        guests = form.find_element(By.NAME, "field.guests")
        guests.clear()
        guests.send_keys("3")
        Select(form.find_element(By.NAME, "field.vegetarian")).select_by_visible_text("yes")
        Select(form.find_element(By.NAME, "field.room")).select_by_visible_text("double")
        note = form.find_element(By.NAME, "field.note")
        note.clear()
        note.send_keys("<b>late</b> arrival")

    on_the_form(browser, fill, "the form filled in")
    # A redraw of the page's live part (as another thread's progress causes) keeps what was typed.
    browser.execute_script("document.getElementById('live').setAttribute('data-signature', 'stale');")
    wait_for(
        browser,
        lambda d: d.find_element(By.ID, "live").get_attribute("data-signature") != "stale",
        "the live part redrawn",
    )
    typed = browser.execute_script(
        "return ['guests', 'vegetarian', 'room', 'note'].map("
        "n => document.querySelector(`form.question [name='field.${n}']`).value);"
    )
    assert typed == ["3", "true", "double", "<b>late</b> arrival"]
    screenshot(browser, "question")
    on_the_form(
        browser, lambda form: form.find_element(By.CSS_SELECTOR, "button[value='accept']").click(), "accept"
    )
    wait_for(
        browser,
        lambda d: text_shown(
            d,
            "Tool says: booked 3 guests in Lisbon, budget 100.0, vegetarian True, double room, "
            "note '<b>late</b> arrival'",
        ),
        "the tool's real result after the answer, without a reload",
    )
    wait_for(
        browser,
        lambda d: not d.find_elements(By.CSS_SELECTOR, "form.question"),
        "the answered question gone once the call is over",
    )
