"""The SDK journal read back across segments: every record once, in order, whatever its size.

The sender reads the journal in chunks of one segment (``Journal.read_chunk``); these tests roll
segments often (small ``segment_bytes``) so that chunk boundaries, segment ends and records larger
than one read all occur, first on the journal alone and then end to end through the real broker.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

from infra.stack import Stack
from ingest.client import Client
from ingest.journal import Journal, Position
from tests.ingest.sdk_events import session_events
from tests.ingest.test_sdk import assert_each_once, consume_all


def _records(n: int) -> list[tuple[bytes, bytes]]:
    # Sizes from empty to 5 kB, plus two records larger than one read (1 MiB) and a tiny one between.
    records = [(f"k{i}".encode(), bytes([i % 251]) * (i * 997 % 5000)) for i in range(n)]
    return [*records, (b"big", b"x" * (3 << 20)), (b"small", b"y"), (b"", b"z" * ((1 << 20) + 1))]


def test_chunks_return_every_record_once_in_order_across_segments(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", segment_bytes=64 << 10)
    records = _records(2000)
    for key, value in records:
        journal.append(key, value)
    read: list[tuple[bytes, bytes]] = []
    position, segments = journal.cursor, set()
    while True:
        chunk = journal.read_chunk(position, max_records=333)
        if not chunk.ends:
            if chunk.segment == position.segment:
                break
            position = Position(chunk.segment, 0)  # the segment was read to its end
            continue
        segments.add(chunk.segment)
        read += zip(chunk.keys, chunk.values, strict=True)
        position = Position(chunk.segment, chunk.ends[-1])
    assert read == records
    assert position == journal.end
    assert len(segments) > 10  # the records really spanned many segments
    journal.close()


def test_read_gives_the_same_records_with_their_positions(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", segment_bytes=64 << 10)
    records = _records(500)
    for key, value in records:
        journal.append(key, value)
    read = journal.read(journal.cursor, max_records=100_000)
    assert [(record.key, record.value) for record in read] == records
    assert read[-1].end == journal.end
    assert all(a.end <= b.start for a, b in pairwise(read))
    journal.acknowledge(read[len(read) // 2].end)
    assert journal.read(journal.cursor, max_records=100_000) == read[len(read) // 2 + 1 :]
    journal.close()


def test_the_sdk_delivers_every_event_once_through_many_segments(
    stack: Stack, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(partitions=3)
    seed = "segments"
    with Client(
        bootstrap=stack.endpoints.kafka_bootstrap,
        topic=topic,
        journal_dir=tmp_path / "journal",
        journal_segment_bytes=64 << 10,
        max_in_flight=500,  # the sender waits on acknowledgements mid-chunk too
    ) as client:
        for event in session_events(3000, seed):
            client.emit(event)
        assert client.flush(timeout=120)
        assert client.stats.delivered == 3000
    assert_each_once(consume_all(stack.endpoints.kafka_bootstrap, topic), seed, 3000)
    # Acknowledged segments are deleted once the cursor has passed them.
    assert len(list((tmp_path / "journal").glob("*.seg"))) == 1
