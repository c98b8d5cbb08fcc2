"""The records of the distiller's internal scored topic: the samples of a batch bound for one partition.

``sessionize`` hands each scored sample to ``admit``, which keeps the per-user cap in a table
partitioned by user. One Kafka record per sample made each sample pay the whole per-record cost of
Faust and aiokafka twice (produce, then fetch, deliver to the stream, take, acknowledge), more than
scoring it. So a batch's samples travel together: one record per partition of the scored topic (the
partition a record keyed by the user would go to, Kafka's default murmur2), holding the samples as
JSON lines, split where a record would grow past :data:`MAX_RECORD_BYTES`. ``admit`` reads a record's
samples in order, and its table keys (the users) all belong to the record's partition, as before.

A compact JSON sample never holds a newline byte (JSON escapes it inside strings), so a newline
separates samples unambiguously; a record holding one sample is that sample's JSON, as a record of
the former one-sample-per-record format was, so records of either format read alike.
"""

from __future__ import annotations

import functools

from kafka.partitioner.default import murmur2

MAX_RECORD_BYTES = 256 * 1024
"""Most bytes of samples packed into one record: well below the producer's batch size and the broker's
default record limit (1 MiB each). A sample larger than this travels alone, as it did before."""

_SEPARATOR = b"\n"


def partition_of(key: bytes, partitions: int) -> int:
    """Kafka's default partition for a key (murmur2), as every keyed producer of the app's topics uses."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


# murmur2 is pure Python (several microseconds a key), and a user has many samples: remember the busiest.
_user_partition = functools.lru_cache(maxsize=1 << 16)(partition_of)


class ScoredRecords:
    """Samples collected for the scored topic, packed per partition into records (see the module docstring)."""

    def __init__(self, partitions: int, max_bytes: int = MAX_RECORD_BYTES) -> None:
        self._partitions = partitions
        self._max_bytes = max_bytes
        self._open: dict[int, tuple[list[bytes], int]] = {}
        self._done: list[tuple[int, bytes]] = []

    def add(self, user_id: str, sample_json: bytes) -> None:
        """Add one sample (its compact JSON) of ``user_id``, in order."""
        partition = _user_partition(user_id.encode(), self._partitions)
        lines, size = self._open.get(partition, ([], 0))
        if lines and size + len(sample_json) + 1 > self._max_bytes:
            self._done.append((partition, _SEPARATOR.join(lines)))
            lines, size = [], 0
        lines.append(sample_json)
        self._open[partition] = (lines, size + len(sample_json) + 1)

    def records(self) -> list[tuple[int, bytes]]:
        """Every record to send, as ``(partition, value)``, each partition's samples in the order added."""
        records = self._done + [(partition, _SEPARATOR.join(lines)) for partition, (lines, _) in self._open.items()]
        self._open.clear()
        self._done = []
        return records


def samples_of(value: bytes) -> list[bytes]:
    """The samples' JSON held by one record of the scored topic, in order."""
    return value.split(_SEPARATOR)
