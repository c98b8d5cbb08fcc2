"""How hard the reliability suite pushes: the shortened CI form (the default) or the full run.

``make reliability`` sets ``LIVELOOP_RELIABILITY_FULL=1``; ``make test`` (CI) runs the same tests in
their shortened form. Every figure is a setting, so one part can be run longer on its own, e.g.
``LIVELOOP_RELIABILITY_FUZZ_REQUESTS=50000 pytest tests/reliability/test_fuzz_ingest.py``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO = Path(__file__).resolve().parents[2]


class ReliabilityProfile(BaseSettings):
    """Sizes of the reliability suite. Env prefix ``LIVELOOP_RELIABILITY_``; unset sizes follow ``full``."""

    model_config = SettingsConfigDict(env_prefix="LIVELOOP_RELIABILITY_", extra="ignore")

    full: bool = Field(default=False, description="The full suite (make reliability) instead of CI's short form.")
    report_dir: Path = Field(default=REPO / "reliability-report", description="Where the report is written.")
    fuzz_requests: int = Field(
        default=0, ge=0, description="Requests of each fuzz run (ingest API, gateway); 0: 10,000 full, 1,000 in CI."
    )
    load_minutes: float = Field(default=0, ge=0, description="Minutes of sustained ingest; 0: 10 full, 2 in CI.")
    load_rate: float = Field(
        default=0,
        ge=0,
        description="Events per second of the load run; 0: 500, which leaves room on 2 cores for the whole loop "
        "beside the services (one event in seven is a generation).",
    )
    fault_minutes: float = Field(
        default=0, ge=0, description="Minutes of simulated traffic while faults are injected; 0: 12 full, 6 in CI."
    )
    broker_fault_minutes: float = Field(
        default=0,
        ge=0,
        description="Minutes of simulated traffic on the three-broker loop while brokers are killed; 0: 8 full, "
        "4 in CI.",
    )

    @model_validator(mode="after")
    def _fill_sizes(self) -> ReliabilityProfile:
        if not self.fuzz_requests:
            self.fuzz_requests = 10_000 if self.full else 1_000
        if not self.load_minutes:
            self.load_minutes = 10.0 if self.full else 2.0
        if not self.load_rate:
            self.load_rate = 500.0
        if not self.fault_minutes:
            self.fault_minutes = 12.0 if self.full else 6.0
        if not self.broker_fault_minutes:
            self.broker_fault_minutes = 8.0 if self.full else 4.0
        return self

    @property
    def mode(self) -> str:
        return "full" if self.full else "ci"
