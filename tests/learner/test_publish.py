"""Publishing a checkpoint against the real PostgreSQL, MLflow and Kafka: idempotent at every step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from kafka import KafkaConsumer

from distill.samples import HeldOutRule
from infra.migrations import migrate
from infra.registry import CANDIDATE, CHAMPION, Registry
from infra.stack import Endpoints
from learner.manifest import (
    CheckpointAnnouncement,
    CheckpointManifest,
    OffsetRange,
    config_hash,
    hash_folder,
    now_utc,
    write_manifest,
)
from learner.publish import PublishError, publish_checkpoint, register_base
from learner.tiny_model import TinyModelSpec, save_tiny_model


def _checkpoint(
    folder: Path, model_name: str, version: int, parent: str | None, consumed: list[OffsetRange]
) -> CheckpointManifest:
    save_tiny_model(folder, TinyModelSpec(seed=version))
    manifest = CheckpointManifest(
        checkpoint_id=f"{model_name}-v{version:05d}",
        parent_id=parent,
        model_name=model_name,
        base_model="tiny-llama",
        policy_version=version,
        step=version * 3,
        sample_count=sum(r.last_offset - r.first_offset + 1 for r in consumed),
        consumed=consumed,
        training_config={"lr": 1e-3},
        training_config_hash=config_hash({"lr": 1e-3}),
        code_version="test",
        files=hash_folder(folder),
        created_at=now_utc(),
        held_out=HeldOutRule(percent=10),
    )
    write_manifest(folder, manifest)
    return manifest


def _announcements(bootstrap: str, topic: str) -> list[CheckpointAnnouncement]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        return [CheckpointAnnouncement.model_validate_json(record.value) for record in consumer]
    finally:
        consumer.close()


def test_base_then_checkpoint_published_twice_gives_one_version(
    tmp_path: Path, endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str]
) -> None:
    migrate(fresh_database)
    name = f"policy-{tmp_path.name[-8:].lower().replace('_', '-')}"
    uri = endpoints.mlflow_url
    checkpoints_topic = make_topic()
    base = _checkpoint(tmp_path / "base", name, 0, None, [])
    assert register_base(tmp_path / "base", mlflow_uri=uri, dsn=fresh_database) == 1
    assert register_base(tmp_path / "base", mlflow_uri=uri, dsn=fresh_database) == 1  # idempotent

    consumed = [OffsetRange(topic="samples", partition=0, first_offset=0, last_offset=2)]
    first = _checkpoint(tmp_path / "v1", name, 1, base.checkpoint_id, consumed)
    ids = ["a" * 32, "b" * 32, "c" * 32]
    kwargs = {
        "dsn": fresh_database,
        "mlflow_uri": uri,
        "bootstrap": endpoints.kafka_bootstrap,
        "checkpoints_topic": checkpoints_topic,
        "samples_topic": "samples",
        "sample_ids": ids,
    }
    once = publish_checkpoint(tmp_path / "v1", **kwargs)  # type: ignore[arg-type]
    again = publish_checkpoint(tmp_path / "v1", **kwargs)  # type: ignore[arg-type]  # as after a crash

    assert (once.model_version, again.model_version, once.run_id) == (2, 2, again.run_id)
    registry = Registry(uri)
    assert int(registry.version_by_alias(name, CHAMPION).version) == 1
    assert int(registry.version_by_alias(name, CANDIDATE).version) == 2
    assert len(registry.client.search_model_versions(f"name = '{name}'")) == 2
    with psycopg.connect(fresh_database) as conn:
        rows = conn.execute(
            "SELECT checkpoint_id, parent_id, policy_version, model_version FROM checkpoints ORDER BY policy_version"
        ).fetchall()
        offsets = conn.execute("SELECT topic, kafka_partition, first_offset, last_offset FROM checkpoint_offsets")
        samples = conn.execute("SELECT sample_id FROM checkpoint_samples ORDER BY sample_id").fetchall()
        history = conn.execute("SELECT action, from_version, to_version FROM promotions").fetchall()
        assert rows == [(base.checkpoint_id, None, 0, 1), (first.checkpoint_id, base.checkpoint_id, 1, 2)]
        assert offsets.fetchall() == [("samples", 0, 0, 2)]
    assert [row[0] for row in samples] == ids
    assert history == [("promote", None, 1)]
    announced = _announcements(endpoints.kafka_bootstrap, checkpoints_topic)
    assert [(a.checkpoint_id, a.model_version) for a in announced] == [(first.checkpoint_id, 2)] * 2

    # A sample already trained by v1 cannot be claimed by another checkpoint.
    more = [OffsetRange(topic="samples", partition=0, first_offset=3, last_offset=3)]
    _checkpoint(tmp_path / "v2", name, 2, first.checkpoint_id, more)
    with pytest.raises(PublishError, match="trains one checkpoint at most"):
        publish_checkpoint(tmp_path / "v2", **{**kwargs, "sample_ids": ["a" * 32]})  # type: ignore[arg-type]
