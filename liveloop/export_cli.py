"""``liveloop export``: a time range's events and samples as Parquet files, partitioned by day.

The writing is :mod:`liveloop.parquet_export`'s; this module is the command and its progress bar.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from liveloop.parquet_export import count_range, export_range
from liveloop.store import TIME_FORMATS, audit_dsn, time_range

console = Console()


def export(
    start: Annotated[
        datetime, typer.Option("--from", help="Start of the range (UTC unless a zone is given).", formats=TIME_FORMATS)
    ],
    end: Annotated[datetime, typer.Option("--to", help="End of the range, excluded.", formats=TIME_FORMATS)],
    out: Annotated[Path, typer.Option("--out", help="Folder for events/day=.../ and samples/day=.../ Parquet files.")],
) -> None:
    """Write the events (by event time) and samples (by generation time) in [--from, --to) as Parquet."""
    start, end = time_range(start, end)
    dsn = audit_dsn()
    total = count_range(dsn, start, end)
    with Progress(console=console) as progress:
        task = progress.add_task("exporting rows", total=total)
        counts = export_range(dsn, start, end, out, progress=lambda rows: progress.advance(task, rows))
    console.print(f"{counts.events} events and {counts.samples} samples in {len(counts.files)} files under {out}/")
