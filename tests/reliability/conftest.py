"""Fixtures of the reliability suite: its profile (CI's short form or ``make reliability``'s full run)."""

from __future__ import annotations

import pytest

from tests.reliability.profile import ReliabilityProfile
from tests.reliability.report import assemble_report


@pytest.fixture(scope="session")
def reliability() -> ReliabilityProfile:
    """The sizes this run uses (``LIVELOOP_RELIABILITY_*``)."""
    return ReliabilityProfile()


def pytest_sessionfinish(session: pytest.Session) -> None:
    assemble_report(ReliabilityProfile().report_dir)
