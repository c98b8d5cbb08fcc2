"""The torch engine in its own process: same answers as in-process, versions, errors, and its death."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from infra.stack import Endpoints
from serving.engine import Generation, LoadFailed, SamplingParams, UnknownVersion
from serving.engine_process import ChildExited, EngineProcess
from serving.errors import InvalidRequest
from serving.torch_engine import TorchEngine
from tests.serving.gateway_server import gateway_process

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
PROMPTS = ["def add(a, b):", "The quick brown fox jumps over", "x", "SELECT * FROM users WHERE id = "]


@pytest.fixture
def exited() -> threading.Event:
    return threading.Event()


@pytest.fixture
def engine(folders: dict[str, Path], exited: threading.Event) -> Iterator[EngineProcess]:
    """An engine process on the CPU serving version 1; ``exited`` is set if the child dies."""
    engine = EngineProcess(device="cpu", max_batch=8, batch_wait_ms=20, torch_threads=1, on_exit=exited.set)
    engine.load(folders["v1"], 1)
    yield engine
    engine.close()


def test_it_answers_exactly_as_the_engine_in_this_process(engine: EngineProcess, folders: dict[str, Path]) -> None:
    local = TorchEngine(device="cpu", max_batch=8)
    try:
        local.load(folders["v1"], 1)
        expected = [local.generate([prompt], GREEDY)[0] for prompt in PROMPTS]
    finally:
        local.close()
    results: dict[str, Generation] = {}
    barrier = threading.Barrier(len(PROMPTS))

    def call(prompt: str) -> None:  # concurrent callers, batched together in the child
        barrier.wait()
        results[prompt] = engine.generate([prompt], GREEDY)[0]

    threads = [threading.Thread(target=call, args=(prompt,)) for prompt in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for prompt, want in zip(PROMPTS, expected, strict=True):
        got = results[prompt]
        assert got.token_ids == want.token_ids
        assert got.text == want.text
        assert got.prompt_token_ids == want.prompt_token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert got.policy_version == 1


def test_versions_load_switch_and_unload_through_the_pipe(engine: EngineProcess, folders: dict[str, Path]) -> None:
    v1 = engine.generate([PROMPTS[0]], GREEDY)[0]
    engine.load(folders["v2"], 2)
    assert engine.loaded_versions == [1, 2]
    assert engine.default_version == 1
    engine.switch(2)
    assert engine.default_version == 2
    v2 = engine.generate([PROMPTS[0]], GREEDY)[0]
    assert v2.policy_version == 2
    assert v2.token_ids != v1.token_ids
    assert engine.generate([PROMPTS[0]], GREEDY, policy_version=1)[0].token_ids == v1.token_ids
    engine.unload(1)
    assert engine.loaded_versions == [2]
    with pytest.raises(UnknownVersion, match="policy version 1 is not loaded"):
        engine.generate([PROMPTS[0]], GREEDY, policy_version=1)


def test_errors_cross_the_pipe_with_their_type_and_message(engine: EngineProcess, tmp_path: Path) -> None:
    with pytest.raises(LoadFailed, match="is not a folder"):
        engine.load(tmp_path / "missing", 3)
    assert engine.loaded_versions == [1]
    with pytest.raises(InvalidRequest, match="is the default; switch to another version") as refused:
        engine.unload(1)
    assert refused.value.param is None
    with pytest.raises(InvalidRequest, match="exceeds the model's context of 1024"):
        engine.generate(["y" * 1000], SamplingParams(max_tokens=64))
    with pytest.raises(UnknownVersion, match="policy version 7 is not loaded"):
        engine.switch(7)
    assert engine.generate([PROMPTS[2]], GREEDY)[0].policy_version == 1  # and it serves on


def test_invalid_request_keeps_its_param_when_pickled() -> None:
    import pickle

    copy = pickle.loads(pickle.dumps(InvalidRequest("bad role", param="messages.0.role")))  # noqa: S301 - our bytes
    assert (str(copy), copy.param) == ("bad role", "messages.0.role")


def test_when_the_child_dies_waiting_calls_fail_and_the_owner_is_told(
    engine: EngineProcess, exited: threading.Event
) -> None:
    long = engine.submit([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=900))
    assert engine.pid is not None
    os.kill(engine.pid, signal.SIGKILL)
    with pytest.raises(ChildExited, match="the engine process exited"):
        long.result(timeout=30)
    assert exited.wait(30)
    with pytest.raises(ChildExited, match="the engine process exited"):
        engine.generate([PROMPTS[0]], GREEDY)


def test_the_gateway_stops_when_its_engine_dies_so_its_keeper_can_restart_it(
    endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path, folders: dict[str, Path]
) -> None:
    with gateway_process(endpoints, make_topic(partitions=1), tmp_path, folders["v1"]) as gateway:
        body = {"model": gateway.model, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
        headers = {"Authorization": f"Bearer {gateway.key}"}
        answered = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=headers)
        assert answered.status_code == 200, answered.text
        process = psutil.Process(gateway.process.pid)
        spawned = [p for p in process.children() if "spawn_main" in " ".join(p.cmdline())]
        # The other spawned child is the swap controller's registry helper, which lowers its own priority.
        (child,) = [p for p in spawned if p.nice() == process.nice()]
        child.kill()
        assert gateway.process.wait(timeout=60) is not None  # it stopped by itself
        assert "the engine process exited" in gateway.log_path.read_text()
