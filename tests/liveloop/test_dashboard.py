"""The ops dashboard over HTTP against the real stack: who may look, who may act, and that an action is
recorded exactly as ``liveloop promote/rollback`` record it (history row, alias, announcement)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from infra.credentials import load_credentials
from infra.migrations import migrate
from infra.registry import CANDIDATE, CHAMPION, Registry
from infra.stack import Endpoints, Stack
from serving.promotion import Promoter
from tests.liveloop.dashboard_harness import Served, csrf_of, seed_checkpoints, serve_dashboard, sign_in
from tests.serving.checkpoints import register
from tests.serving.test_promotion import _events


@pytest.fixture
def loop(
    stack: Stack, endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Served]:
    """Three registered versions (v1 champion, v3 candidate), their checkpoints, evaluations and samples."""
    migrate(fresh_database)
    name = f"test-dashboard-{uuid.uuid4().hex[:8]}"
    for i in range(3):
        folder = tmp_path / f"v{i}"
        folder.mkdir()
        (folder / "weights.bin").write_bytes(f"weights {i}".encode())
        register(endpoints.mlflow_url, folder, name)
    seed_checkpoints(fresh_database, name, [1, 2, 3])
    topic = make_topic()
    registry = Registry(endpoints.mlflow_url)
    Promoter(
        registry=registry, dsn=fresh_database, bootstrap=endpoints.kafka_bootstrap, topic=topic, model_name=name
    ).promote(1, actor="liveloop learner init-base", reason="base model")
    registry.set_alias(name, CANDIDATE, 3)
    # The background read every minute only: within a test, what the pages show of MLflow is the first read's
    # or the one an action made, so a page that shows an action's result shows that the action re-read.
    with serve_dashboard(
        endpoints, fresh_database, stack.settings.credentials_path, name, topic, refresh_s=60
    ) as served:
        yield served


def _keys(stack: Stack) -> tuple[str, str]:
    creds = load_credentials(stack.settings.credentials_path)
    assert creds.viewer_key is not None
    return creds.operator_key.get_secret_value(), creds.viewer_key.get_secret_value()


def _champion(served: Served) -> int:
    return int(Registry(served.settings.mlflow_url).version_by_alias(served.settings.model_name, CHAMPION).version)


def test_pages_need_a_key_and_a_wrong_one_is_refused(loop: Served, stack: Stack) -> None:
    with httpx.Client(base_url=loop.url) as client:
        assert client.get("/healthz").status_code == 200
        assert "liveloop_dashboard_requests" in client.get("/metrics").text
        page = client.get("/checkpoints")
        assert page.status_code == 303
        assert page.headers["location"] == "/signin?next=/checkpoints"
        assert client.get("/overview.json").status_code == 401
        wrong = sign_in(client, "llok_not-the-key")
        assert wrong.status_code == 401
        assert "Wrong key" in wrong.text
        assert client.get("/checkpoints").status_code == 303
        # The sign-in form carries a CSRF token too: a POST from elsewhere cannot sign anyone in.
        operator, _ = _keys(stack)
        forged = client.post("/signin", data={"name": "mallory", "key": operator})
        assert forged.status_code == 403
        # A cookie with a forged signature is no session.
        client.cookies.set("liveloop_dashboard", "eyJyIjoib3BlcmF0b3IifQ.00")
        assert client.get("/checkpoints").status_code == 303


def test_viewer_reads_the_gate_reasons_but_cannot_act(loop: Served, stack: Stack) -> None:
    _, viewer = _keys(stack)
    with httpx.Client(base_url=loop.url) as client:
        answer = sign_in(client, viewer, name="victor")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/checkpoints"
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        listing = client.get("/checkpoints")
        assert listing.status_code == 200
        assert "regression pass rate 0.52 &lt; 1.00: fail" in listing.text
        detail = client.get("/checkpoints/3")
        assert detail.status_code == 200
        assert "KL 0.30 &lt;= 1.00: pass" in detail.text
        assert "<svg" in detail.text
        assert 'id="promote"' not in detail.text  # no action buttons for a viewer
        assert client.get("/checkpoints/99").status_code == 404
        overview = client.get("/overview.json").json()
        assert overview["models"]["champion"]["version"] == 1
        assert overview["models"]["candidate"]["version"] == 3
        # Numbers, not strings: the page's script formats them (a Decimal would travel as a string).
        assert overview["trend"] == [{"version": 1, "reward": pytest.approx(-0.25), "acceptance": 0.5}]
        assert client.get("/actions/promote?version=3").status_code == 403
        token = csrf_of(client.get("/history").text)
        refused = client.post(
            "/actions/promote", data={"csrf": token, "version": "3", "reason": "looks good", "confirm": "yes"}
        )
        assert refused.status_code == 403
        assert "Viewers cannot act" in refused.text
    assert _champion(loop) == 1


def test_operator_promotes_and_rolls_back_as_the_cli_records(loop: Served, stack: Stack) -> None:
    operator, _ = _keys(stack)
    with httpx.Client(base_url=loop.url) as client:
        assert sign_in(client, operator, name="olga").status_code == 303
        confirm = client.get("/actions/promote?version=3")
        assert confirm.status_code == 200
        token = csrf_of(confirm.text)
        fields = {"version": "3", "reason": "better reward", "confirm": "yes"}
        # Without the CSRF token, or with another session's: refused, nothing moves.
        assert client.post("/actions/promote", data=fields).status_code == 403
        assert client.post("/actions/promote", data={**fields, "csrf": "0" * 64}).status_code == 403
        # Without a reason or without the confirmation: the form again, with what is missing.
        no_reason = client.post("/actions/promote", data={**fields, "csrf": token, "reason": " "})
        assert no_reason.status_code == 400
        assert "Give a reason" in no_reason.text
        unconfirmed = client.post("/actions/promote", data={"csrf": token, "version": "3", "reason": "x"})
        assert unconfirmed.status_code == 400
        assert "confirmation" in unconfirmed.text
        assert _champion(loop) == 1

        done = client.post("/actions/promote", data={**fields, "csrf": token})
        assert done.status_code == 303, done.text
        assert _champion(loop) == 3
        history = client.get(done.headers["location"])
        assert "better reward" in history.text
        # The action read MLflow again before answering: the next pages show the new champion at once.
        assert client.get("/overview.json").json()["models"]["champion"]["version"] == 3
        assert '<strong id="champion">v3</strong>' in client.get("/checkpoints").text
        again = client.post("/actions/promote", data={**fields, "csrf": token})
        assert again.status_code == 409
        assert "already the champion" in again.text

        back = client.post("/actions/rollback", data={"csrf": token, "reason": "users complain", "confirm": "yes"})
        assert back.status_code == 303, back.text
        assert _champion(loop) == 1
        assert '<strong id="champion">v1</strong>' in client.get("/actions/promote?version=3").text
        filtered = client.get("/history?action=rollback")
        assert "users complain" in filtered.text
        assert "better reward" not in filtered.text

    expected = [
        ("promote", None, 1, "liveloop learner init-base", "base model"),
        ("promote", 1, 3, "olga", "better reward"),
        ("rollback", 3, 1, "olga", "users complain"),
    ]
    with psycopg.connect(loop.dsn) as conn:
        rows = conn.execute(
            "SELECT action, from_version, to_version, actor, reason FROM promotions WHERE model_name = %s ORDER BY id",
            (loop.settings.model_name,),
        ).fetchall()
    assert rows == expected
    events = _events(loop.settings.bootstrap, loop.settings.promotions_topic)
    assert [(e.action, e.from_version, e.to_version, e.actor, e.reason) for e in events] == expected
