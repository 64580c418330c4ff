"""The console in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``, which
``.ci/run`` installs) driven by Selenium, against a deployment-shaped stack on moto running the scripted
agent of tests/console/helpers.py. One stack, one console and one browser for the module; the stack and the
console run on an event loop in a background thread, so the browser calls (blocking) never stall them.

``STEPAGENT_SCREENSHOTS=1`` also saves the screenshots of the README (``docs/console-*.png``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from stepagent.aws import dlq
from stepagent.client import Client
from stepagent.console.server import open_console
from stepagent.messages import InputMessage
from tests.client.deployment import Deployment, deployment
from tests.console.helpers import scripted_model

T = TypeVar("T")
CHROMIUM, CHROMEDRIVER = (
    shutil.which("chromium") or "/usr/bin/chromium",
    shutil.which("chromedriver") or "/usr/bin/chromedriver",
)
DOCS = Path(__file__).resolve().parents[2] / "docs"

if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    if os.environ.get("CI"):
        raise RuntimeError("CI must have chromium and chromium-driver (.ci/run installs them)")
    pytest.skip(
        "no chromium/chromedriver here (apt-get install chromium chromium-driver)", allow_module_level=True
    )

from selenium import webdriver  # noqa: E402 - only once the browser is known to be there
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

from tests.browser import wait_for  # noqa: E402 - it imports selenium, so after the check too


class Background:
    """An event loop in a daemon thread; :meth:`run` runs a coroutine on it and waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="console-stack", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class LiveConsole:
    background: Background
    deployment: Deployment
    client: Client
    url: str

    def settle(self, thread: str) -> None:
        async def settle() -> None:
            async for _ in self.client.replies(thread, timeout=60):
                pass

        self.background.run(settle())


@pytest.fixture(scope="module")
def console() -> Iterator[LiveConsole]:
    background = Background()
    stack = AsyncExitStack()

    async def start() -> LiveConsole:
        d = await stack.enter_async_context(deployment(scripted_model()))
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_console(client, port=0))
        return LiveConsole(background, d, client, url)

    try:
        yield background.run(start())
    finally:
        background.run(stack.aclose())
        background.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="stepagent-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for drivers online
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def text_shown(driver: WebDriver, text: str) -> bool:
    return text in driver.find_element(By.ID, "live").text


def screenshot(driver: WebDriver, name: str, height: int | None = None) -> None:
    if not os.environ.get("STEPAGENT_SCREENSHOTS"):
        return
    if height is None:
        height = min(2400, int(driver.execute_script("return document.documentElement.scrollHeight")))
    driver.set_window_size(1280, height)
    driver.save_screenshot(str(DOCS / f"console-{name}.png"))
    driver.set_window_size(1280, 900)


def send(driver: WebDriver, text: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, "#send textarea")
    box.send_keys(text)
    driver.find_element(By.CSS_SELECTOR, "#send button").click()


def test_a_conversation_that_ran_a_tool_and_spawned_a_child_shows_both_threads(
    console: LiveConsole, browser: WebDriver
) -> None:
    console.background.run(console.client.send("web-plan", "plan the day"))
    console.settle("web-plan")
    browser.get(console.url + "/")
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-thread-id="web-plan"]'), "listed")
    browser.find_element(By.LINK_TEXT, "web-plan").click()
    sections = wait_for(
        browser,
        lambda d: (
            len(d.find_elements(By.CSS_SELECTOR, "section.thread")) == 2
            and d.find_elements(By.CSS_SELECTOR, "section.thread")
        ),
        "two threads",
    )
    root, child = sections
    assert root.get_attribute("data-thread-id") == "web-plan"
    assert "TOOL CALL get_time" in root.text and "Got the report." in root.text
    assert "report_to_parent" in child.text and "close_thread" in child.text
    nodes = browser.find_elements(By.CSS_SELECTOR, ".tree li.node")
    assert [n.get_attribute("data-node") for n in nodes] == [
        "web-plan",
        child.get_attribute("data-thread-id"),
    ]
    assert browser.find_element(By.CSS_SELECTOR, ".tree li.node li.node").get_attribute(
        "data-node"
    ) == child.get_attribute("data-thread-id")
    screenshot(browser, "conversation")


def test_send_a_message_and_see_the_reply_appear_without_a_reload(
    console: LiveConsole, browser: WebDriver
) -> None:
    browser.get(console.url + "/open?thread=web-chat")
    wait_for(
        browser, lambda d: "No conversation 'web-chat' yet" in d.page_source, "a new conversation's page"
    )
    browser.execute_script("window.stillThisPage = 42;")
    send(browser, "hello there")
    wait_for(browser, lambda d: text_shown(d, "Hello back, friend."), "the reply, without a reload")
    assert browser.execute_script("return window.stillThisPage;") == 42
    assert browser.find_element(By.CSS_SELECTOR, "#send textarea").get_attribute("value") == ""


def test_answer_a_choice(console: LiveConsole, browser: WebDriver) -> None:
    browser.get(console.url + "/c/web-chat")
    send(browser, "pick a color")
    blue = wait_for(
        browser,
        lambda d: d.find_elements(By.XPATH, "//form[@class='choice']//button[text()='blue']"),
        "the question",
    )
    assert "Which color?" in browser.find_element(By.CSS_SELECTOR, "form.choice").text
    assert "waiting on a choice" in browser.find_element(By.CSS_SELECTOR, ".summary").text
    screenshot(browser, "choice")
    blue[0].click()
    wait_for(browser, lambda d: text_shown(d, "Blue it is."), "the tool's answer and the model's reply")
    # The reply and the pending-choice panel refresh on separate polls: wait for the panel too.
    wait_for(
        browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "form.choice"), "the answered choice gone"
    )


def test_redrive_a_dead_lettered_message_and_see_it_processed(
    console: LiveConsole, browser: WebDriver
) -> None:
    async def dead_letter() -> None:
        sqs = console.deployment.services.runtime.sqs
        url = await dlq.dead_letter_queue(sqs, str(console.deployment.settings.input_queue_url))
        body = InputMessage.user_text(
            "web-dlq", "hello from the dead letters", id="web-dlq-1"
        ).model_dump_json()
        await sqs.send_message(
            QueueUrl=url,
            MessageBody=body,
            MessageGroupId="web-dlq",
            MessageDeduplicationId="web-dlq-1",
            MessageAttributes={
                "stepagent_error": {"DataType": "String", "StringValue": "the model provider was down"}
            },
        )

    console.background.run(dead_letter())
    browser.get(console.url + "/dlq")
    row = wait_for(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, "table.dlq tbody tr"), "the dead letter"
    )[0]
    assert "web-dlq" in row.text and "the model provider was down" in row.text
    screenshot(browser, "dlq", 500)
    row.find_element(By.TAG_NAME, "button").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "dlq-empty"), "the DLQ empty after the redrive")
    browser.get(console.url + "/c/web-dlq")
    wait_for(
        browser,
        lambda d: d.find_elements(By.ID, "live") and text_shown(d, "Hello back, friend."),
        "processed",
    )
    assert "hello from the dead letters" in browser.find_element(By.ID, "live").text
    browser.get(console.url + "/")
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "table.list tbody tr")) == 3, "3 listed")
    screenshot(browser, "list", 520)
