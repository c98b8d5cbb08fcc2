"""The hot-swap controller against the real broker, MLflow and PostgreSQL, with the torch engine.

- Under load (threads calling the engine without pause), three promotions and one rollback: no
  request fails, and every response names a policy version that was champion while it ran. The
  controller reads the registry as the gateway's does, through a helper process (RegistryWorker).
- A checkpoint whose manifest has a wrong sha256, and one with NaN weights, are refused: the champion
  keeps serving and a swap-failed event (typed) appears on the promotions topic.
- Staging: an announced candidate is downloaded, checked and loaded (not served) before its promotion,
  which is then a switch; a candidate that fails a check is reported when announced, and never swapped in.
- Canary: the candidate alias is loaded and a sticky share of sessions is routed to it; a reject stops it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from infra.migrations import migrate
from infra.registry import CANDIDATE, CHAMPION, Registry
from infra.stack import Endpoints
from serving.canary import in_canary
from serving.engine import SamplingParams
from serving.promotion import Promoter
from serving.promotions_contract import PromotionEvent, SwapFailedEvent, parse_message
from serving.registry_worker import RegistryWorker
from serving.settings import ServingSettings
from serving.swap import SwapController, VersionSource
from serving.torch_engine import TorchEngine
from tests.serving.checkpoints import (
    announce_candidate,
    corrupt_manifest_hash,
    nan_model,
    register,
    write_checkpoint,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@dataclass
class Setup:
    name: str
    topic: str
    registry: Registry
    promoter: Promoter
    engine: TorchEngine
    versions: dict[int, int]  # model version -> policy version


@pytest.fixture
def engine() -> Iterator[TorchEngine]:
    eng = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=1.0)
    yield eng
    eng.close()


def _setup(
    endpoints: Endpoints, dsn: str, topic: str, tmp: Path, engine: TorchEngine, count: int, first_policy: int = 0
) -> Setup:
    """``count`` checkpoints with policy versions from ``first_policy`` up, registered as MLflow versions 1, 2...
    (``first_policy=1`` numbers them as the learner does: a checkpoint's version is its MLflow version)."""
    migrate(dsn)
    name = f"test-swap-{uuid.uuid4().hex[:8]}"
    versions = {}
    for policy in range(first_policy, first_policy + count):
        write_checkpoint(tmp / f"p{policy}", model_name=name, policy_version=policy, seed=policy)
        versions[register(endpoints.mlflow_url, tmp / f"p{policy}", name)] = policy
    registry = Registry(endpoints.mlflow_url)
    promoter = Promoter(registry=registry, dsn=dsn, bootstrap=endpoints.kafka_bootstrap, topic=topic, model_name=name)
    promoter.promote(1, actor="test", reason="first champion")
    return Setup(name, topic, registry, promoter, engine, versions)


def _controller(
    s: Setup,
    endpoints: Endpoints,
    tmp: Path,
    registry: VersionSource | None = None,
    checkpoints_topic: str | None = None,
    **options: float,
) -> SwapController:
    settings = ServingSettings(
        model_name=s.name,
        bootstrap=endpoints.kafka_bootstrap,
        promotions_topic=s.topic,
        # Without one, a topic nobody announces on: candidates are staged by the periodic pass only.
        checkpoints_topic=checkpoints_topic or f"unannounced-{uuid.uuid4().hex[:8]}",
        swap_work_dir=tmp / "swap",
        swap_reconcile_interval_s=options.get("reconcile_interval_s", 30.0),
        canary_fraction=options.get("canary_fraction", 0.0),
        swap_unload_grace_s=options.get("unload_grace_s", 0.5),
    )
    return SwapController(s.engine, settings, registry=registry or s.registry)


def _wait(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _messages(bootstrap: str, topic: str) -> list[PromotionEvent | SwapFailedEvent]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    found = []
    while consumer.position(tp) < end:
        for records in consumer.poll(timeout_ms=1000).values():
            found += [parse_message(r.value) for r in records]
    consumer.close()
    return found


def test_three_promotions_and_a_rollback_under_load_drop_nothing(
    endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str], tmp_path: Path, engine: TorchEngine
) -> None:
    s = _setup(endpoints, fresh_database, make_topic(), tmp_path, engine, count=4)
    controller = _controller(s, endpoints, tmp_path, registry=RegistryWorker(endpoints.mlflow_url))
    controller.start()
    try:
        assert engine.default_version == 0
        # Champion intervals per policy version: [moment its promotion began, moment the next switch was seen].
        intervals: dict[int, list[list[float]]] = {0: [[0.0, float("inf")]]}
        results: list[tuple[float, float, int]] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def client(worker: int) -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    out = engine.generate([f"request {worker}"], GREEDY)
                except BaseException as exc:  # a test thread must report every failure
                    errors.append(exc)
                    return
                results.append((started, time.monotonic(), out[0].policy_version))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()

        def move(action: Callable[[], PromotionEvent], model_version: int) -> None:
            policy = s.versions[model_version]
            before = controller.champion
            assert before is not None
            intervals.setdefault(policy, []).append([time.monotonic(), float("inf")])
            event = action()
            assert event.to_version == model_version
            _wait(
                lambda: controller.champion is not None and controller.champion.model_version == model_version, "swap"
            )
            intervals[before.policy_version][-1][1] = time.monotonic()
            count = len(results)
            _wait(lambda: len(results) >= count + 5, "requests on the new version")

        for version in (2, 3, 4):
            move(lambda v=version: s.promoter.promote(v, actor="test", reason=f"to v{v}"), version)
        move(lambda: s.promoter.rollback(actor="test", reason="back"), 3)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)

        assert errors == []
        assert {v for _, _, v in results} == {0, 1, 2, 3}
        for started, ended, version in results:
            overlaps = [low <= ended and started <= high for low, high in intervals[version]]
            assert any(overlaps), (version, started, ended, intervals)
        # The rollback target (v3, policy 2) was still loaded: previous champions stay for instant rollbacks;
        # older ones are unloaded after the grace period.
        assert controller.previous is not None
        assert controller.previous.policy_version == 3
        _wait(lambda: engine.loaded_versions == [2, 3], "old versions unloaded")
        assert controller.swaps._value.get() == 5  # the start plus four moves
    finally:
        controller.stop()


