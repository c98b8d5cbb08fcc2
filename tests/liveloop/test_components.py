"""What ``liveloop up`` starts, without starting it: replicas of the gateway and the ingest API, each on its own
port with its own state, and the distiller's own topics replicated as the loop's topics are.

No service is needed: the components are only described (``loop_components``), never run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import StackSettings
from infra.stack import Stack
from liveloop.components import loop_components


def _stack(tmp_path: Path, brokers: int = 1) -> Stack:
    return Stack(StackSettings(state_dir=tmp_path, kafka_brokers=brokers))


def test_one_replica_of_each_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIVELOOP_REPLICAS_GATEWAY", raising=False)
    monkeypatch.delenv("LIVELOOP_REPLICAS_INGEST_API", raising=False)
    names = [spec.name for spec in loop_components(_stack(tmp_path))]
    assert names == ["ingest-api", "archiver", "distiller", "learner", "gate", "gateway", "dashboard"]


def test_replicas_listen_on_the_next_ports_with_state_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIVELOOP_REPLICAS_GATEWAY", "2")
    monkeypatch.setenv("LIVELOOP_REPLICAS_INGEST_API", "3")
    monkeypatch.setenv("LIVELOOP_SERVING_PORT", "18000")
    monkeypatch.setenv("LIVELOOP_INGEST_PORT", "18100")
    specs = {spec.name: spec for spec in loop_components(_stack(tmp_path))}
    assert [n for n in specs if n.startswith("ingest-api")] == ["ingest-api", "ingest-api-2", "ingest-api-3"]
    assert specs["ingest-api-3"].env["LIVELOOP_INGEST_PORT"] == "18102"
    assert specs["ingest-api-3"].health_url == "http://127.0.0.1:18102/healthz"
    first, second = specs["gateway"], specs["gateway-2"]
    assert (first.env["LIVELOOP_SERVING_PORT"], second.env["LIVELOOP_SERVING_PORT"]) == ("18000", "18001")
    for key in ("LIVELOOP_SERVING_SDK_JOURNAL_DIR", "LIVELOOP_SERVING_SWAP_WORK_DIR"):
        assert first.env[key] != second.env[key], f"two gateways share {key}"
    assert all(spec.restart for spec in (first, second))  # each under its own keeper


def test_a_bad_replica_count_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVELOOP_REPLICAS_GATEWAY", "0")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        loop_components(_stack(tmp_path))


def test_the_distillers_topics_are_replicated_as_the_loops(tmp_path: Path) -> None:
    distiller = {spec.name: spec for spec in loop_components(_stack(tmp_path, brokers=3))}["distiller"]
    assert distiller.env["LIVELOOP_DISTILL_REPLICATION_FACTOR"] == "3"
    assert distiller.env["LIVELOOP_DISTILL_MIN_INSYNC_REPLICAS"] == "2"
    assert distiller.env["LIVELOOP_DISTILL_BOOTSTRAP"].count(",") == 2  # all three brokers
