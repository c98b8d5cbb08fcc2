"""The demo's report: ``report.json`` (machine-readable), ``report.md`` (for people) and
``acceptance.png`` (acceptance rate by policy version over time, swaps marked).

Acceptance per policy version comes from the simulator (what users did with each version's
completions); rewards, deferrals and the lineage come from the audit store; decisions and alias
moves from the ``evaluations`` and ``promotions`` tables, so the report shows what was recorded,
not what the demo believes happened.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from infra.stack import Stack
from liveloop.simulator.stats import intervals_overlap
from liveloop.simulator.summary import SimulationSummary

_COUNT = sql.SQL("SELECT count(*) FROM {}")


def collect_report(
    stack: Stack, summary: SimulationSummary, profile: str, minutes: float, base_version: int
) -> dict[str, Any]:
    """Gather the report from the simulator's summary and the audit store."""
    with psycopg.connect(stack.endpoints.dsn()) as conn:
        lineage = conn.execute(
            "SELECT policy_version, model_version, created_at FROM checkpoints ORDER BY policy_version"
        ).fetchall()
        rewards = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT policy_version, avg(reward), avg(CASE WHEN (body->>'deferral')::boolean THEN 1.0 ELSE 0.0 END),"
                " count(*) FROM samples GROUP BY policy_version"
            ).fetchall()
        }
        decisions = conn.execute(
            "SELECT c.policy_version, c.model_version, e.decision, e.reasons, e.metrics, e.decided_at "
            "FROM evaluations e JOIN checkpoints c USING (checkpoint_id) ORDER BY e.decided_at"
        ).fetchall()
        moves = conn.execute(
            "SELECT action, from_version, to_version, actor, reason, at FROM promotions ORDER BY id"
        ).fetchall()
        counts = {
            table: int(conn.execute(_COUNT.format(sql.Identifier(table))).fetchone()[0])  # type: ignore[index]
            for table in ("events", "samples", "dead_letters")
        }
    policy_of = {model_version: policy for policy, model_version, _ in lineage if model_version is not None}
    versions = []
    for stats in summary.versions:
        mean_reward, deferral_rate, samples = rewards.get(stats.policy_version, (None, None, 0))
        versions.append(
            {
                **stats.model_dump(),
                "model_version": next((m for m, p in policy_of.items() if p == stats.policy_version), None),
                "mean_reward": float(mean_reward) if mean_reward is not None else None,
                "deferral_rate": float(deferral_rate) if deferral_rate is not None else None,
                "samples": int(samples),
            }
        )
    champion = next((to for action, _, to, *_ in reversed(moves) if action in ("promote", "rollback")), base_version)
    report: dict[str, Any] = {
        "seed": summary.seed,
        "profile": profile,
        "minutes": minutes,
        "base_version": base_version,
        "final_champion": champion,
        "final_champion_policy_version": policy_of.get(champion),
        "versions": versions,
        "checkpoints": [
            {"policy_version": p, "model_version": m, "created_at": created.isoformat()}
            for p, m, created in lineage
            if p > 0
        ],
        "gate_decisions": [
            {"policy_version": p, "model_version": m, "decision": d, "reasons": reasons, "metrics": metrics}
            for p, m, d, reasons, metrics, _ in decisions
        ],
        "promotions": [
            {"action": a, "from": f, "to": t, "actor": actor, "reason": reason, "at": at.isoformat()}
            for a, f, t, actor, reason, at in moves
        ],
        "counts": counts,
        "simulator": {
            "sessions": summary.sessions,
            "requests": summary.requests,
            "request_errors": summary.request_errors,
            "privacy_sessions": summary.privacy_sessions,
            "planted_secrets": len(summary.planted_secrets),
            "malformed_sent": summary.malformed_sent,
            "malformed_dead_lettered": summary.malformed_dead_lettered,
        },
    }
    report["verdict"] = verdict(report)
    return report


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Did the loop make the model better? The last promoted version against the base champion."""
    by_policy = {v["policy_version"]: v for v in report["versions"]}
    policy_of = {v["model_version"]: v["policy_version"] for v in report["versions"] if v["model_version"]}
    policy_of.update({c["model_version"]: c["policy_version"] for c in report["checkpoints"] if c["model_version"]})
    moves = [p for p in report["promotions"] if p["action"] == "promote" and p["from"] is not None]
    # The newest promoted checkpoint that users met: one promoted in the last seconds served nobody yet.
    served = [policy_of[p["to"]] for p in moves if p["to"] in policy_of and policy_of[p["to"]] in by_policy]
    base = by_policy.get(0)
    final = by_policy.get(served[-1]) if served else None
    result: dict[str, Any] = {"promotions": len(moves)}
    if base is None or final is None:
        return {**result, "improved": False, "why": "no promoted checkpoint served requests"}
    result["judged_policy_version"] = final["policy_version"]
    gain = final["acceptance_rate"] - base["acceptance_rate"]
    separate = not intervals_overlap(tuple(base["acceptance_ci95"]), tuple(final["acceptance_ci95"]))
    return {
        **result,
        "base_acceptance": base["acceptance_rate"],
        "final_acceptance": final["acceptance_rate"],
        "acceptance_gain_points": round(100 * gain, 1),
        "intervals_separate": separate,
        "improved": gain >= 0.15 and separate,
        "loophole_not_exploited": final["invalid_tool_call_rate"] <= base["invalid_tool_call_rate"],
    }


def write_report(report: dict[str, Any], summary: SimulationSummary, directory: Path) -> list[Path]:
    """Write report.json, report.md and acceptance.png into ``directory``; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "report.md", directory / "acceptance.png"]
    paths[0].write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    paths[1].write_text(_markdown(report), encoding="utf-8")
    _plot(report, summary, paths[2])
    return paths


