"""The learner service end to end: real broker, PostgreSQL and MLflow, real ``python -m learner.service`` processes.

- Resume equivalence: a learner SIGKILLed in the middle of a round and again in the middle of writing a
  checkpoint, then restarted, ends with weights *bit-identical* to an uninterrupted learner's over the
  same samples and seed (CPU, fp32, one thread per process: the same ops in the same order give the
  same bits; replay re-reads the journaled ranges, admits them in the same order and seeds each step
  from (seed, step)); its manifests' offset ranges are contiguous and disjoint; every sample is
  recorded for exactly one checkpoint.
- Two ranks, ZeRO-2 over gloo: one full cycle to a registered, announced candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
import torch
from kafka import KafkaConsumer
from safetensors.torch import load_file

from infra.lag import consumer_lag
from infra.migrations import migrate
from infra.registry import CANDIDATE, CHAMPION, Registry
from infra.stack import Endpoints
from learner.baseline import EmaBaseline
from learner.checkpoint import write_base_checkpoint
from learner.engine import LearnerEngine, init_distributed
from learner.intake import Intake
from learner.manifest import BASE_POLICY_VERSION, CheckpointAnnouncement, verify_checkpoint
from learner.publish import VERSION_TAG, register_base
from learner.rounds import plan_round
from learner.settings import LearnerSettings
from learner.source import read_ranges
from tests.learner.learner_harness import (
    LearnerJob,
    learner_env,
    produce,
    register_elsewhere,
    training_samples,
    wait_for,
)

MODEL = "test-policy"


def _ids(*versions: int) -> list[str]:
    return [f"{MODEL}-v{v:05d}" for v in versions]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.timeout(900)
def test_a_killed_and_restarted_learner_ends_bit_identical_to_an_uninterrupted_one(
    endpoints: Endpoints, make_topic: Callable[..., str], fresh_database: str, tmp_path: Path
) -> None:
    topic, announcements = make_topic(partitions=2), make_topic(partitions=1)
    migrate(fresh_database)
    calm_dir, crashy_dir = tmp_path / "calm", tmp_path / "crashy"
    base = write_base_checkpoint(crashy_dir, MODEL)
    common = {"bootstrap": endpoints.kafka_bootstrap, "topic": topic, "checkpoints_topic": announcements}
    # The uninterrupted learner only writes checkpoints; the crashy one also publishes them (and must
    # re-publish after its crash), so the audit store checks exactly-once for it.
    calm = LearnerJob(learner_env(data_dir=calm_dir, **common), tmp_path / "logs", "calm")
    publish = {"LIVELOOP_LEARNER_DSN": fresh_database, "LIVELOOP_LEARNER_MLFLOW_URI": endpoints.mlflow_url}
    crashy_env = learner_env(data_dir=crashy_dir, extra=publish, **common)
    base_manifest = verify_checkpoint(base)
    assert base_manifest.policy_version == BASE_POLICY_VERSION == 1
    register_base(base, mlflow_uri=endpoints.mlflow_url, dsn=fresh_database)
    try:
        # Life 1: frozen after the first optimizer step of round 1, then killed.
        crashy = LearnerJob({**crashy_env, "LIVELOOP_LEARNER_PAUSE_AT": "mid_round"}, tmp_path / "logs", "crashy1")
        produce(endpoints.kafka_bootstrap, topic, training_samples(0, 8))
        wait_for([crashy_dir / "paused-mid_round", calm_dir / "checkpoints" / _ids(2)[0]], [calm, crashy])
        crashy.kill()
        # Life 2: replays round 1, then freezes with checkpoint 2 (the first after the base) in its temporary folder.
        crashy = LearnerJob({**crashy_env, "LIVELOOP_LEARNER_PAUSE_AT": "mid_checkpoint"}, tmp_path / "logs", "crashy2")
        wait_for([crashy_dir / "paused-mid_checkpoint"], [calm, crashy])
        assert (crashy_dir / "checkpoints" / f".tmp-{_ids(2)[0]}").is_dir()
        assert not (crashy_dir / "checkpoints" / _ids(2)[0]).exists()
        crashy.kill()
        # Life 3: no fault; recovers, writes and publishes checkpoint 2, then goes on live.
        crashy = LearnerJob(crashy_env, tmp_path / "logs", "crashy3")
        wait_for([crashy_dir / "published" / _ids(2)[0]], [calm, crashy])
        for first, version in ((8, 3), (16, 4)):
            produce(endpoints.kafka_bootstrap, topic, training_samples(first, 8))
            wait_for(
                [calm_dir / "checkpoints" / _ids(version)[0], crashy_dir / "published" / _ids(version)[0]],
                [calm, crashy],
            )
        status = _settled_status(crashy_env)
        assert status["policy_version"] == 4
        assert status["samples_since_checkpoint"] == 0
        assert status["last_checkpoint_id"] == _ids(4)[0]
        assert sum(status["lag"].values()) == 0
        assert status["activity"] == "waiting"
        # A lone learner meets its process group in a file: nothing of it listens beyond loopback.
        sockets = psutil.Process(crashy.procs[0].pid).net_connections("inet")
        listening = {sock.laddr.ip for sock in sockets if sock.status == psutil.CONN_LISTEN}
        assert listening <= {"127.0.0.1"}, listening
        assert calm.stop() == [0]
        assert crashy.stop() == [0]
        # A crash between the rename and the published marker: the next start publishes again (idempotent).
        (crashy_dir / "published" / _ids(4)[0]).unlink()
        crashy = LearnerJob(crashy_env, tmp_path / "logs", "crashy4")
        wait_for([crashy_dir / "published" / _ids(4)[0]], [crashy])
        assert crashy.stop() == [0]
    finally:
        calm.kill()
        crashy.kill()

    # Bit-identical final weights (and every checkpoint on the way).
    for checkpoint_id in _ids(2, 3, 4):
        a, b = _weights(calm_dir / "checkpoints" / checkpoint_id), _weights(crashy_dir / "checkpoints" / checkpoint_id)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[name], b[name]) for name in a), checkpoint_id
    assert not torch.equal(
        _weights(base)["lm_head.weight"], _weights(crashy_dir / "checkpoints" / _ids(4)[0])["lm_head.weight"]
    )

    # Manifests: the lineage, 8 samples each, contiguous and disjoint ranges covering all 24 records.
    manifests = [verify_checkpoint(crashy_dir / "checkpoints" / c) for c in _ids(2, 3, 4)]
    assert [m.parent_id for m in manifests] == _ids(1, 2, 3)
    assert [m.sample_count for m in manifests] == [8, 8, 8]
    assert [m.step for m in manifests] == [3, 6, 9]  # 8 samples of <= 30 tokens per round: 3 batches
    next_offset: dict[int, int] = dict.fromkeys((0, 1), 0)
    for m in manifests:
        for r in m.consumed:
            assert r.first_offset == next_offset[r.partition], (m.checkpoint_id, r)
            assert r.last_offset >= r.first_offset
            next_offset[r.partition] = r.last_offset + 1
        assert m.positions[topic] == next_offset
    assert sum(next_offset.values()) == 24

    # The audit store: each of the 24 samples recorded for exactly one checkpoint; offsets as in the manifests.
    with psycopg.connect(fresh_database) as conn:
        rows = conn.execute(
            "SELECT checkpoint_id, count(*) FROM checkpoint_samples GROUP BY checkpoint_id ORDER BY 1"
        ).fetchall()
        assert rows == [(c, 8) for c in _ids(2, 3, 4)]
        expected = {s.sample_id for s in training_samples(0, 8) + training_samples(8, 8) + training_samples(16, 8)}
        recorded = {r[0] for r in conn.execute("SELECT sample_id FROM checkpoint_samples").fetchall()}
        assert recorded == expected
    registry = Registry(endpoints.mlflow_url)
    assert int(registry.version_by_alias(MODEL, CHAMPION).version) == 1
    candidate = registry.version_by_alias(MODEL, CANDIDATE)
    assert candidate.tags.get("liveloop.checkpoint_id") == _ids(4)[0]
    assert int(candidate.version) == 4  # the checkpoint's version is its MLflow version


def _settled_status(env: dict[str, str]) -> dict[str, Any]:
    """The learner's /status once its lag figure (refreshed every few seconds) has caught up."""
    url = f"http://127.0.0.1:{env['LIVELOOP_LEARNER_STATUS_PORT']}/status"
    deadline = time.monotonic() + 30
    while True:
        status: dict[str, Any] = httpx.get(url, timeout=10).json()
        if sum(status["lag"].values()) == 0 or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


