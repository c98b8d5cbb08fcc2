"""The dashboard in a real headless Chromium against the real stack, with a real gateway serving and the
archiver archiving its generation events: sign in, watch the overview move with traffic, read a
candidate's gate reasons, promote it and see the gateway serve it, roll back; a viewer cannot act, a
forged POST and a wrong key are refused. Each page is saved to ``dashboard-screenshots/``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from infra.credentials import load_credentials
from infra.migrations import migrate
from infra.registry import CANDIDATE, Registry
from infra.stack import Endpoints, Stack
from liveloop.dashboard.settings import ComponentProbe
from serving.promotion import Promoter
from tests.http_process import ROOT
from tests.liveloop.browser import chromium, screenshot, sign_in_with, text_of, wait_for
from tests.liveloop.dashboard_harness import seed_checkpoints, serve_dashboard
from tests.serving.checkpoints import register, write_checkpoint
from tests.serving.gateway_server import GatewayProcess, gateway_process


def _served_version(gateway: GatewayProcess, model: str) -> str:
    answer = httpx.post(
        f"{gateway.url}/v1/completions",
        headers={"Authorization": f"Bearer {gateway.key}"},
        json={"model": model, "prompt": "def add(a, b):", "max_tokens": 2, "temperature": 0},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return answer.headers["x-liveloop-policy-version"]


def _traffic(gateway: GatewayProcess, model: str, stop: threading.Event) -> None:
    while not stop.is_set():
        _served_version(gateway, model)
        stop.wait(0.2)


@pytest.fixture
def archiver(
    endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str], tmp_path: Path
) -> Iterator[str]:
    """``python -m ingest.archiver`` on a fresh events topic into the fresh audit store; yields the topic."""
    migrate(fresh_database)
    events, dlq = make_topic(), make_topic()
    env = os.environ | {
        "LIVELOOP_ARCHIVER_BOOTSTRAP": endpoints.kafka_bootstrap,
        "LIVELOOP_ARCHIVER_DSN": fresh_database,
        "LIVELOOP_ARCHIVER_EVENTS_TOPIC": events,
        "LIVELOOP_ARCHIVER_DLQ_TOPIC": dlq,
        "LIVELOOP_ARCHIVER_GROUP_ID": f"archiver-{uuid.uuid4().hex[:8]}",
    }
    with (tmp_path / "archiver.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "ingest.archiver"], cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        yield events
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_operator_and_viewer_in_a_browser(
    stack: Stack,
    endpoints: Endpoints,
    fresh_database: str,
    archiver: str,
    make_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    name = f"test-browser-{uuid.uuid4().hex[:8]}"
    folders = []
    for version in (1, 2, 3):
        folder = tmp_path / f"v{version}"
        write_checkpoint(folder, model_name=name, policy_version=version, seed=version)
        assert register(endpoints.mlflow_url, folder, name) == version
        folders.append(folder)
    seed_checkpoints(fresh_database, name, [1, 2, 3])
    promotions = make_topic()
    registry = Registry(endpoints.mlflow_url)
    Promoter(
        registry=registry, dsn=fresh_database, bootstrap=endpoints.kafka_bootstrap, topic=promotions, model_name=name
    ).promote(1, actor="liveloop learner init-base", reason="base model")
    creds = load_credentials(stack.settings.credentials_path)
    assert creds.viewer_key is not None
    operator, viewer = creds.operator_key.get_secret_value(), creds.viewer_key.get_secret_value()

    gateway_settings = {"MODEL_NAME": name, "PROMOTIONS_TOPIC": promotions, "MODEL_VERSION": "1"}
    with (
        # A gateway on a busy 2-core machine (it loads the champion from the registry) takes minutes to start.
        gateway_process(endpoints, archiver, tmp_path / "gw", folders[0], 400, **gateway_settings) as gateway,
        serve_dashboard(
            endpoints,
            fresh_database,
            stack.settings.credentials_path,
            name,
            promotions,
            components=[ComponentProbe(name="gateway", health_url=f"{gateway.url}/healthz")],
        ) as dashboard,
        chromium() as driver,
    ):
        url = dashboard.url
        assert _served_version(gateway, name) == "1"
        # The learner's candidate, once the gateway serves (staging it would otherwise slow the gateway's start).
        registry.set_alias(name, CANDIDATE, 3)
        _wrong_key_and_viewer(driver, url, viewer)
        stop = threading.Event()
        traffic = threading.Thread(target=_traffic, args=(gateway, name, stop), daemon=True)
        try:
            _overview_moves(driver, url, operator, traffic.start)
        finally:
            stop.set()
            if traffic.is_alive():
                traffic.join(timeout=60)
        _promote_and_roll_back(driver, url, gateway, name)
        with chromium(width=400, height=800) as narrow:
            sign_in_with(narrow, url, "olga", operator)
            assert narrow.execute_script("return window.innerWidth") == 400
            # Nothing wider than the window on a phone: the page does not scroll sideways.
            assert narrow.execute_script("return document.documentElement.scrollWidth") <= 400
            screenshot(narrow, "narrow-overview")


def _wrong_key_and_viewer(driver: WebDriver, url: str, viewer: str) -> None:
    sign_in_with(driver, url, "mallory", "llok_wrong", accepted=False)
    assert "Wrong key" in text_of(driver, "message")
    screenshot(driver, "signin-wrong-key")
    sign_in_with(driver, url, "victor", viewer)
    driver.get(f"{url}/checkpoints")
    assert "fail" in text_of(driver, "checkpoints")  # the gate's reasons are there to read
    driver.get(f"{url}/checkpoints/3")
    assert not driver.find_elements(By.ID, "promote")  # a viewer has no action buttons
    driver.get(f"{url}/actions/promote?version=3")
    assert "Viewers cannot act" in text_of(driver, "message")
    screenshot(driver, "viewer-refused")
    driver.find_element(By.CSS_SELECTOR, ".signout button").click()
    wait_for(lambda: "/signin" in driver.current_url, "the sign-in page after signing out")


def _overview_moves(driver: WebDriver, url: str, operator: str, start_traffic: Callable[[], None]) -> None:
    sign_in_with(driver, url, "olga", operator)
    driver.get(url + "/")
    driver.execute_script("window.notReloaded = true")
    start = text_of(driver, "updated")
    before = float(text_of(driver, "events-per-s"))  # about 0: only the request that checked the gateway
    start_traffic()
    # The page polls: the archived events of the traffic show up as events/s, without a reload.
    wait_for(lambda: float(text_of(driver, "events-per-s")) >= before + 0.05, "events/s to rise", 120)
    wait_for(lambda: text_of(driver, "updated") != start, "the overview's time to move")
    assert text_of(driver, "updated").startswith("20"), text_of(driver, "updated")  # a time, not a failed poll
    assert driver.execute_script("return window.notReloaded") is True
    assert "gateway" in text_of(driver, "components")
    assert text_of(driver, "champion").startswith("v1")
    screenshot(driver, "overview")
    # A forged POST from the page's own origin, without the CSRF token, is refused and changes nothing.
    status = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/actions/promote', {method: 'POST', body: new URLSearchParams("
        "{version: '3', reason: 'forged', confirm: 'yes'})}).then(r => done(r.status));"
    )
    assert status == 403


def _promote_and_roll_back(driver: WebDriver, url: str, gateway: GatewayProcess, model: str) -> None:
    driver.get(f"{url}/checkpoints")
    screenshot(driver, "checkpoints")
    driver.find_element(By.LINK_TEXT, "v3").click()
    reasons = text_of(driver, "reasons")
    assert "KL 0.30 <= 1.00: pass" in reasons
    assert text_of(driver, "decision").startswith("hold")
    screenshot(driver, "checkpoint-v3")
    driver.find_element(By.ID, "promote").click()
    screenshot(driver, "confirm-promote")
    driver.find_element(By.ID, "reason").send_keys("better reward on the held-out samples")
    driver.find_element(By.ID, "confirm").click()
    driver.find_element(By.ID, "do").click()
    wait_for(lambda: "/history" in driver.current_url, "the history after promoting")
    first = driver.find_element(By.CSS_SELECTOR, "#history tbody tr").text
    assert "promote 1 3 olga better reward on the held-out samples" in first
    screenshot(driver, "history")
    wait_for(lambda: _served_version(gateway, model) == "3", "the gateway to serve version 3", 300)

    driver.get(f"{url}/checkpoints/3")
    driver.find_element(By.ID, "rollback").click()
    driver.find_element(By.ID, "reason").send_keys("users complain")
    driver.find_element(By.ID, "confirm").click()
    driver.find_element(By.ID, "do").click()
    wait_for(lambda: "/history" in driver.current_url, "the history after rolling back")
    assert "rollback 3 1 olga users complain" in driver.find_element(By.CSS_SELECTOR, "#history tbody tr").text
    wait_for(lambda: _served_version(gateway, model) == "1", "the gateway to serve version 1 again", 300)
