"""``liveloop audit checkpoint N`` and ``liveloop audit session ID``: lineage for auditors, Rich tables or ``--json``.

A checkpoint is named by its policy version (what ``liveloop promote`` takes and every response reports).
The lineage itself is read by :mod:`learner.audit`; the gate's decisions and the promotion history, which
serving writes, are read here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import psycopg
import typer
from psycopg.rows import dict_row
from rich.console import Console
from rich.table import Table

from learner.audit import AuditStoreError, SessionLineage, checkpoint_lineage, session_lineage
from liveloop.exit_codes import LiveloopGroup
from liveloop.store import audit_dsn, connect

app = typer.Typer(
    help="Trace a checkpoint back to its data, or a session forward to the checkpoints it trained.",
    no_args_is_help=True,
    add_completion=False,
    cls=LiveloopGroup,
)
console = Console()

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

_EVALUATIONS = """
    SELECT evaluation_id::text, champion_version, mlflow_run_id, decision, reasons, metrics, decided_at
    FROM evaluations WHERE checkpoint_id = %(id)s ORDER BY decided_at, evaluation_id
"""
_PROMOTIONS = """
    SELECT id, action, from_version, to_version, actor, reason, evaluation_id::text, at FROM promotions
    WHERE model_name = %(model)s AND (to_version = %(version)s OR from_version = %(version)s) ORDER BY at, id
"""


def checkpoint_report(conn: psycopg.Connection[Any], version: int) -> dict[str, Any]:
    """Everything ``audit checkpoint`` shows, as JSON-ready values."""
    lineage = checkpoint_lineage(conn, version)
    number = lineage.checkpoint["model_version"] or lineage.checkpoint["policy_version"]
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            evaluations = cur.execute(_EVALUATIONS, {"id": lineage.checkpoint["checkpoint_id"]}).fetchall()
            model = {"model": lineage.checkpoint["model_name"], "version": number}
            promotions = cur.execute(_PROMOTIONS, model).fetchall()
    except psycopg.Error as exc:
        raise AuditStoreError(f"reading the decisions about checkpoint {version} failed: {exc}") from exc
    return {
        "checkpoint": lineage.checkpoint,
        "offset_ranges": lineage.offsets,
        "trained_samples": lineage.trained,
        "trained_samples_not_stored": lineage.not_stored,
        "samples": lineage.samples,
        "components": lineage.components,
        "top_users": lineage.top_users,
        "largest_user_share": lineage.largest_user_share,
        "evaluations": [_iso(row) for row in evaluations],
        "promotions": [_iso(row) for row in promotions],
    }


@app.command("checkpoint")
def checkpoint(
    version: Annotated[int, typer.Argument(help="The checkpoint's policy version (its MLflow model version).", min=0)],
    as_json: JsonOption = False,
) -> None:
    """A checkpoint's offset ranges, sample and token counts, reward components, top contributors, gate
    decisions and promotions."""
    with connect(audit_dsn()) as conn:
        report = checkpoint_report(conn, version)
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
        return
    _print_checkpoint(report)


@app.command("session")
def session(
    session_id: Annotated[str, typer.Argument(help="The session id, as the product sent it.")],
    as_json: JsonOption = False,
) -> None:
    """A session's archived events, its samples and which checkpoints trained on them."""
    with connect(audit_dsn()) as conn:
        lineage = session_lineage(conn, session_id)
    report = session_report(lineage)
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
        return
    _print_session(lineage)


def session_report(lineage: SessionLineage) -> dict[str, Any]:
    """Everything ``audit session`` shows, as JSON-ready values."""
    return {
        "session_id": lineage.session_id,
        "events": lineage.events,
        "samples": lineage.samples,
        "checkpoints": lineage.checkpoints,
    }


def _print_checkpoint(report: dict[str, Any]) -> None:
    head = report["checkpoint"]
    samples = report["samples"]
    console.print(
        f"checkpoint [bold]{head['checkpoint_id']}[/bold] (version {head['policy_version']}, parent "
        f"{head['parent_id'] or '-'}, model {head['model_name'] or '-'} v{head['model_version'] or '-'})"
    )
    console.print(
        f"trained on {report['trained_samples']} samples (manifest says {head['sample_count']}; "
        f"{report['trained_samples_not_stored']} not in the samples table): {samples['generations']} generations, "
        f"{samples['sessions']} sessions, {samples['users']} users, {samples['tokens']} tokens"
    )
    offsets = Table("topic", "partition", "first offset", "last offset", title="offset ranges consumed")
    for row in report["offset_ranges"]:
        offsets.add_row(row["topic"], str(row["partition"]), str(row["first_offset"]), str(row["last_offset"]))
    console.print(offsets)
    components = Table("component", "samples", "mean", "std", "min", "max", title="reward components")
    components.add_row("reward", str(samples["samples"]), *(_num(samples[f"reward_{k}"]) for k in _STATS))
    for row in report["components"]:
        components.add_row(row["component"], str(row["samples"]), *(_num(row[k]) for k in _STATS))
    console.print(components)
    users = Table("user", "samples", title=f"top contributors (largest share {report['largest_user_share']:.1%})")
    for row in report["top_users"]:
        users.add_row(row["user_id"], str(row["samples"]))
    console.print(users)
    decisions = Table("when", "what", "versions", "who", "why", title="gate decisions and promotions")
    for row in report["evaluations"]:
        reasons = "; ".join(str(reason) for reason in row["reasons"])
        decisions.add_row(
            row["decided_at"], f"gate: {row['decision']}", f"vs {row['champion_version']}", "gate", reasons
        )
    for row in report["promotions"]:
        moved = f"{row['from_version'] or '-'} -> {row['to_version'] or '-'}"
        decisions.add_row(row["at"], row["action"], moved, row["actor"], row["reason"])
    console.print(decisions)


_STATS = ("mean", "std", "min", "max")


def _print_session(lineage: SessionLineage) -> None:
    events = Table("offset", "time", "type", "generation", "policy", title=f"session {lineage.session_id}: events")
    for row in lineage.events:
        where = f"{row['partition']}@{row['offset']}"
        events.add_row(where, row["ts"], row["type"], row["generation_id"] or "", str(row["policy_version"] or ""))
    console.print(events)
    samples = Table("sample", "generation", "reward", "components", "trained in", title="samples")
    for row in lineage.samples:
        parts = ", ".join(f"{name} {value:+.3g}" for name, value in sorted(row["components"].items()))
        trained = f"v{row['checkpoint_version']} ({row['checkpoint_id']})" if row["checkpoint_id"] else "-"
        samples.add_row(row["sample_id"][:12], row["generation_id"], _num(row["reward"]), parts, trained)
    console.print(samples)
    names = [f"v{c['policy_version']} ({c['checkpoint_id']}, {c['samples']} samples)" for c in lineage.checkpoints]
    console.print("trained: " + (", ".join(names) if names else "no checkpoint yet"))


def _num(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4g}"


def _iso(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value.isoformat() if hasattr(value, "isoformat") else value for key, value in row.items()}
