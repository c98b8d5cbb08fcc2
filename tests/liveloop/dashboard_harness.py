"""Test and benchmark helpers for the ops dashboard: a loop's audit store and registry filled with
checkpoints, gate evaluations, samples and history; the dashboard served on a free port; signing in.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from infra.stack import Endpoints
from liveloop.dashboard.app import create_app
from liveloop.dashboard.settings import DashboardSettings
from tests.conftest import free_port
from tests.serving.gateway_server import serve_in_thread

SPEC_HASH = "a" * 64
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass(frozen=True)
class Served:
    """A running dashboard: its URL, settings and the audit store it reads."""

    url: str
    settings: DashboardSettings
    dsn: str


def seed_checkpoints(dsn: str, model_name: str, versions: list[int], samples_per_version: int = 4) -> None:
    """Checkpoint rows for ``versions`` (each the child of the one before), a gate evaluation for each but
    the first (reject for even versions, hold for odd), offset ranges, and samples of each version."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO reward_specs (spec_hash, version, body) VALUES (%s, '1', '{}') ON CONFLICT DO NOTHING",
            (SPEC_HASH,),
        )
        parent = None
        for v in versions:
            checkpoint_id = f"ckpt-{v}-{uuid.uuid4().hex[:8]}"
            manifest = {
                "spec_hashes": [SPEC_HASH],
                "training_config_hash": "c" * 64,
                "reward": {"count": samples_per_version, "mean": 0.1 * v},
                "step": v * 10,
            }
            conn.execute(
                "INSERT INTO checkpoints (checkpoint_id, parent_id, policy_version, base_model, sample_count, manifest,"
                " model_name, model_version) VALUES (%s, %s, %s, 'tiny', %s, %s::jsonb, %s, %s)",
                (
                    checkpoint_id,
                    parent,
                    uuid.uuid4().int % 2_000_000_000,
                    samples_per_version,
                    json.dumps(manifest),
                    model_name,
                    v,
                ),
            )
            conn.execute(
                "INSERT INTO checkpoint_offsets VALUES (%s, 'liveloop.samples', 0, %s, %s)",
                (checkpoint_id, v * 100, v * 100 + 99),
            )
            if parent is not None:
                decision = "reject" if v % 2 == 0 else "hold"
                reasons = [f"reward difference {0.01 * v:.2f} >= 0.00: pass", f"KL {0.1 * v:.2f} <= 1.00: pass"]
                if decision == "reject":
                    reasons.append(f"regression pass rate 0.5{v} < 1.00: fail")
                metrics = {
                    "candidate_reward": 0.5 + 0.01 * v,
                    "champion_reward": 0.5,
                    "difference_ci_low": -0.01,
                    "difference_ci_high": 0.05,
                    "mean_kl": 0.1 * v,
                    "regression_pass_rate": 1.0,
                    "held_out_samples": 40,
                }
                conn.execute(
                    "INSERT INTO evaluations (evaluation_id, checkpoint_id, champion_version, metrics, decision,"
                    " reasons) VALUES (%s, %s, %s, %s::jsonb, %s, %s::jsonb)",
                    (uuid.uuid4(), checkpoint_id, v - 1, json.dumps(metrics), decision, json.dumps(reasons)),
                )
            for i in range(samples_per_version):
                components = {"accepted": 0.75} if i % 2 == 0 else {"rejected": -0.25, "invalid_tool_call": -1.0}
                reward = sum(components.values())
                conn.execute(
                    "INSERT INTO samples (sample_id, generation_id, session_id, user_id, tenant, policy_version,"
                    " reward, components, spec_hash, body) VALUES (%s, %s, 's', 'u', 't', %s, %s, %s::jsonb, %s, '{}')",
                    (uuid.uuid4().hex, uuid.uuid4(), v, reward, json.dumps(components), SPEC_HASH),
                )
            parent = checkpoint_id


@contextmanager
def serve_dashboard(
    endpoints: Endpoints, dsn: str, credentials_path: Path, model_name: str, promotions_topic: str, **more: object
) -> Iterator[Served]:
    """The dashboard app under uvicorn in a thread, on a free port, over the test stack's services; its
    settings are the production defaults (the overview read in the background every ``refresh_s``) but
    for what ``more`` sets."""
    settings = DashboardSettings(
        credentials_path=credentials_path,
        model_name=model_name,
        mlflow_url=endpoints.mlflow_url,
        bootstrap=endpoints.kafka_bootstrap,
        promotions_topic=promotions_topic,
        **more,  # type: ignore[arg-type]
    )
    with serve_in_thread(create_app(settings, dsn), free_port()) as url:
        yield Served(url, settings, dsn)


def csrf_of(html: str) -> str:
    """The CSRF token of the first form on a page."""
    found = _CSRF.search(html)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


def sign_in(client: httpx.Client, key: str, name: str = "alice") -> httpx.Response:
    """Sign ``client`` in with ``key`` the way the form does; the answer is not followed."""
    token = csrf_of(client.get("/signin").text)
    return client.post("/signin", data={"csrf": token, "name": name, "key": key, "next": "/checkpoints"})
