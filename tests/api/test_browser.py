"""The chat page in headless Chromium (Debian's chromium and chromium-driver, driven by Selenium, as the
console's browser test): paste a dev token, send, see the reply stream in, reload mid-reply and see it go on,
and approve a call. One stack and one API server on an event loop in a background thread, so the blocking
browser calls never stall them; the model pauses mid-reply on a gate the test opens.

The approval test needs the worker's tool approval (``STEPAGENT_APPROVAL``): it passes once that is merged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from stepagent.api.auth import DevAuth
from stepagent.api.server import open_api
from stepagent.client import Client
from tests.browser import wait_for
from tests.client.deployment import FunctionModel, Gate, call, deployment, say
from tests.console.test_browser import Background, browser  # noqa: F401 - the shared browser fixture


@dataclass
class LiveApi:
    background: Background
    url: str
    token: str
    gate: Gate


def reply(text: str, request: Any, gate: Gate) -> list[Any]:
    thread = request.thread_stack[-1]
    if text.startswith("You are now INSIDE"):
        return call("close_thread", "call-close", thread_id=thread, report_to_parent="child: counted")
    if text == "delegate":
        return call("spawn_thread", "call-spawn", instructions="count to three", child_of=[thread])
    if text.startswith("Child thread is successfully spawned"):
        return say("A helper is on it.")
    if "has shut down" in text:
        return say("The helper is done.")
    if "story" in text:
        return say("Once upon ", "a time, ", gate, "the end.")
    if "time" in text and "UTC" not in text:
        return call("get_time", "call-approve-1")
    if "UTC" in text:
        return say("Time received.")
    return say("ok")


@pytest.fixture(scope="module")
def live_api() -> Iterator[LiveApi]:
    background = Background()
    stack = AsyncExitStack()
    gate = Gate()
    dev = DevAuth.generate()

    async def start() -> LiveApi:
        model = FunctionModel(lambda text, request: reply(text, request, gate))
        d = await stack.enter_async_context(
            deployment(model, agent_settings={"STEPAGENT_APPROVAL": "get_time"})
        )
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, dev.settings, port=0))
        return LiveApi(background, url, dev.token("browser-user"), gate)

    try:
        yield background.run(start())
    finally:
        gate.open()
        background.run(stack.aclose())
        background.stop()


def click(driver: WebDriver, selector: str, message: str) -> None:
    """Click the first element matching ``selector`` once there is one. The page redraws its transcript as
    events arrive, so an element found a moment ago may be gone: find it again and retry until a click
    lands on a live element."""

    def attempt(d: WebDriver) -> bool:
        try:
            found = d.find_elements(By.CSS_SELECTOR, selector)
            if not found:
                return False
            found[0].click()
            return True
        except StaleElementReferenceException:
            return False

    wait_for(driver, attempt, message)


def open_conversation(browser: WebDriver, api: LiveApi, thread: str) -> None:  # noqa: F811
    browser.get(api.url + "/")
    token = browser.find_element(By.ID, "token")
    token.clear()
    token.send_keys(api.token)
    box = browser.find_element(By.ID, "thread")
    box.clear()
    box.send_keys(thread)
    browser.find_element(By.CSS_SELECTOR, "#session button").click()


def send(browser: WebDriver, text: str) -> None:  # noqa: F811
    browser.find_element(By.ID, "text").send_keys(text)
    browser.find_element(By.CSS_SELECTOR, "#send button").click()


def live(browser: WebDriver) -> str:  # noqa: F811
    return str(browser.find_element(By.ID, "live").text)


def transcript(browser: WebDriver) -> str:  # noqa: F811
    return str(browser.find_element(By.ID, "transcript").text)


def test_send_see_the_reply_stream_reload_mid_reply_and_see_it_go_on(
    live_api: LiveApi,
    browser: WebDriver,  # noqa: F811
) -> None:
    open_conversation(browser, live_api, "page-story")
    send(browser, "tell me a story")
    wait_for(browser, lambda d: "tell me a story" in transcript(d), "the sent message in the transcript")
    wait_for(browser, lambda d: "Once upon a time," in live(d), "the reply streaming in")
    assert "Once upon" not in transcript(browser), "partial text is not shown as committed"
    browser.refresh()
    wait_for(browser, lambda d: "Once upon a time," in live(d), "the reply again after the reload")
    assert "tell me a story" in transcript(browser)
    live_api.gate.open()
    wait_for(browser, lambda d: "Once upon a time, the end." in transcript(d), "the committed reply")
    wait_for(browser, lambda d: live(d) == "", "the live text gone once committed")
    assert transcript(browser).count("Once upon a time, the end.") == 1


def test_approve_a_call(live_api: LiveApi, browser: WebDriver) -> None:  # noqa: F811
    open_conversation(browser, live_api, "page-approve")
    send(browser, "what time is it")
    click(
        browser,
        ".approval button[data-decision='approve']",
        "the approval request (needs the worker's tool approval, STEPAGENT_APPROVAL)",
    )
    wait_for(browser, lambda d: "Time received." in transcript(d), "the call run after the approval")


def test_a_child_threads_work_is_folded_under_the_conversation(
    live_api: LiveApi,
    browser: WebDriver,  # noqa: F811
) -> None:
    open_conversation(browser, live_api, "page-child")
    send(browser, "delegate")
    wait_for(browser, lambda d: "The helper is done." in transcript(d), "the root's answer after its child")
    # The conversation reads as the user's: the child's seed prompt and calls are not shown...
    assert "INSIDE" not in transcript(browser) and "close_thread" not in transcript(browser)
    # Read in one script: the page may redraw between two WebDriver calls.
    folded, first_root_item = browser.execute_script(
        "const folds = [...document.querySelectorAll('#transcript li.child-thread details')];"
        "const roots = document.querySelectorAll('#transcript > li:not(.child-thread)');"
        "return [folds.map(d => d.open), roots[0].innerText];"
    )
    assert folded == [False]
    assert first_root_item == "delegate"
    # ...until the user unfolds it.
    click(browser, "#transcript li.child-thread details summary", "the folded child thread")
    wait_for(browser, lambda d: "You are now INSIDE" in transcript(d), "the child's work, unfolded")