@pytest.mark.parametrize("checked_in", ["this process", "the registry helper"])
def test_bad_checksum_and_nan_weights_are_refused_and_reported(
    endpoints: Endpoints,
    fresh_database: str,
    make_topic: Callable[..., str],
    tmp_path: Path,
    engine: TorchEngine,
    checked_in: str,
) -> None:
    """The gateway checks in its registry helper (CheckpointRefused crosses the process boundary)."""
    s = _setup(endpoints, fresh_database, make_topic(), tmp_path, engine, count=1)
    bad_hash = write_checkpoint(tmp_path / "bad-hash", model_name=s.name, policy_version=1, seed=1)
    corrupt_manifest_hash(tmp_path / "bad-hash", bad_hash)
    v_hash = register(endpoints.mlflow_url, tmp_path / "bad-hash", s.name)
    write_checkpoint(tmp_path / "nan", model_name=s.name, policy_version=2, model=nan_model())
    v_nan = register(endpoints.mlflow_url, tmp_path / "nan", s.name)
    helper = RegistryWorker(endpoints.mlflow_url) if checked_in == "the registry helper" else None
    controller = _controller(s, endpoints, tmp_path, registry=helper)
    controller.start()
    try:
        for version in (v_hash, v_nan):
            s.promoter.promote(version, actor="test", reason="should be refused")
            _wait(lambda v=version: v in controller.refused, f"v{version} refused")
            assert engine.default_version == 0
            assert engine.generate(["still serving?"], GREEDY)[0].policy_version == 0
        assert engine.loaded_versions == [0]
        assert controller.failures.labels("verify")._value.get() == 2
    finally:
        controller.stop()
    failed = [m for m in _messages(endpoints.kafka_bootstrap, s.topic) if isinstance(m, SwapFailedEvent)]
    assert [(m.model_version, m.stage, m.role, m.serving_policy_version) for m in failed] == [
        (v_hash, "verify", "champion", 0),
        (v_nan, "verify", "champion", 0),
    ]
    assert "sha256" in failed[0].error
    assert "NaN/Inf" in failed[1].error


