"""Publishing a checkpoint against the real PostgreSQL, MLflow and Kafka: idempotent at every step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from kafka import KafkaConsumer

from distill.samples import HeldOutRule
from infra.migrations import migrate
from infra.registry import CANDIDATE, CHAMPION, AliasNotSet, Registry
from infra.stack import Endpoints
from learner.manifest import (
    BASE_POLICY_VERSION,
    CheckpointAnnouncement,
    CheckpointManifest,
    OffsetRange,
    config_hash,
    hash_folder,
    now_utc,
    write_manifest,
)
from learner.publish import VERSION_TAG, PublishError, publish_checkpoint, register_base
from learner.tiny_model import TinyModelSpec, save_tiny_model
from tests.learner.learner_harness import register_elsewhere


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


def _model_name(tmp_path: Path) -> str:
    return f"policy-{tmp_path.name[-8:].lower().replace('_', '-')}"


def test_base_then_checkpoint_published_twice_gives_one_version(
    tmp_path: Path, endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str]
) -> None:
    migrate(fresh_database)
    name = _model_name(tmp_path)
    uri = endpoints.mlflow_url
    checkpoints_topic = make_topic()
    base = _checkpoint(tmp_path / "base", name, BASE_POLICY_VERSION, None, [])
    assert register_base(tmp_path / "base", mlflow_uri=uri, dsn=fresh_database) == 1
    assert register_base(tmp_path / "base", mlflow_uri=uri, dsn=fresh_database) == 1  # idempotent

    consumed = [OffsetRange(topic="samples", partition=0, first_offset=0, last_offset=2)]
    first = _checkpoint(tmp_path / "v2", name, 2, base.checkpoint_id, consumed)
    ids = ["a" * 32, "b" * 32, "c" * 32]
    kwargs = {
        "dsn": fresh_database,
        "mlflow_uri": uri,
        "bootstrap": endpoints.kafka_bootstrap,
        "checkpoints_topic": checkpoints_topic,
        "samples_topic": "samples",
        "sample_ids": ids,
    }
    once = publish_checkpoint(tmp_path / "v2", **kwargs)  # type: ignore[arg-type]
    again = publish_checkpoint(tmp_path / "v2", **kwargs)  # type: ignore[arg-type]  # as after a crash

    assert (once.model_version, again.model_version, once.run_id) == (2, 2, again.run_id)
    # One number names the checkpoint: its version is its MLflow version, in the announcement and the registry.
    assert (once.policy_version, again.policy_version) == (2, 2)
    registry = Registry(uri)
    assert int(registry.version_by_alias(name, CHAMPION).version) == 1
    assert int(registry.version_by_alias(name, CANDIDATE).version) == 2
    versions = registry.client.search_model_versions(f"name = '{name}'")
    assert sorted((int(v.version), v.tags.get(VERSION_TAG)) for v in versions) == [(1, "1"), (2, "2")]
    with psycopg.connect(fresh_database) as conn:
        rows = conn.execute(
            "SELECT checkpoint_id, parent_id, policy_version, model_version FROM checkpoints ORDER BY policy_version"
        ).fetchall()
        offsets = conn.execute("SELECT topic, kafka_partition, first_offset, last_offset FROM checkpoint_offsets")
        samples = conn.execute("SELECT sample_id FROM checkpoint_samples ORDER BY sample_id").fetchall()
        history = conn.execute("SELECT action, from_version, to_version FROM promotions").fetchall()
        assert rows == [(base.checkpoint_id, None, 1, 1), (first.checkpoint_id, base.checkpoint_id, 2, 2)]
        assert offsets.fetchall() == [("samples", 0, 0, 2)]
    assert [row[0] for row in samples] == ids
    assert history == [("promote", None, 1)]
    announced = _announcements(endpoints.kafka_bootstrap, checkpoints_topic)
    assert [(a.checkpoint_id, a.model_version) for a in announced] == [(first.checkpoint_id, 2)] * 2

    # A sample already trained by version 2 cannot be claimed by another checkpoint.
    more = [OffsetRange(topic="samples", partition=0, first_offset=3, last_offset=3)]
    _checkpoint(tmp_path / "v3", name, 3, first.checkpoint_id, more)
    with pytest.raises(PublishError, match="trains one checkpoint at most"):
        publish_checkpoint(tmp_path / "v3", **{**kwargs, "sample_ids": ["a" * 32]})  # type: ignore[arg-type]


def test_publishing_refuses_a_checkpoint_whose_number_mlflow_would_give_to_another(
    tmp_path: Path, endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str]
) -> None:
    """Something else registered a version into the learner's model: checkpoint version 2 would become MLflow
    version 3, two numbers for one checkpoint. Publishing refuses, names both and the fix, registers nothing."""
    migrate(fresh_database)
    name, uri = _model_name(tmp_path), endpoints.mlflow_url
    base = _checkpoint(tmp_path / "base", name, BASE_POLICY_VERSION, None, [])
    register_base(tmp_path / "base", mlflow_uri=uri, dsn=fresh_database)
    assert register_elsewhere(uri, name, tmp_path / "base") == 2
    consumed = [OffsetRange(topic="samples", partition=0, first_offset=0, last_offset=0)]
    _checkpoint(tmp_path / "v2", name, 2, base.checkpoint_id, consumed)
    kwargs = {
        "dsn": fresh_database,
        "mlflow_uri": uri,
        "bootstrap": endpoints.kafka_bootstrap,
        "checkpoints_topic": make_topic(),
        "samples_topic": "samples",
        "sample_ids": ["a" * 32],
    }
    refusal = r"is version 2, but MLflow gives it .* version 3: .*LIVELOOP_LEARNER_MODEL_NAME"
    with pytest.raises(PublishError, match=refusal):
        publish_checkpoint(tmp_path / "v2", **kwargs)  # type: ignore[arg-type]
    registry = Registry(uri)
    assert registry.newest_version(name) == 2  # nothing registered under a wrong number
    assert int(registry.version_by_alias(name, CHAMPION).version) == 1

    # A version deleted from the registry is invisible, yet MLflow never gives its number again: the
    # checkpoint registers as version 3 and is refused, again on every retry, with no further version.
    registry.client.delete_model_version(name, "2")
    assert registry.newest_version(name) == 1
    for _ in range(2):
        with pytest.raises(PublishError, match=refusal):
            publish_checkpoint(tmp_path / "v2", **kwargs)  # type: ignore[arg-type]
    assert sorted(int(v.version) for v in registry.client.search_model_versions(f"name = '{name}'")) == [1, 3]


def test_a_base_model_is_refused_by_a_registered_model_that_holds_versions_already(
    tmp_path: Path, endpoints: Endpoints, fresh_database: str
) -> None:
    migrate(fresh_database)
    name, uri = _model_name(tmp_path), endpoints.mlflow_url
    _checkpoint(tmp_path / "base", name, BASE_POLICY_VERSION, None, [])
    assert register_elsewhere(uri, name, tmp_path / "base") == 1
    with pytest.raises(PublishError, match=r"is version 1, but MLflow gives it .* version 2: .*LIVELOOP_LEARNER_MODEL"):
        register_base(tmp_path / "base", mlflow_uri=uri, dsn=fresh_database)
    registry = Registry(uri)
    assert registry.newest_version(name) == 1
    with pytest.raises(AliasNotSet):
        registry.version_by_alias(name, CHAMPION)
