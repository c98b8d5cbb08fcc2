"""Fixtures of the distiller's end-to-end tests (``tests/distill/stream_harness.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.stack import Endpoints
from tests.distill.stream_harness import MakeHarness, StreamHarness


@pytest.fixture
def make_harness(endpoints: Endpoints, fresh_database: str, tmp_path: Path) -> Iterator[MakeHarness]:
    """``make_harness(**options)``: a :class:`StreamHarness` on this test's fresh database; closed afterwards."""
    made: list[StreamHarness] = []

    def make(**options: Any) -> StreamHarness:
        harness = StreamHarness(endpoints.kafka_bootstrap, fresh_database, tmp_path / "distill", **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()
