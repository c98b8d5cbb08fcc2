"""The audit sink stores exactly what it is given: one row per sample (repeats, even within a batch,
stored once), every column equal to the sample's field, and one lineage row per source event."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg

from distill.samples import Sample, sample_id_for, sample_to_json
from distill.sink import AuditSink
from distill.spec import load_spec
from infra.migrations import migrate
from tests.learner.sample_factory import make_sample


def _samples(spec_hash: str) -> list[Sample]:
    rewards = [0.1 + 0.2, 1e-7, -0.75, 1.0]
    samples = []
    for number, reward in enumerate(rewards):
        generation_id = uuid.uuid5(uuid.NAMESPACE_URL, f"sink-rows/{number}")
        samples.append(
            make_sample(
                number,
                generation_id=generation_id,
                sample_id=sample_id_for(generation_id, spec_hash),
                spec_hash=spec_hash,
                policy_version=number,
                reward=reward,
                components={"rejected": -0.5, "accepted": reward, "tests_passed": 1 / 3},
                source_event_ids=sorted((uuid.uuid5(generation_id, str(i)) for i in range(number + 1)), key=str),
                user_id=f"user-'{number}\"",  # quotes travel as data
            )
        )
    return samples


def test_rows_equal_the_samples_and_repeats_are_stored_once(fresh_database: str) -> None:
    migrate(fresh_database)
    spec = load_spec()
    samples = _samples(spec.spec_hash)

    async def write() -> None:
        sink = AuditSink(fresh_database)
        try:
            await sink.record_spec(spec)
            await sink.write_samples([*samples[:3], samples[0]])  # a repeat within the batch
            await sink.write_samples(samples[2:])  # and one across batches
        finally:
            await sink.close()

    asyncio.run(write())
    with psycopg.connect(fresh_database) as conn:
        rows = conn.execute(
            "SELECT sample_id, generation_id, session_id, user_id, tenant, policy_version, reward, components,"
            " spec_hash, body FROM samples ORDER BY sample_id"
        ).fetchall()
        lineage = set(conn.execute("SELECT sample_id, event_id FROM sample_events").fetchall())
    expected = sorted(samples, key=lambda s: s.sample_id)
    assert [row[0] for row in rows] == [s.sample_id for s in expected]
    for row, sample in zip(rows, expected, strict=True):
        assert row[1:7] == (
            sample.generation_id, sample.session_id, sample.user_id, sample.tenant, sample.policy_version, sample.reward
        )  # fmt: skip
        assert row[7] == sample.components
        assert row[8] == sample.spec_hash
        assert row[9] == json.loads(sample_to_json(sample))
    assert lineage == {(s.sample_id, event_id) for s in samples for event_id in s.source_event_ids}
