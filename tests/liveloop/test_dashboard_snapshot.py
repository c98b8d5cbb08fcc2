"""The dashboard's background snapshot (what MLflow and the components say, read off the request path):
nothing before the first read, then the latest read with its age; an older read that ends late never
replaces a newer one; a failed read keeps the last good one; the thread reads without being asked.
And the pages before the first read: they say "loading" rather than fail. No service is needed.
"""

from __future__ import annotations

import threading
from pathlib import Path

from fastapi.testclient import TestClient

from infra.credentials import ensure_credentials
from liveloop.dashboard.app import create_app
from liveloop.dashboard.settings import DashboardSettings
from liveloop.dashboard.snapshot import Snapshot
from tests.liveloop.dashboard_harness import sign_in


def test_nothing_before_the_first_read_then_the_latest_with_its_age() -> None:
    reads = iter(range(1, 100))
    snapshot = Snapshot(lambda: next(reads), period_s=60, name="test")
    assert snapshot.latest() is None
    first = snapshot.refresh()
    assert first is not None
    assert first.value == 1
    assert first.age_s() >= 0
    assert snapshot.refresh() is not None
    taken = snapshot.latest()
    assert taken is not None
    assert taken.value == 2


def test_a_read_that_began_earlier_never_replaces_a_later_one() -> None:
    # The background read begins, an operator's action reads afresh and finishes, then the background read
    # finishes: the action's (newer) view must stay.
    entered, release = threading.Event(), threading.Event()
    calls = iter(["background, begun before the action", "after the action"])

    def compute() -> str:
        value = next(calls)
        if value.startswith("background"):
            entered.set()
            release.wait()
        return value

    snapshot = Snapshot(compute, period_s=60, name="test")
    background = threading.Thread(target=snapshot.refresh)
    background.start()
    assert entered.wait(60)
    after = snapshot.refresh()
    assert after is not None
    assert after.value == "after the action"
    release.set()
    background.join(60)
    taken = snapshot.latest()
    assert taken is not None
    assert taken.value == "after the action"


def test_a_failed_read_keeps_the_last_good_one() -> None:
    outcomes: list[str | None] = ["good", None]

    def compute() -> str:
        value = outcomes.pop(0)
        if value is None:
            raise OSError("the registry hung up")
        return value

    snapshot = Snapshot(compute, period_s=60, name="test")
    snapshot.refresh()
    kept = snapshot.refresh()
    assert kept is not None
    assert kept.value == "good"


def test_the_thread_reads_without_being_asked_and_stops() -> None:
    count = 0
    second = threading.Event()

    def compute() -> int:
        nonlocal count
        count += 1
        if count >= 2:
            second.set()
        return count

    snapshot = Snapshot(compute, period_s=0.01, name="test")
    snapshot.start()
    try:
        assert snapshot.latest(wait_s=60) is not None  # the first read, made by the thread
        assert second.wait(60)  # and again after the period, with no page asking
    finally:
        snapshot.stop()
    stopped_at = count
    snapshot.refresh()
    assert count == stopped_at + 1  # only the read asked for: the thread is gone


def test_pages_before_the_first_read_say_loading(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials.json"
    operator = ensure_credentials(credentials).operator_key.get_secret_value()
    # Nothing listens at these addresses; without the lifespan (no `with`), no read ever starts.
    settings = DashboardSettings(credentials_path=credentials, mlflow_url="http://127.0.0.1:9", bootstrap="127.0.0.1:9")
    app = create_app(settings, "postgresql://nobody@127.0.0.1:9/none")
    app.state.dashboard.overview.first_wait_s = 0  # the wait once for the first read, made short here
    client = TestClient(app, follow_redirects=False)
    assert sign_in(client, operator).status_code == 303
    page = client.get("/")
    assert page.status_code == 200
    assert "loading" in page.text
    doc = client.get("/overview.json").json()
    assert doc["loading"] is True
    assert doc["models"]["champion"] is None
    confirm = client.get("/actions/promote?version=3")
    assert confirm.status_code == 200
    assert "MLflow not read yet" in confirm.text
