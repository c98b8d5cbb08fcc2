"""The learner follows the champion (learner.lineage): real broker, PostgreSQL, MLflow and learner processes.

One run: v2 is promoted, so v3 descends from it without a rebase; v3 is rejected after the learner trained a
round on top of it, so the learner rebases onto v2 (SIGKILLed in the middle of the rebase and restarted) and
v4 descends from the champion v2, with v2 as its KL reference and v3 named as the line it left. v4's weights
are what a learner started from v2 computes on the cycle's rounds (the replayed one and the next), so what
the rejected line learned since v3 survives as samples, not weights, and the crash changed nothing. v4 is
rejected too, and v5 again descends from v2: rejections in a row do not stall the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file

from distill.samples import HeldOutRule
from infra.migrations import migrate
from infra.registry import Registry
from infra.stack import Endpoints
from learner.baseline import EmaBaseline
from learner.checkpoint import write_base_checkpoint
from learner.engine import LearnerEngine, init_distributed
from learner.intake import Intake
from learner.manifest import MANIFEST_SCHEMA_VERSION, OffsetRange, verify_checkpoint
from learner.publish import register_base
from learner.rounds import plan_round
from learner.settings import LearnerSettings
from learner.source import read_ranges
from learner.state import read_state
from serving.promotion import Promoter
from tests.learner.learner_harness import LearnerJob, learner_env, produce, training_samples, wait_for


def _status(env: dict[str, str], until: Callable[[dict[str, Any]], bool], job: LearnerJob) -> dict[str, Any]:
    url = f"http://127.0.0.1:{env['LIVELOOP_LEARNER_STATUS_PORT']}/status"
    deadline = time.monotonic() + 300
    while True:
        job.check_alive()
        try:
            status: dict[str, Any] = httpx.get(url, timeout=5).json()
            if until(status):
                return status
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"/status never got there:\n{job.log_tail()}")
        time.sleep(0.3)


@pytest.mark.timeout(900)
def test_a_rejected_candidate_is_left_and_the_next_descends_from_the_champion_even_across_a_crash(
    endpoints: Endpoints, make_topic: Callable[..., str], fresh_database: str, tmp_path: Path
) -> None:
    topic, announcements, promotions_topic = make_topic(), make_topic(), make_topic()
    migrate(fresh_database)
    data_dir = tmp_path / "learner"
    model = f"rebase-{topic.rsplit('.', 1)[1]}"
    ids = {v: f"{model}-v{v:05d}" for v in range(1, 6)}
    register_base(write_base_checkpoint(data_dir, model), mlflow_uri=endpoints.mlflow_url, dsn=fresh_database)
    env = learner_env(
        bootstrap=endpoints.kafka_bootstrap,
        topic=topic,
        checkpoints_topic=announcements,
        data_dir=data_dir,
        model_name=model,
        dsn=fresh_database,
        mlflow_uri=endpoints.mlflow_url,
        extra={
            "LIVELOOP_LEARNER_MIN_SAMPLES": "16",  # two rounds of 8 per checkpoint
            "LIVELOOP_LEARNER_CHAMPION_POLL_S": "0",
            "LIVELOOP_LEARNER_KL_COEF": "0.05",  # the reference takes part in the weights
        },
    )
    gate = Promoter(
        registry=Registry(endpoints.mlflow_url),
        dsn=fresh_database,
        bootstrap=endpoints.kafka_bootstrap,
        topic=promotions_topic,
        model_name=model,
    )
    job = LearnerJob({**env, "LIVELOOP_LEARNER_PAUSE_AT": "mid_rebase"}, tmp_path / "logs", "life1")
    try:
        produce(endpoints.kafka_bootstrap, topic, training_samples(0, 16))
        wait_for([data_dir / "published" / ids[2]], [job])
        gate.promote(2, actor="test", reason="the gate passed it")
        produce(endpoints.kafka_bootstrap, topic, training_samples(16, 16))
        wait_for([data_dir / "published" / ids[3]], [job])
        rounds_at_v3 = read_state(data_dir / "state" / ids[3]).round
        produce(endpoints.kafka_bootstrap, topic, training_samples(32, 8))
        # One round of 8 on top of v3 (8 is a round, 16 a checkpoint), trained before v3 is rejected.
        _status(env, lambda s: s.get("round") == rounds_at_v3 + 1 and s.get("activity") == "waiting", job)
        gate.reject(3, actor="test", reason="KL 1.61 over the limit")
        produce(endpoints.kafka_bootstrap, topic, training_samples(40, 8))
        wait_for([data_dir / "paused-mid_rebase"], [job])
        job.kill()
        job = LearnerJob(env, tmp_path / "logs", "life2")
        wait_for([data_dir / "published" / ids[4]], [job])
        status = _status(env, lambda s: s.get("last_checkpoint_id") == ids[4], job)
        assert (status["parent_id"], status["reference_id"]) == (ids[4], ids[2])
        state = read_state(data_dir / "state" / ids[3])  # kept while v3 is the newest but one
        # Rejected again: the learner does not stall on a rejected line, v5 starts from the champion again.
        gate.reject(4, actor="test", reason="still not better")
        produce(endpoints.kafka_bootstrap, topic, training_samples(48, 16))
        wait_for([data_dir / "published" / ids[5]], [job])
        assert job.stop() == [0]
    finally:
        job.kill()

    v3, v4 = (verify_checkpoint(data_dir / "checkpoints" / ids[v]) for v in (3, 4))
    # Promoted: the learner trained on from v2, no rebase; the reference was the champion at v2's checkpoint.
    assert (v3.parent_id, v3.rebased_from, v3.reference_id) == (ids[2], None, ids[1])
    # Rejected: v4 descends from the champion v2, against it as the reference, and names the line it left.
    assert (v4.parent_id, v4.rebased_from, v4.reference_id, v4.schema_version) == (
        ids[2],
        ids[3],
        ids[2],
        MANIFEST_SCHEMA_VERSION,
    )
    assert v4.sample_count == 16
    assert [(r.first_offset, r.last_offset) for r in v4.consumed] == [(32, 47)]
    v5 = verify_checkpoint(data_dir / "checkpoints" / ids[5])
    assert (v5.parent_id, v5.rebased_from, v5.reference_id) == (ids[2], ids[4], ids[2])
    assert [(r.first_offset, r.last_offset) for r in v5.consumed] == [(48, 63)]

    # What a learner started from v2 (fresh optimizer, v2 as reference) computes on the two rounds, from v3's
    # baseline and seen samples: the samples of the rejected line's last round were trained again, on v2.
    init_distributed(1)
    fresh = LearnerEngine(
        LearnerSettings(
            data_dir=tmp_path / "fresh",
            base_model=str(data_dir / "checkpoints" / ids[2]),
            lr=1e-3,
            token_budget=30,
            threads=1,
            kl_coef=0.05,
        ),
        rank=0,
        world_size=1,
    )
    baseline = EmaBaseline(0.9)
    baseline.load_state_dict(state.baseline)
    intake = Intake(3, 4, list(state.seen_sample_ids), HeldOutRule(percent=0))
    step = state.step
    for first in (32, 40):
        ranges = [OffsetRange(topic=topic, partition=0, first_offset=first, last_offset=first + 7)]
        records = read_ranges(endpoints.kafka_bootstrap, ranges)
        admitted = [r.sample for r in records if r.sample is not None and intake.admit(r.sample) is None]
        assert len(admitted) == 8
        for batch in plan_round(admitted, baseline, token_budget=30, shaping=fresh.settings.shaping(), first_step=step):
            fresh.train_step(batch, step)
            step += 1
    assert v4.step == step
    expected = fresh.module.state_dict()
    got = load_file(data_dir / "checkpoints" / ids[4] / "model.safetensors")
    rejected_line = load_file(data_dir / "checkpoints" / ids[3] / "model.safetensors")
    assert max((expected[name] - got[name]).abs().max().item() for name in got) < 1e-6
    assert not torch.equal(got["lm_head.weight"], rejected_line["lm_head.weight"])