def test_an_announced_candidate_is_loaded_unserved_and_its_promotion_is_a_switch(
    endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str], tmp_path: Path, engine: TorchEngine
) -> None:
    s = _setup(endpoints, fresh_database, make_topic(), tmp_path, engine, count=3)  # v1 (champion), v2, v3
    bad = write_checkpoint(tmp_path / "bad-hash", model_name=s.name, policy_version=3, seed=3)
    corrupt_manifest_hash(tmp_path / "bad-hash", bad)
    v_bad = register(endpoints.mlflow_url, tmp_path / "bad-hash", s.name)
    checkpoints = make_topic()
    controller = _controller(
        s, endpoints, tmp_path, registry=RegistryWorker(endpoints.mlflow_url), checkpoints_topic=checkpoints
    )
    controller.start()

    def announce(model_version: int, folder: Path) -> None:
        announce_candidate(endpoints.mlflow_url, endpoints.kafka_bootstrap, checkpoints, folder, model_version)

    def staged() -> int | None:
        return controller.staged.model_version if controller.staged else None

    try:
        announce(2, tmp_path / "p1")
        _wait(lambda: staged() == 2, "v2 staged")
        first = controller.staged
        assert first is not None
        assert first.policy_version == 1
        assert engine.loaded_versions == [0, 1]  # staged: loaded beside the champion
        assert engine.default_version == 0  # and not served
        assert engine.generate(["hello"], GREEDY)[0].policy_version == 0

        announce(3, tmp_path / "p2")  # a newer candidate replaces it: unloaded, and its folder goes
        _wait(lambda: staged() == 3, "v3 staged")
        assert not first.folder.exists()
        assert engine.loaded_versions == [0, 2]
        second = controller.staged
        assert second is not None

        s.promoter.promote(3, actor="test", reason="passed")
        _wait(lambda: engine.default_version == 2, "the swap to v3")
        assert controller.champion is not None
        assert controller.champion is second  # the staged version: a switch, no second download or load
        assert second.folder.exists()
        assert controller.staged is None
        assert engine.generate(["hello"], GREEDY)[0].policy_version == 2

        announce(v_bad, tmp_path / "bad-hash")  # refused when announced, before anyone promotes it
        _wait(lambda: v_bad in controller.refused, "the bad candidate refused")
        assert controller.staged is None
        s.promoter.promote(v_bad, actor="test", reason="promoted by mistake")
        controller.reconcile()
        assert engine.default_version == 2
        assert engine.generate(["still serving?"], GREEDY)[0].policy_version == 2
    finally:
        controller.stop()
    failed = [m for m in _messages(endpoints.kafka_bootstrap, s.topic) if isinstance(m, SwapFailedEvent)]
    assert [(m.model_version, m.stage, m.role, m.serving_policy_version) for m in failed] == [
        (v_bad, "verify", "candidate", 2)
    ]
    assert "sha256" in failed[0].error


def test_responses_name_the_champion_by_its_mlflow_version(
    endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str], tmp_path: Path, engine: TorchEngine
) -> None:
    """Checkpoints numbered as the learner numbers them: after each promotion (and a rollback) the version every
    response names (the gateway's ``policy_version`` and ``X-Liveloop-Policy-Version``) is the version the
    ``champion`` alias points at, the one ``liveloop promote N`` took, and the history's ``to_version``."""
    s = _setup(endpoints, fresh_database, make_topic(), tmp_path, engine, count=3, first_policy=1)
    assert s.versions == {1: 1, 2: 2, 3: 3}
    controller = _controller(s, endpoints, tmp_path)
    moves = [
        lambda: s.promoter.promote(2, actor="test", reason="to version 2"),
        lambda: s.promoter.promote(3, actor="test", reason="to version 3"),
        lambda: s.promoter.rollback(actor="test", reason="back"),
    ]
    for move in [None, *moves]:
        to_version = 1 if move is None else move().to_version
        controller.reconcile()
        served = engine.generate(["which version?"], GREEDY)[0].policy_version
        assert served == to_version == s.registry.alias_version(s.name, CHAMPION)
        assert controller.champion is not None
        assert controller.champion.label == f"version {served}"
    assert to_version == 2


def test_canary_routes_a_sticky_share_of_sessions_to_the_candidate(
    endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str], tmp_path: Path, engine: TorchEngine
) -> None:
    s = _setup(endpoints, fresh_database, make_topic(), tmp_path, engine, count=2)
    s.registry.set_alias(s.name, CANDIDATE, 2)
    controller = _controller(s, endpoints, tmp_path, canary_fraction=0.3, unload_grace_s=0.0)
    controller.reconcile()
    assert engine.loaded_versions == [0, 1]
    assert engine.default_version == 0
    sessions = [f"session-{i}" for i in range(200)]
    chosen = {sid: controller.router(sid) for sid in sessions}
    assert chosen == {sid: (1 if in_canary(sid, 0.3) else None) for sid in sessions}
    assert 40 <= sum(v == 1 for v in chosen.values()) <= 80  # about 30% of 200
    assert chosen == {sid: controller.router(sid) for sid in sessions}  # sticky
    assert controller.router(None) is None
    canary_session = next(sid for sid, v in chosen.items() if v == 1)
    assert engine.generate(["hi"], GREEDY, controller.router(canary_session))[0].policy_version == 1

    s.promoter.reject(2, actor="test", reason="canary looked bad")
    controller.reconcile()
    assert controller.router(canary_session) is None
    controller.reconcile()  # the grace period is 0: the canary is unloaded on the next pass
    assert engine.loaded_versions == [0]