@pytest.mark.timeout(600)
def test_two_ranks_zero2_over_gloo_run_a_full_cycle_to_a_registered_checkpoint(
    endpoints: Endpoints, make_topic: Callable[..., str], fresh_database: str, tmp_path: Path
) -> None:
    topic, announcements = make_topic(partitions=2), make_topic(partitions=1)
    migrate(fresh_database)
    data_dir = tmp_path / "learner"
    model_name = f"two-ranks-{topic.rsplit('.', 1)[1]}"
    base = write_base_checkpoint(data_dir, model_name)
    register_base(base, mlflow_uri=endpoints.mlflow_url, dsn=fresh_database)
    env = learner_env(
        bootstrap=endpoints.kafka_bootstrap,
        topic=topic,
        checkpoints_topic=announcements,
        data_dir=data_dir,
        model_name=model_name,
        dsn=fresh_database,
        mlflow_uri=endpoints.mlflow_url,
        extra={
            "LIVELOOP_LEARNER_ZERO_STAGE": "2",
        },
    )
    checkpoint_id = f"{model_name}-v00002"
    job = LearnerJob(env, tmp_path / "logs", "two-ranks", world_size=2)
    try:
        produce(endpoints.kafka_bootstrap, topic, training_samples(100, 8))
        wait_for([data_dir / "published" / checkpoint_id], [job])
        assert job.stop() == [0, 0]
    finally:
        job.kill()
    folder = data_dir / "checkpoints" / checkpoint_id
    manifest = verify_checkpoint(folder)
    assert (manifest.sample_count, manifest.step, manifest.policy_version) == (8, 3, 2)
    assert manifest.training_config["world_size"] == 2
    assert manifest.training_config["zero_stage"] == 2
    # Rank 1 wrote its optimizer shard into the state folder beside rank 0's.
    shards = sorted(p.name for p in (data_dir / "state" / checkpoint_id / "ds").glob("zero_pp_rank_*"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    registry = Registry(endpoints.mlflow_url)
    candidate = registry.version_by_alias(model_name, CANDIDATE)
    assert candidate.tags.get("liveloop.checkpoint_id") == checkpoint_id
    assert int(candidate.version) == 2  # the base is version 1
    consumer = KafkaConsumer(
        announcements,
        bootstrap_servers=endpoints.kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        values = [CheckpointAnnouncement.model_validate_json(record.value) for record in consumer]
    finally:
        consumer.close()
    assert [(a.checkpoint_id, a.policy_version, a.model_version, a.sample_count) for a in values] == [
        (checkpoint_id, 2, 2, 8)
    ]

    # The two ranks computed what one process computes from the same journaled round, to float32 rounding:
    # each rank sums its half of the batch's gradient and gloo adds the halves, so sums run in another order
    # (a few ulps), and Adam's m / sqrt(v) amplifies that only for components whose gradient is ~0.
    # The cycle was one round, so the manifest's consumed ranges are that round's (its journal entry is gone:
    # the journal forgets what precedes a complete checkpoint).
    consumed = verify_checkpoint(data_dir / "checkpoints" / checkpoint_id).consumed
    init_distributed(1)
    one = LearnerEngine(
        LearnerSettings(data_dir=tmp_path / "one", model_name=model_name, lr=1e-3, token_budget=30, threads=1),
        rank=0,
        world_size=1,
    )
    intake = Intake(base_policy_version=BASE_POLICY_VERSION, max_staleness=4)
    records = read_ranges(endpoints.kafka_bootstrap, consumed)
    admitted = [r.sample for r in records if r.sample is not None and intake.admit(r.sample) is None]
    planned = plan_round(admitted, EmaBaseline(0.9), token_budget=30, shaping=one.settings.shaping(), first_step=0)
    for step, batch in enumerate(planned):
        one.train_step(batch, step)
    two = _weights(folder)
    single = one.module.state_dict()
    assert max((single[name] - two[name]).abs().max().item() for name in two) < 1e-4


@pytest.mark.timeout(600)
def test_a_stream_of_samples_it_must_drop_does_not_stall_the_learner(
    endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Records intake will drop (here every sample after the first checkpoint: stale at max_staleness 0) make
    rounds of their own. Before, they never counted towards a round: they piled up in memory and the learner's
    positions stopped, its lag only growing (found by the reliability suite's 10-minute load run). The group lag
    then kept growing too, committed at checkpoints only (found by the same run)."""
    topic, announcements = make_topic(partitions=1), make_topic(partitions=1)
    data_dir = tmp_path / "learner"
    write_base_checkpoint(data_dir, MODEL)
    env = learner_env(
        bootstrap=endpoints.kafka_bootstrap,
        topic=topic,
        checkpoints_topic=announcements,
        data_dir=data_dir,
        extra={"LIVELOOP_LEARNER_MAX_STALENESS": "0", "LIVELOOP_LEARNER_CONSUMER_GROUP": f"learner-{topic}"},
    )
    job = LearnerJob(env, tmp_path / "logs", "flooded")
    try:
        produce(endpoints.kafka_bootstrap, topic, training_samples(0, 8))
        wait_for([data_dir / "checkpoints" / _ids(2)[0]], [job])
        produce(endpoints.kafka_bootstrap, topic, training_samples(8, 80))  # policy 1: stale for policy 2
        url = f"http://127.0.0.1:{env['LIVELOOP_LEARNER_STATUS_PORT']}/status"
        deadline = time.monotonic() + 120
        while True:
            status: dict[str, Any] = httpx.get(url, timeout=10).json()
            if status["intake"]["stale"] >= 64 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status["intake"]["stale"] >= 64, status  # dropped in a round, not held forever
        assert status["intake"]["accepted"] == 0
        time.sleep(6)  # the lag figure is refreshed every 5 s
        lag = sum(httpx.get(url, timeout=10).json()["lag"].values())
        assert lag < 64, lag  # the positions moved past them (a tail under a flood's size may wait)
        # The group's committed lag (what `liveloop status` reports) says the same, though no checkpoint came
        # after the first: committed at checkpoints only, it stayed at every dropped record.
        group_lag = consumer_lag(endpoints.kafka_bootstrap, env["LIVELOOP_LEARNER_CONSUMER_GROUP"], [topic])
        assert group_lag == lag, (group_lag, lag)
        assert job.stop() == [0]
    finally:
        job.kill()


@pytest.mark.timeout(600)
def test_the_learner_numbers_a_checkpoint_as_mlflow_will_even_past_versions_it_did_not_write(
    endpoints: Endpoints, make_topic: Callable[..., str], fresh_database: str, tmp_path: Path
) -> None:
    """The registry holds a version the learner's data folder does not know (as after restoring the folder
    from an older backup): the next checkpoint takes the registry's newest plus one, so that its version,
    its MLflow version, its announcement and the learner's status all say one number."""
    topic, announcements = make_topic(partitions=1), make_topic(partitions=1)
    migrate(fresh_database)
    data_dir = tmp_path / "learner"
    model_name = f"numbered-{topic.rsplit('.', 1)[1]}"
    base = write_base_checkpoint(data_dir, model_name)
    assert register_base(base, mlflow_uri=endpoints.mlflow_url, dsn=fresh_database) == BASE_POLICY_VERSION
    assert register_elsewhere(endpoints.mlflow_url, model_name, base) == 2
    env = learner_env(
        bootstrap=endpoints.kafka_bootstrap,
        topic=topic,
        checkpoints_topic=announcements,
        data_dir=data_dir,
        model_name=model_name,
        dsn=fresh_database,
        mlflow_uri=endpoints.mlflow_url,
    )
    checkpoint_id = f"{model_name}-v00003"
    job = LearnerJob(env, tmp_path / "logs", "numbered")
    try:
        produce(endpoints.kafka_bootstrap, topic, training_samples(200, 8))
        wait_for([data_dir / "published" / checkpoint_id], [job])
        assert _settled_status(env)["policy_version"] == 3
        assert job.stop() == [0]
    finally:
        job.kill()
    manifest = verify_checkpoint(data_dir / "checkpoints" / checkpoint_id)
    assert (manifest.policy_version, manifest.parent_id) == (3, base.name)
    candidate = Registry(endpoints.mlflow_url).version_by_alias(model_name, CANDIDATE)
    assert (int(candidate.version), candidate.tags.get(VERSION_TAG)) == (3, "3")
    announced = CheckpointAnnouncement.model_validate_json((data_dir / "published" / checkpoint_id).read_bytes())
    assert (announced.policy_version, announced.model_version) == (3, 3)
