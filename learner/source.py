"""The samples topic as the learner reads it: live from manifest positions, or exact offset ranges again.

Positions never come from committed group offsets: the learner assigns every partition itself and seeks
to the positions of its last checkpoint (plus the rounds journaled since), because a committed offset may
run ahead of what a checkpoint holds. The learner commits its positions after every journaled round, for
tools that read group lag (``liveloop status``) alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from distill.errors import InvalidSample
from distill.samples import Sample, parse_sample
from learner.errors import LearnerError
from learner.manifest import OffsetRange

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_MS = 5000  # a commit is for lag reporting: it must not hold the training up while Kafka is away


class SourceError(LearnerError):
    """The samples topic could not be read as needed (unreachable, missing, or data already deleted)."""


@dataclass(frozen=True)
class Polled:
    """One record of the samples topic; ``sample`` is None when the value is not a valid sample."""

    partition: int
    offset: int
    sample: Sample | None


def _parse(value: bytes | None) -> Sample | None:
    if value is None:
        return None
    try:
        return parse_sample(value)
    except InvalidSample:
        return None


class SampleSource:
    """A kafka-python consumer over every partition of the samples topic, positioned by the learner."""

    def __init__(self, bootstrap: str, topic: str, group: str, timeout_s: float = 60.0) -> None:
        self.topic = topic
        try:
            self.consumer = KafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                client_id="liveloop-learner",
            )
        except KafkaError as exc:
            raise SourceError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
        deadline = time.monotonic() + timeout_s
        partitions = self.consumer.partitions_for_topic(topic)
        while not partitions and time.monotonic() < deadline:
            time.sleep(0.5)
            partitions = self.consumer.partitions_for_topic(topic)
        if not partitions:
            self.consumer.close()
            raise SourceError(f"the samples topic {topic!r} does not exist on {bootstrap}; create it (liveloop up)")
        self.partitions = [TopicPartition(topic, p) for p in sorted(partitions)]
        self.consumer.assign(self.partitions)

    def start_positions(self, known: Mapping[int, int]) -> dict[int, int]:
        """``known`` completed with each other partition's earliest offset (a fresh lineage starts there)."""
        earliest = self.consumer.beginning_offsets(self.partitions)
        return {tp.partition: known.get(tp.partition, earliest[tp]) for tp in self.partitions}

    def seek(self, positions: Mapping[int, int]) -> None:
        """Continue reading at ``positions`` (partition -> next offset)."""
        for tp in self.partitions:
            self.consumer.seek(tp, positions[tp.partition])

    def poll(self, timeout_ms: int) -> list[Polled]:
        """What arrived, in offset order per partition."""
        batches = self.consumer.poll(timeout_ms=timeout_ms)
        return [
            Polled(tp.partition, record.offset, _parse(record.value))
            for tp, records in sorted(batches.items(), key=lambda item: item[0].partition)
            for record in records
        ]

    def lag(self, positions: Mapping[int, int]) -> dict[int, int]:
        """Per partition: records on the topic not yet in a journaled round."""
        ends = self.consumer.end_offsets(self.partitions)
        return {tp.partition: max(0, ends[tp] - positions.get(tp.partition, 0)) for tp in self.partitions}

    def commit(self, positions: Mapping[int, int]) -> None:
        """Commit ``positions`` for the group (lag reporting only; never read back). A failure is logged, not
        raised: the next commit covers it, and reporting must not stop the training."""
        offsets = {tp: OffsetAndMetadata(positions[tp.partition], "", -1) for tp in self.partitions}
        try:
            self.consumer.commit(offsets, timeout_ms=COMMIT_TIMEOUT_MS)
        except KafkaError as exc:
            log.warning("could not commit the learner's positions for lag reporting: %s", exc)

    def close(self) -> None:
        """Close the consumer."""
        self.consumer.close()


def read_ranges(bootstrap: str, ranges: Sequence[OffsetRange], timeout_s: float = 60.0) -> list[Polled]:
    """Every record in ``ranges`` (inclusive), sorted by (partition, offset): a journaled round read again."""
    if not ranges:
        return []
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        wanted = {TopicPartition(r.topic, r.partition): r for r in ranges}
        consumer.assign(list(wanted))
        earliest = consumer.beginning_offsets(list(wanted))
        for tp, r in wanted.items():
            if earliest[tp] > r.first_offset:
                raise SourceError(
                    f"{r.topic}[{r.partition}] offsets {r.first_offset}..{r.last_offset} are gone (the topic starts at "
                    f"{earliest[tp]}); raise the samples topic's retention above the checkpoint interval"
                )
            consumer.seek(tp, r.first_offset)
        found: list[Polled] = []
        open_ranges = dict(wanted)
        deadline = time.monotonic() + timeout_s
        while open_ranges:
            if time.monotonic() > deadline:
                raise SourceError(f"reading journaled ranges {list(open_ranges.values())} timed out")
            for tp, records in consumer.poll(timeout_ms=500).items():
                r = wanted[tp]
                for record in records:
                    if r.first_offset <= record.offset <= r.last_offset:
                        found.append(Polled(tp.partition, record.offset, _parse(record.value)))
                    if record.offset >= r.last_offset:
                        open_ranges.pop(tp, None)
                if tp in open_ranges and consumer.position(tp) > r.last_offset:
                    open_ranges.pop(tp, None)
                if tp not in open_ranges:
                    consumer.pause(tp)
    except KafkaError as exc:
        raise SourceError(f"reading journaled ranges from {bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()
    return sorted(found, key=lambda polled: (polled.partition, polled.offset))
