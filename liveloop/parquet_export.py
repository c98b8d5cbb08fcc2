"""Events and samples of a time range as Parquet files, partitioned by day, for researchers' own tools.

Layout: ``OUT/events/day=YYYY-MM-DD/part-0.parquet`` and ``OUT/samples/day=YYYY-MM-DD/part-0.parquet``
(hive-style, so pandas, pyarrow and DuckDB read ``OUT/events`` as one table with a ``day`` column). Each
file's key-value metadata names the contract's schema version (``liveloop.schema_version``: the event
envelope's or the sample's), the export format (``liveloop.export_version``) and the table.

Rows stream from server-side cursors ordered by time, so each day's file is written once and only one
batch is in memory; what is exported is what the audit store holds (already redacted at ingest), with
privacy-mode sessions left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from distill.sample_reads import EXPORT_COLUMNS as SAMPLE_COLUMNS
from distill.sample_reads import count_samples, sample_rows
from distill.samples import SAMPLE_SCHEMA_VERSION
from ingest.archive_reads import EXPORT_COLUMNS as EVENT_COLUMNS
from ingest.archive_reads import count_events, event_rows
from ingest.events import SCHEMA_VERSION
from liveloop.store import connect

EXPORT_VERSION = 1
"""The export's own layout version (columns, partitioning): raise it when either changes."""


@dataclass(frozen=True)
class ExportCounts:
    """Rows written per table, and the files written."""

    events: int
    samples: int
    files: tuple[Path, ...]


def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    events = pa.schema(
        [
            *(pa.field(name, pa.string()) for name in ("event_id",)),
            pa.field("schema_version", pa.int32()),
            *(pa.field(name, pa.string()) for name in ("type",)),
            pa.field("ts", ts),
            *(pa.field(name, pa.string()) for name in ("session_id", "user_id", "tenant", "generation_id")),
            pa.field("policy_version", pa.int32()),
            pa.field("kafka_partition", pa.int32()),
            pa.field("kafka_offset", pa.int64()),
            pa.field("archived_at", ts),
            pa.field("body", pa.string()),
        ]
    )
    samples = pa.schema(
        [
            *(
                pa.field(name, pa.string())
                for name in ("sample_id", "generation_id", "session_id", "user_id", "tenant")
            ),
            pa.field("policy_version", pa.int32()),
            pa.field("reward", pa.float64()),
            pa.field("components", pa.string()),
            pa.field("spec_hash", pa.string()),
            pa.field("generated_at", ts),
            pa.field("created_at", ts),
            pa.field("body", pa.string()),
        ]
    )
    assert tuple(events.names) == EVENT_COLUMNS, "the events schema and ingest.archive_reads disagree"
    assert tuple(samples.names) == SAMPLE_COLUMNS, "the samples schema and distill.sample_reads disagree"
    return {"events": (events, SCHEMA_VERSION, 3), "samples": (samples, SAMPLE_SCHEMA_VERSION, 9)}


def export_range(
    dsn: str, start: datetime, end: datetime, out: Path, *, progress: Callable[[int], None] | None = None
) -> ExportCounts:
    """Write the range's events and samples under ``out`` (see the module docstring); ``progress`` gets
    the number of rows of each batch written."""
    schemas = _schemas()
    files: list[Path] = []
    counts: dict[str, int] = {}
    with connect(dsn) as conn:
        for table, batches in (("events", event_rows(conn, start, end)), ("samples", sample_rows(conn, start, end))):
            schema, version, time_column = schemas[table]
            metadata = {
                "liveloop.table": table,
                "liveloop.schema_version": str(version),
                "liveloop.export_version": str(EXPORT_VERSION),
            }
            written, paths = _write_days(batches, schema.with_metadata(metadata), time_column, out / table, progress)
            counts[table] = written
            files += paths
    return ExportCounts(events=counts["events"], samples=counts["samples"], files=tuple(files))


def count_range(dsn: str, start: datetime, end: datetime) -> int:
    """Events plus samples :func:`export_range` writes for the range (a progress bar's total)."""
    with connect(dsn) as conn:
        return count_events(conn, start, end) + count_samples(conn, start, end)


def _write_days(
    batches: Iterable[list[tuple[Any, ...]]],
    schema: Any,
    time_column: int,
    folder: Path,
    progress: Callable[[int], None] | None,
) -> tuple[int, list[Path]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer: Any = None
    day: str | None = None
    paths: list[Path] = []
    written = 0
    try:
        for batch in batches:
            # Rows come ordered by time: split the batch where the (UTC) day changes.
            start = 0
            for index in range(len(batch) + 1):
                current = batch[index][time_column].astimezone(UTC).date().isoformat() if index < len(batch) else None
                if index < len(batch) and current == day:
                    continue
                if index > start and writer is not None:
                    columns = list(zip(*batch[start:index], strict=True))
                    arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
                    writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
                    written += index - start
                if current is not None:
                    if writer is not None:
                        writer.close()
                    day, start = current, index
                    path = folder / f"day={day}" / "part-0.parquet"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    writer = pq.ParquetWriter(path, schema)
                    paths.append(path)
            if progress is not None:
                progress(len(batch))
    finally:
        if writer is not None:
            writer.close()
    return written, paths