def _markdown(report: dict[str, Any]) -> str:
    v = report["verdict"]
    lines = [
        f"# liveloop demo: profile `{report['profile']}`, seed {report['seed']}, {report['minutes']:g} minutes",
        "",
        f"Base champion: model version {report['base_version']}; final champion: model version "
        f"{report['final_champion']} (policy version {report['final_champion_policy_version']}).",
        "",
    ]
    if "acceptance_gain_points" in v:
        lines += [
            f"Acceptance went from {v['base_acceptance']:.3f} (base) to {v['final_acceptance']:.3f} (policy version "
            f"{v['judged_policy_version']}, the newest promoted one that served requests) "
            f"({v['acceptance_gain_points']:+.1f} points; 95 % intervals "
            f"{'do not overlap' if v['intervals_separate'] else 'overlap'}). "
            f"Loophole {'not exploited' if v['loophole_not_exploited'] else 'EXPLOITED'}.",
            "",
        ]
    else:
        lines += [f"No improvement to report: {v['why']}.", ""]
    lines += [
        "| policy version | model version | requests | acceptance | 95 % interval | mean reward | invalid tool calls"
        " | distinct share | well-formed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for item in report["versions"]:
        low, high = item["acceptance_ci95"]
        reward = "" if item["mean_reward"] is None else f"{item['mean_reward']:.3f}"
        lines.append(
            f"| {item['policy_version']} | {item['model_version'] or ''} | {item['requests']} | "
            f"{item['acceptance_rate']:.3f} | {low:.3f}-{high:.3f} | {reward} | {item['invalid_tool_call_rate']:.3f} | "
            f"{item['distinct_share']:.3f} | {item['well_formed_share']:.3f} |"
        )
    lines += ["", "## Gate decisions", ""]
    for d in report["gate_decisions"]:
        failed = [r for r in d["reasons"] if isinstance(r, str) and r.startswith("fail")] or d["reasons"][:2]
        lines.append(f"- policy version {d['policy_version']}: **{d['decision']}** ({'; '.join(map(str, failed))})")
    lines += ["", "## Alias moves", ""]
    for p in report["promotions"]:
        lines.append(f"- {p['at']}: {p['action']} {p['from']} → {p['to']} by {p['actor']} ({p['reason']})")
    counts = report["counts"]
    lines += [
        "",
        f"Archived events: {counts['events']:,}; samples: {counts['samples']:,}; "
        f"dead letters: {counts['dead_letters']:,}.",
        "",
    ]
    if "leaks" in report:
        scanned = report.get("leaks_scanned_for", {})
        what = f"{scanned.get('secrets', 0)} planted secrets and {scanned.get('privacy_sessions', 0)} private sessions"
        found = report["leaks"]
        lines += [
            f"Leak scan for {what} over every topic, table, MLflow artifact and checkpoint: "
            + ("nothing found." if not found else "FOUND in " + ", ".join(f"{k} ({v})" for k, v in found.items())),
            "",
        ]
    return "\n".join(lines)


def _plot(report: dict[str, Any], summary: SimulationSummary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for version in sorted({point.policy_version for point in summary.timeline}):
        points = [p for p in summary.timeline if p.policy_version == version and p.requests > 0]
        axes.plot(
            [p.start_s / 60 for p in points],
            [p.accepted / p.requests for p in points],
            marker="o",
            label=f"policy v{version}",
        )
    start = summary.started_at
    for move in report["promotions"]:
        at = (datetime.fromisoformat(move["at"]) - start).total_seconds() / 60
        if at >= 0:
            axes.axvline(at, color="grey", linestyle="--", linewidth=0.8)
            axes.annotate(f"{move['action']} → v{move['to']}", (at, 1.0), rotation=90, fontsize=7, va="top")
    axes.set_xlabel("minutes into the run")
    axes.set_ylabel("acceptance rate")
    axes.set_ylim(0, 1.05)
    axes.legend(loc="lower right", fontsize=8)
    axes.set_title("Acceptance by policy version (dashed: alias moves)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
