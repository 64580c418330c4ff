"""What both browser suites (the console's, ``tests/console/test_browser.py``, and the HTTP API's chat page,
``tests/api/test_browser*.py``) use to wait for a page: :func:`wait_for`, the one way they wait.

A page redraws as events arrive, so a test never reads it once and asserts: it waits until the page shows
what it expects, polling, and fails with a message naming what never came.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

T = TypeVar("T")

#: Seconds a page may take to show what a test waits for: the stack, the server and the browser share the
#: machine with the rest of the suite.
WAIT = 30


def wait_for(driver: WebDriver, check: Callable[[WebDriver], T], message: str) -> T:
    """The first truthy ``check(driver)``, polled every 0.1 s; selenium's ``TimeoutException`` with
    ``message`` after :data:`WAIT` seconds."""
    return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(lambda d: check(d), message)
