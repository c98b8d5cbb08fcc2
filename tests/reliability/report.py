"""The reliability report: each test writes its section as JSON and as a Markdown table.

``<report_dir>/<section>.json`` holds a test's figures; ``<report_dir>/report.md`` is rebuilt from
every section's Markdown at the end of the session (see ``conftest.py``), so a partial run still
leaves a readable report of what it ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.reliability.profile import ReliabilityProfile


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_section(profile: ReliabilityProfile, name: str, data: dict[str, Any], markdown: str) -> Path:
    """Write ``<name>.json`` (with the mode and time) and ``<name>.md``; return the JSON's path."""
    profile.report_dir.mkdir(parents=True, exist_ok=True)
    document = {"section": name, "mode": profile.mode, "written_at": datetime.now(UTC).isoformat(), **data}
    path = profile.report_dir / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    (profile.report_dir / f"{name}.md").write_text(f"## {name}\n\n{markdown}\n", encoding="utf-8")
    print(f"\nreliability {name}: {path}")
    return path


def assemble_report(report_dir: Path) -> Path | None:
    """Join every section's Markdown into ``report.md``; None when no section was written."""
    sections = sorted(p for p in report_dir.glob("*.md") if p.name != "report.md") if report_dir.is_dir() else []
    if not sections:
        return None
    path = report_dir / "report.md"
    body = "\n".join(p.read_text(encoding="utf-8") for p in sections)
    path.write_text("# liveloop reliability report\n\n" + body, encoding="utf-8")
    return path
