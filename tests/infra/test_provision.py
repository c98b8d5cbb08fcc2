"""``python -m infra.provision`` (the Kubernetes provisioning job) migrates an external database and creates
the topics from the environment alone, idempotently, and refuses to run without both external addresses."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psycopg
from kafka import KafkaAdminClient

from infra.migrations import load_migrations
from infra.stack import Endpoints
from tests.distill.stream_harness import REPO_ROOT

TOPICS = ("EVENTS", "EVENTS_DLQ", "SAMPLES", "CHECKPOINTS", "PROMOTIONS")


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("LIVELOOP_")}
    return subprocess.run(
        [sys.executable, "-m", "infra.provision"],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_job_migrates_the_database_and_creates_the_topics(endpoints: Endpoints, fresh_database: str) -> None:
    tag = uuid.uuid4().hex[:8]
    env = {
        "LIVELOOP_INFRA_KAFKA_BOOTSTRAP": endpoints.kafka_bootstrap,
        "LIVELOOP_INFRA_POSTGRES_DSN": fresh_database,
        **{f"LIVELOOP_TOPICS_{topic}__NAME": f"test.prov.{tag}.{topic.lower()}" for topic in TOPICS},
        # As the Kubernetes ConfigMap sets it: one field of a topic, the others keep their defaults.
        "LIVELOOP_TOPICS_EVENTS__PARTITIONS": "4",
    }
    for attempt in ("created", "checked"):  # idempotent: the job runs on every deployment
        done = _run(env)
        assert done.returncode == 0, done.stderr
        assert f"topic test.prov.{tag}.events: {attempt}" in done.stderr
    with psycopg.connect(fresh_database) as conn:
        versions = [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [migration.version for migration in load_migrations()]
    admin = KafkaAdminClient(bootstrap_servers=endpoints.kafka_bootstrap)
    try:
        partitions = len(admin.describe_topics([f"test.prov.{tag}.events"])[0]["partitions"])
    finally:
        admin.close()
    assert partitions == 4


def test_without_the_external_addresses_it_refuses_naming_them() -> None:
    done = _run({})
    assert done.returncode == 2
    assert "LIVELOOP_INFRA_KAFKA_BOOTSTRAP and LIVELOOP_INFRA_POSTGRES_DSN" in done.stderr
