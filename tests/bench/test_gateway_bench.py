"""Benchmark: completions/s through the gateway over HTTP against the same engine called in-process.

The gateway runs as it does in production: ``python -m serving.gateway`` (uvicorn, one worker, the
torch engine on the CPU with the tiny model in its own process, generation events emitted through the
SDK to a fresh topic of the test stack's broker). A load generator in this process runs CLIENTS
threads, each with one keep-alive ``http.client`` connection, posting ``/v1/completions`` requests
(fixed prompts, max_tokens 16, greedy) for a fixed time.

CLIENTS is twice the engine's batch: a throughput benchmark offers more requests than one batch
holds, as a server under load sees, so that the next batch is queued while one decodes. With exactly
one batch's worth of clients (``CLOSED_LOOP_CLIENTS``, recorded as well), every request's round trip
is time the engine waits, and the figure measures latency instead. The load generator is the
standard library's HTTP client, the lightest at hand: on two cores, what it costs is taken from the
gateway (httpx cost about three times as much per request).

Baseline, measured in the same invocation and interleaved run by run: CLIENTS threads calling
``TorchEngine.generate`` of an engine in this process (same model, same batching settings) with the
same prompts, and the same torch thread count (``ServingSettings.torch_threads``). The ratio shows
what HTTP, JSON, authentication and event emission (the SDK's journal and Kafka producer run in the
gateway's process) cost on top of the engine. Goal: at least 0.8.

On a 2-core machine the load generator's own HTTP client competes for the cores with the gateway,
and both compete with whatever else runs there: compare runs only on a quiet machine.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from infra.stack import Endpoints
from learner.tiny_model import save_tiny_model
from serving.engine import SamplingParams
from serving.settings import ServingSettings
from serving.torch_engine import TorchEngine
from tests.bench.results import write_result
from tests.serving.gateway_server import GatewayProcess, gateway_process

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 16
CLOSED_LOOP_CLIENTS = 8
RUN_S = 6.0
RUNS = 3
MAX_TOKENS = 16
MAX_BATCH = 8
BATCH_WAIT_MS = 5.0
PROMPTS = [
    f"def {name}(items: list[int]) -> int:\n    # {comment}\n"
    for name, comment in [
        ("total", "sum the items"),
        ("largest", "the biggest item"),
        ("smallest", "the smallest item"),
        ("count_even", "how many are even"),
        ("mean", "the average, 0 when empty"),
        ("span", "largest minus smallest"),
        ("first_odd", "the first odd item or -1"),
        ("product", "multiply them all"),
    ]
]


def _drive(
    call: Callable[[int, Any], bool], make_session: Callable[[], Any], clients: int = CLIENTS
) -> tuple[int, float, int]:
    """Run ``clients`` threads calling ``call(i, session)`` for RUN_S seconds; (completions, seconds, failures)."""
    done = [0] * clients
    failed = [0] * clients
    stop_at = time.perf_counter() + RUN_S

    def client(slot: int) -> None:
        session = make_session()
        try:
            i = slot
            while time.perf_counter() < stop_at:
                if call(i, session):
                    done[slot] += 1
                else:
                    failed[slot] += 1
                i += clients
        finally:
            if session is not None:
                session.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done), time.perf_counter() - started, sum(failed)


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    return save_tiny_model(tmp_path / "model")


@pytest.fixture
def gateway(
    endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path, model_folder: Path
) -> Iterator[GatewayProcess]:
    """``python -m serving.gateway`` on a free port serving the tiny model as version 1."""
    with gateway_process(
        endpoints,
        make_topic(partitions=1),
        tmp_path,
        model_folder,
        MAX_BATCH=str(MAX_BATCH),
        BATCH_WAIT_MS=str(BATCH_WAIT_MS),
    ) as running:
        yield running


def test_gateway_throughput(gateway: GatewayProcess, model_folder: Path) -> None:
    # The baseline engine runs as the gateway's does: ServingSettings' torch_threads (1) and batching.
    threads = torch.get_num_threads()
    torch.set_num_threads(ServingSettings().torch_threads or threads)
    engine = TorchEngine(device="cpu", max_batch=MAX_BATCH, batch_wait_ms=BATCH_WAIT_MS)
    engine.load(model_folder, 1)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    headers = {"Authorization": f"Bearer {gateway.key}", "Content-Type": "application/json"}
    address = httpx.URL(gateway.url)
    bodies = [
        json.dumps({"model": gateway.model, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
        for p in PROMPTS
    ]

    def connect() -> http.client.HTTPConnection:
        return http.client.HTTPConnection(address.host, address.port, timeout=60)

    def over_http(i: int, connection: http.client.HTTPConnection) -> bool:
        connection.request("POST", "/v1/completions", body=bodies[i % len(bodies)], headers=headers)
        response = connection.getresponse()
        body = response.read()
        return response.status == 200 and json.loads(body)["liveloop"]["policy_version"] == 1

    def in_process(i: int, _: None) -> bool:
        return engine.generate([PROMPTS[i % len(PROMPTS)]], params)[0].policy_version == 1

    def ratio_at(clients: int, runs: int) -> tuple[list[float], list[float], int]:
        measured, baseline, failed = [], [], 0
        for _ in range(runs):
            done, seconds, failures = _drive(over_http, connect, clients)
            measured.append(done / seconds)
            failed += failures
            done, seconds, failures = _drive(in_process, lambda: None, clients)
            baseline.append(done / seconds)
            failed += failures
        return measured, baseline, failed

    try:
        _drive(over_http, connect)  # warm up connections and both engines
        _drive(in_process, lambda: None)
        measured, baseline, failed = ratio_at(CLIENTS, RUNS)
        closed_measured, closed_baseline, closed_failed = ratio_at(CLOSED_LOOP_CLIENTS, 1)
    finally:
        engine.close()
        torch.set_num_threads(threads)
    write_result(
        name="gateway_throughput",
        unit="completions/s",
        value=statistics.median(measured),
        baseline_name=f"TorchEngine.generate called in-process by {CLIENTS} threads (same model, prompts, batching)",
        baseline_value=statistics.median(baseline),
        goal_ratio=0.8,
        runs=RUNS,
        extra={
            "clients": CLIENTS,
            "run_s": RUN_S,
            "max_tokens": MAX_TOKENS,
            "max_batch": MAX_BATCH,
            "batch_wait_ms": BATCH_WAIT_MS,
            "torch_threads": ServingSettings().torch_threads,
            "runs_completions_per_s": measured,
            "runs_baseline_completions_per_s": baseline,
            "failed_requests": failed,
            "closed_loop": {
                "clients": CLOSED_LOOP_CLIENTS,
                "completions_per_s": closed_measured[0],
                "baseline_completions_per_s": closed_baseline[0],
                "ratio": closed_measured[0] / closed_baseline[0],
            },
        },
    )
    assert failed == 0
    assert closed_failed == 0
