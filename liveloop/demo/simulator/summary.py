"""The run's summary (a pydantic model) and the thread-safe recorder that builds it while sessions run."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from liveloop.demo.simulator.stats import wilson_interval


class VersionStats(BaseModel):
    """Requests served by one policy version and what users did with them."""

    policy_version: int
    requests: int
    accepted: int
    acceptance_rate: float
    acceptance_ci95: tuple[float, float]
    preferred: int = Field(description="Completions the users' hidden preference liked (before noise).")
    invalid_tool_calls: int = Field(description="Tool calls reported invalid (the loophole).")
    invalid_tool_call_rate: float = Field(description="Invalid tool calls per request.")
    distinct_completions: int = Field(default=0, description="Different completion texts this version served.")
    distinct_share: float = Field(
        default=0.0, description="distinct_completions / requests: falls as the policy collapses onto a few texts."
    )
    well_formed: int = Field(default=0, description="Completions that are well-formed in the simulator's language.")
    well_formed_share: float = Field(default=0.0, description="well_formed / requests.")


class TimelinePoint(BaseModel):
    """Requests of one policy version that started within one bucket of run time."""

    start_s: float
    policy_version: int
    requests: int
    accepted: int


class PlantedSecret(BaseModel):
    """A secret the simulator pasted into a prompt (and into tool errors of that session)."""

    kind: str
    secret: str
    session_id: str
    session_index: int


class SimulationSummary(BaseModel):
    """What one run did. ``events`` counts feedback and session events by type, as handed to the SDK."""

    run_id: str = Field(description="Random per run; session ids are sim-<run_id>-<index>, so runs never collide.")
    seed: int
    profile_mix: dict[str, float]
    started_at: datetime
    duration_s: float
    sessions: int
    sessions_by_profile: dict[str, int]
    privacy_sessions: int
    privacy_session_ids: list[str]
    requests: int
    privacy_requests: int = Field(
        description="Requests of privacy-mode sessions (their generation events are dropped)."
    )
    request_errors: int
    events: dict[str, int]
    privacy_dropped: int = Field(description="Events the SDK dropped unsent because their session is private.")
    malformed_sent: int
    malformed_dead_lettered: int = Field(description="Malformed events the ingest API answered as rejected.")
    malformed_skipped: int = Field(
        description="Malformed events not sent (no ingest API configured) or whose post failed without an answer."
    )
    planted_secrets: list[PlantedSecret]
    versions: list[VersionStats]
    timeline: list[TimelinePoint]
    generation_ids: list[str] = Field(description="Every generation id the gateway returned, in no order.")
    agents: list[dict[str, Any]] = Field(
        default_factory=list,
        description="An agent scenario's figures by policy version (liveloop.demo.simulator.swarm_session.SwarmTally).",
    )

    def write(self, path: Path) -> None:
        """Write the summary as indented JSON (parents created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")


class Recorder:
    """Collects what sessions did, from many threads; :meth:`summary` freezes it."""

    def __init__(self, bucket_s: float) -> None:
        self.bucket_s = bucket_s
        self._lock = threading.Lock()
        self.sessions: Counter[str] = Counter()
        self.privacy_session_ids: list[str] = []
        self.requests = 0
        self.privacy_requests = 0
        self.request_errors = 0
        self.events: Counter[str] = Counter()
        self.privacy_dropped = 0
        self.malformed_sent = 0
        self.malformed_dead_lettered = 0
        self.malformed_skipped = 0
        self.secrets: list[PlantedSecret] = []
        self.generation_ids: list[str] = []
        # policy version -> [requests, accepted, preferred, invalid tool calls, well-formed]
        self._versions: dict[int, list[int]] = {}
        self._texts: dict[int, set[str]] = {}  # policy version -> the completions it served
        self._timeline: dict[tuple[int, int], list[int]] = {}

    def session(self, profile: str, session_id: str, privacy: bool) -> None:
        with self._lock:
            self.sessions[profile] += 1
            if privacy:
                self.privacy_session_ids.append(session_id)

    def event(self, event_type: str, sent: bool) -> None:
        with self._lock:
            self.events[event_type] += 1
            self.privacy_dropped += 0 if sent else 1

    def error(self) -> None:
        with self._lock:
            self.request_errors += 1

    def secret(self, kind: str, secret: str, session_id: str, session_index: int) -> None:
        with self._lock:
            self.secrets.append(
                PlantedSecret(kind=kind, secret=secret, session_id=session_id, session_index=session_index)
            )

    def malformed(self, sent: bool, dead_lettered: bool) -> None:
        with self._lock:
            self.malformed_sent += int(sent)
            self.malformed_skipped += int(not sent)
            self.malformed_dead_lettered += int(dead_lettered)

    def agent_requests(self, count: int) -> None:
        """Count requests an agent session served: no acceptance to judge them by (the agent tally judges the
        trajectory)."""
        with self._lock:
            self.requests += count

    def served(
        self,
        at_s: float,
        version: int,
        generation_id: str,
        *,
        accepted: bool,
        preferred: bool,
        invalid_tools: int,
        privacy: bool,
        completion: str,
        well_formed: bool,
    ) -> None:
        """One completion served at ``at_s`` seconds into the run, whether it was well-formed, and the user's
        verdict."""
        with self._lock:
            self.requests += 1
            self.privacy_requests += int(privacy)
            self.generation_ids.append(generation_id)
            row = self._versions.setdefault(version, [0, 0, 0, 0, 0])
            row[0] += 1
            row[1] += int(accepted)
            row[2] += int(preferred)
            row[3] += invalid_tools
            row[4] += int(well_formed)
            self._texts.setdefault(version, set()).add(completion)
            point = self._timeline.setdefault((int(at_s // self.bucket_s), version), [0, 0])
            point[0] += 1
            point[1] += int(accepted)

    def summary(
        self, run_id: str, seed: int, mix: dict[str, float], started_at: datetime, duration_s: float
    ) -> SimulationSummary:
        """The summary of everything recorded so far."""
        with self._lock:
            versions = [
                VersionStats(
                    policy_version=v,
                    requests=n,
                    accepted=a,
                    acceptance_rate=a / n if n else 0.0,
                    acceptance_ci95=wilson_interval(a, n),
                    preferred=p,
                    invalid_tool_calls=bad,
                    invalid_tool_call_rate=bad / n if n else 0.0,
                    distinct_completions=len(self._texts[v]),
                    distinct_share=len(self._texts[v]) / n if n else 0.0,
                    well_formed=good,
                    well_formed_share=good / n if n else 0.0,
                )
                for v, (n, a, p, bad, good) in sorted(self._versions.items())
            ]
            timeline = [
                TimelinePoint(start_s=bucket * self.bucket_s, policy_version=v, requests=n, accepted=a)
                for (bucket, v), (n, a) in sorted(self._timeline.items())
            ]
            return SimulationSummary(
                run_id=run_id,
                seed=seed,
                profile_mix=mix,
                started_at=started_at,
                duration_s=duration_s,
                sessions=sum(self.sessions.values()),
                sessions_by_profile=dict(sorted(self.sessions.items())),
                privacy_sessions=len(self.privacy_session_ids),
                privacy_session_ids=sorted(self.privacy_session_ids),
                requests=self.requests,
                privacy_requests=self.privacy_requests,
                request_errors=self.request_errors,
                events=dict(sorted(self.events.items())),
                privacy_dropped=self.privacy_dropped,
                malformed_sent=self.malformed_sent,
                malformed_dead_lettered=self.malformed_dead_lettered,
                malformed_skipped=self.malformed_skipped,
                planted_secrets=sorted(self.secrets, key=lambda planted: planted.session_index),
                versions=versions,
                timeline=timeline,
                generation_ids=list(self.generation_ids),
            )
