"""The ``models`` section of ``liveloop status``: champion, candidate and the gate's last decision.

An operator should not have to read MLflow tags to know what serves and why. The aliases come from
the MLflow registry (its REST API, with a short timeout), the history behind them from the audit
store: who moved the champion and why (``promotions``), which checkpoint a version is
(``checkpoints``), and the last gate decision with its reasons (``evaluations``). One number names a
checkpoint everywhere: the MLflow model version (the base model is version 1).

Status must answer quickly even when a service is down, so PostgreSQL is asked with a short connect
timeout and a service that does not answer leaves its part of the section ``unavailable``.
"""

from __future__ import annotations

import urllib.parse
from datetime import datetime
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from infra.probes import http_json
from infra.registry import CANDIDATE, CHAMPION

CONNECT_TIMEOUT_S = 3


def models_section(dsn: str, mlflow_url: str, model_name: str, *, mlflow_healthy: bool = True) -> dict[str, Any]:
    """The ``models`` section of ``status --json``; ``errors`` names what could not be read."""
    section: dict[str, Any] = {
        "model_name": model_name,
        "champion": None,
        "candidate": None,
        "last_decision": None,
        "errors": [],
    }
    versions: dict[str, int | None] = {CHAMPION: None, CANDIDATE: None}
    if mlflow_healthy:
        for alias in versions:
            versions[alias] = _alias_version(mlflow_url, model_name, alias)
    else:
        section["errors"].append("mlflow unavailable: the champion and candidate aliases are unknown")
    try:
        with psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            champion, candidate = versions[CHAMPION], versions[CANDIDATE]
            if champion is not None:
                section["champion"] = _champion(conn, model_name, champion)
            if candidate is not None:
                section["candidate"] = {
                    "version": candidate,
                    "checkpoint_id": _checkpoint_id(conn, model_name, candidate),
                }
            section["last_decision"] = _last_decision(conn, model_name)
    except psycopg.Error as exc:
        section["errors"].append(f"postgres unavailable: {type(exc).__name__}")
        # The aliases alone still say what serves.
        for alias in versions:
            if versions[alias] is not None:
                section[alias] = {"version": versions[alias]}
    return section


def _alias_version(mlflow_url: str, model_name: str, alias: str) -> int | None:
    """The version ``alias`` points at, or None when it is not set (MLflow answers 404)."""
    query = urllib.parse.urlencode({"name": model_name, "alias": alias})
    body = http_json(f"{mlflow_url.rstrip('/')}/api/2.0/mlflow/registered-models/alias?{query}")
    if body is None:
        return None
    return int(body["model_version"]["version"])


def _checkpoint_id(conn: psycopg.Connection[Any], model_name: str, version: int) -> str | None:
    row = conn.execute(
        "SELECT checkpoint_id FROM checkpoints WHERE model_name = %s AND model_version = %s", (model_name, version)
    ).fetchone()
    return str(row[0]) if row else None


def _champion(conn: psycopg.Connection[Any], model_name: str, version: int) -> dict[str, Any]:
    # The latest move of the alias onto this version says since when, by whom and why.
    row = conn.execute(
        "SELECT action, actor, reason, at FROM promotions "
        "WHERE model_name = %s AND to_version = %s AND action IN ('promote', 'rollback') ORDER BY at DESC, id DESC "
        "LIMIT 1",
        (model_name, version),
    ).fetchone()
    champion: dict[str, Any] = {"version": version, "checkpoint_id": _checkpoint_id(conn, model_name, version)}
    if row is not None:
        champion.update(action=row[0], actor=row[1], reason=row[2], since=_iso(row[3]))
    return champion


def _last_decision(conn: psycopg.Connection[Any], model_name: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT c.model_version, e.checkpoint_id, e.decision, e.reasons, e.decided_at, e.champion_version "
        "FROM evaluations e JOIN checkpoints c ON c.checkpoint_id = e.checkpoint_id "
        "WHERE c.model_name = %s ORDER BY e.decided_at DESC LIMIT 1",
        (model_name,),
    ).fetchone()
    if row is None:
        return None
    return {
        "version": row[0],
        "checkpoint_id": row[1],
        "decision": row[2],
        "reasons": row[3],
        "decided_at": _iso(row[4]),
        "against_champion": row[5],
    }


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


def print_models(section: dict[str, Any], console: Console) -> None:
    """The section as a table under ``status``'s services and components."""
    table = Table("model", "version", "checkpoint", "what")
    champion, candidate, decision = section["champion"], section["candidate"], section["last_decision"]
    if champion is not None:
        why = f"since {champion['since']} by {champion['actor']}: {champion['reason']}" if "since" in champion else ""
        table.add_row("champion", str(champion["version"]), str(champion.get("checkpoint_id") or ""), why)
    else:
        table.add_row("champion", "-", "", "none yet")
    if candidate is not None:
        table.add_row("candidate", str(candidate["version"]), str(candidate.get("checkpoint_id") or ""), "")
    if decision is not None:
        reasons = "; ".join(str(r) for r in decision["reasons"]) if isinstance(decision["reasons"], list) else ""
        table.add_row(
            "last gate decision",
            str(decision["version"]),
            str(decision["checkpoint_id"]),
            f"{decision['decision']} at {decision['decided_at']}" + (f": {reasons}" if reasons else ""),
        )
    console.print(table)
    for error in section["errors"]:
        console.print(f"[yellow]models: {error}[/yellow]")
