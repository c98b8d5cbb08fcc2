"""Records of the internal scored topic (``distill.scored``): samples packed per partition come out
whole, in order, on the partition Kafka's default partitioner gives their user, split at the size limit."""

from __future__ import annotations

import json

from aiokafka.partitioner import DefaultPartitioner

from distill.scored import ScoredRecords, partition_of, samples_of

PARTITIONS = 3


def _sample(number: int, user: str, size: int = 0) -> bytes:
    return json.dumps(
        {"n": number, "user_id": user, "text": "line\nbreak" + "x" * size}, separators=(",", ":")
    ).encode()


def test_partition_is_kafkas_default_for_the_key() -> None:
    for number in range(200):
        key = f"user-{number}".encode()
        assert partition_of(key, PARTITIONS) == DefaultPartitioner()(key, [0, 1, 2], [0, 1, 2])


def test_samples_come_out_whole_in_order_on_their_users_partition() -> None:
    records = ScoredRecords(PARTITIONS)
    added = [(f"user-{number % 7}", _sample(number, f"user-{number % 7}")) for number in range(50)]
    for user, sample in added:
        records.add(user, sample)
    packed = records.records()
    assert len(packed) <= PARTITIONS  # one record per partition
    got: dict[int, list[bytes]] = {}
    for partition, value in packed:
        got.setdefault(partition, []).extend(samples_of(value))
    for partition in range(PARTITIONS):
        expected = [sample for user, sample in added if partition_of(user.encode(), PARTITIONS) == partition]
        assert got.get(partition, []) == expected
    assert records.records() == []  # taken: the next batch starts empty


def test_a_record_is_split_at_the_size_limit_and_one_sample_is_its_own_json() -> None:
    records = ScoredRecords(1, max_bytes=1000)
    samples = [_sample(number, "u", size=300) for number in range(7)]
    for sample in samples:
        records.add("u", sample)
    packed = records.records()
    assert all(len(value) <= 1000 for _, value in packed)
    assert [sample for _, value in packed for sample in samples_of(value)] == samples
    big = _sample(99, "u", size=5000)  # larger than the limit: travels alone, as it is
    records.add("u", big)
    assert records.records() == [(0, big)]
