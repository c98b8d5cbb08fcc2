"""``liveloop replay``: re-derive a time range's samples from the archived events and compare with the recorded ones.

Under the recorded spec (the default) a faithful archive reports no differences; under another spec
(``--spec FILE``) it reports what the new spec would have changed, per reward component. ``--publish TOPIC``
backfills the re-derived samples to a replay topic; the live samples topic is refused, since the learner
would train on them.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from distill.replay_range import MAX_WORKERS, compare_range
from distill.samples import Sample, sample_to_json
from distill.spec import load_spec
from infra.settings import TopicsSettings
from ingest.archive_reads import count_session_events
from ingest.errors import BrokerUnavailable
from liveloop.exit_codes import UsageProblem
from liveloop.replay_report import DIFFERENCES, write_reports
from liveloop.settings import OperatorSettings
from liveloop.store import TIME_FORMATS, audit_dsn, connect, time_range

console = Console()


def replay(
    start: Annotated[
        datetime, typer.Option("--from", help="Start of the range (UTC unless a zone is given).", formats=TIME_FORMATS)
    ],
    end: Annotated[datetime, typer.Option("--to", help="End of the range, excluded.", formats=TIME_FORMATS)],
    out: Annotated[
        Path, typer.Option("--out", help="Folder for report.md, report.json, rewards.png, differences.jsonl.")
    ],
    sessions: Annotated[
        list[str] | None, typer.Option("--session", help="Only this session (repeat for several).", show_default=False)
    ] = None,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Replay under this reward spec; default: the recorded one.")
    ] = None,
    publish: Annotated[
        str | None,
        typer.Option("--publish", help="Backfill the re-derived samples to this topic (never the live one)."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            max=MAX_WORKERS,
            help="Processes that replay (1: this one alone); default: one per core.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Replay the sessions with an event in [--from, --to) and report how the re-derived samples differ."""
    start, end = time_range(start, end)
    live = TopicsSettings().samples.name
    if publish is not None and publish == live:
        raise UsageProblem(
            f"--publish {publish} is the live samples topic: the learner would train on replayed samples; "
            "name a replay topic such as liveloop.samples.replay"
        )
    replay_spec = load_spec(spec) if spec is not None else None
    out.mkdir(parents=True, exist_ok=True)
    dsn = audit_dsn()
    with connect(dsn) as conn:
        total = count_session_events(conn, start, end)
    producer = _producer() if publish is not None else None
    published = 0

    def send(sample: Sample) -> None:
        nonlocal published
        assert producer is not None  # only passed to compare_range with a producer
        producer.send(publish, key=sample.sample_id.encode(), value=sample_to_json(sample))
        published += 1

    with (out / DIFFERENCES).open("w", encoding="utf-8") as differences, Progress(console=console) as progress:
        task = progress.add_task("replaying events", total=total)
        result = compare_range(
            dsn,
            start,
            end,
            replay_spec,
            sessions,
            on_difference=lambda record: _write_line(differences, record),
            on_session=lambda events: progress.advance(task, events),
            on_replayed=send if producer is not None else None,
            workers=workers,
        )
    if producer is not None:
        _flush(producer)
    write_reports(result, out)
    verdict = "no differences" if result.no_differences else f"{result.differing} differing"
    console.print(
        f"{result.sessions} sessions, {result.replayed} re-derived, {result.recorded} recorded: {verdict}, "
        f"{result.missing_in_stream} missing in the stream, {result.missing_in_replay} missing in replay; "
        f"report in {out}/" + (f"; {published} samples published to {publish}" if publish else "")
    )


def _write_line(handle: IO[str], record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, sort_keys=True) + "\n")


def _producer() -> Any:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    from infra.active import resolve_stack_settings

    bootstrap = OperatorSettings().bootstrap or resolve_stack_settings().kafka_address
    try:
        return KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    except KafkaError as exc:
        raise BrokerUnavailable(f"Kafka at {bootstrap} did not answer: {exc}; start it or check the address") from exc


def _flush(producer: Any) -> None:
    from kafka.errors import KafkaError

    try:
        producer.flush(timeout=60)
    except KafkaError as exc:
        raise BrokerUnavailable(f"publishing the replayed samples failed: {exc}; check that Kafka runs") from exc
    finally:
        producer.close()
