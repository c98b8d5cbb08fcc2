"""A headless Debian Chromium driven by Selenium, for the dashboard's browser tests; screenshots of each
page go to ``dashboard-screenshots/`` (git-ignored) for review. Nothing downloads a browser."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.http_process import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = ROOT / "dashboard-screenshots"


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[WebDriver]:
    """Headless Chromium at ``width`` x ``height``; quit afterwards. Skips where Debian's packages are missing."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("install Debian's chromium and chromium-driver (.ci/run does) to run the browser tests")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    if width < 500:
        # Headless Chromium keeps its window at least 500 px wide; a phone's width needs emulating.
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": True}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: WebDriver, name: str) -> None:
    """Save the whole page as ``dashboard-screenshots/<name>.png``."""
    SCREENSHOTS.mkdir(exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, max(int(height) + 120, 600))
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds, or fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def sign_in_with(driver: WebDriver, url: str, name: str, key: str, *, accepted: bool = True) -> None:
    """Fill and send the sign-in form as a person would; with ``accepted``, wait until it let us in."""
    driver.get(f"{url}/signin")
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "signin").click()
    if accepted:
        wait_for(lambda: "/signin" not in driver.current_url, "signing in")
    else:
        wait_for(lambda: bool(driver.find_elements(By.ID, "message")), "the sign-in page's message")


def text_of(driver: WebDriver, element_id: str) -> str:
    """The visible text of the element with ``element_id``."""
    return str(driver.find_element(By.ID, element_id).text)
