"""Benchmark: hot-swapping the champion under load (tiny model, CPU torch engine, real stack).

The engine runs as the gateway runs it: in a process of its own (``serving.engine_process``, the
settings' torch threads), the swap controller beside the callers in this process, with its registry
calls made by a helper process (``serving.registry_worker``). Promotions come from a process in a
session of its own, as they come from the gate or the ops service that ``liveloop up`` starts
(``PROMOTER``).

Two clients call the engine without pause while the champion is promoted eight times; before each
promotion comes a steady window without any swap. Each promoted version comes as the
learner's do: announced as the candidate first, which the controller stages (downloads, checks and
loads beside the champion, not served) while it waits for its evaluation; the bench waits for the
staging before the steady window.

A swap starts at the promotion event, as the issue times it: the decision before it (the history row,
the alias move, the MLflow tags) is the deciding service's work. That work shares this machine's two
cores with serving (on a real deployment the registry and the database run elsewhere), so the p99 of
the requests that overlapped a whole decision and its swap is recorded too.

- ``swap_time``: seconds from the promotion event to the first response served by the new version,
  median of the eight. Baseline: ``engine.load`` + ``switch`` of a folder already on disk (what a swap
  costs without registry, download and event). Goal: under 5 s (``{"seconds_at_most": 5}``). Also
  recorded: the seconds from the start of each decision (``Promoter.promote``) instead.
- ``swap_p99_latency``: p99 request latency of requests that overlapped a swap (promotion event until
  1 s after the first response on the new version) against the p99 of the steady windows, which
  alternate with the swaps. Goal: at most 1.2 times (``{"ratio_at_most": 1.2}``). Also recorded: the
  p99 of the requests that overlapped a decision and its swap, the p99 of those that overlapped a
  staging (announcement until staged: download, checks, load beside the champion), the staging times.
Never asserts on time.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from infra.migrations import migrate
from infra.stack import Endpoints
from serving.engine import SamplingParams
from serving.engine_process import EngineProcess
from serving.registry_worker import RegistryWorker
from serving.settings import ServingSettings
from serving.swap import SwapController
from tests.bench.results import write_result
from tests.serving.checkpoints import announce_candidate, register, write_checkpoint

SWAPS = 8
STEADY_S = 3.0
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)

# Promotes each model version read from stdin; answers "promoted T", T the monotonic clock (one clock for
# every process of the machine) when the promotion event was handed to the producer.
PROMOTER = """
import sys, time
from infra.registry import Registry
from serving.promotion import Promoter

url, dsn, bootstrap, topic, name = sys.argv[1:]
promoter = Promoter(registry=Registry(url), dsn=dsn, bootstrap=bootstrap, topic=topic, model_name=name)
publish, published = promoter._publish, []
promoter._publish = lambda event: (published.append(time.monotonic()), publish(event))[1]
print("ready", flush=True)
for line in sys.stdin:
    promoter.promote(int(line), actor="bench", reason="bench")
    print("promoted", published[-1], flush=True)
"""


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def test_swap_bench(endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    migrate(fresh_database)
    name = f"bench-swap-{uuid.uuid4().hex[:8]}"
    topic = make_topic()
    checkpoints = make_topic()
    versions: dict[int, int] = {}
    for policy in range(SWAPS + 1):
        write_checkpoint(tmp_path / f"p{policy}", model_name=name, policy_version=policy, seed=policy)
        versions[register(endpoints.mlflow_url, tmp_path / f"p{policy}", name)] = policy
    # The baseline's folders are written now: building a model holds this process's GIL for about 250 ms,
    # which in the loop would stall the requests in flight at the end of a swap's window.
    for extra in (100 + model_version for model_version in range(2, SWAPS + 2)):  # as in the loop below
        write_checkpoint(tmp_path / f"b{extra}", model_name=name, policy_version=extra, seed=extra)
    args = [endpoints.mlflow_url, fresh_database, endpoints.kafka_bootstrap, topic, name]
    promoter = subprocess.Popen(
        [sys.executable, "-c", PROMOTER, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as `liveloop up` starts each service (the kernel shares the CPU per session)
    )
    assert promoter.stdout is not None
    assert promoter.stdin is not None
    assert promoter.stdout.readline().strip() == "ready"
    # The first champion comes from the same promoter: like the gate or the ops service, it has made a
    # decision before (its connections are open) when the measured ones come.
    promoter.stdin.write("1\n")
    promoter.stdin.flush()
    assert promoter.stdout.readline().startswith("promoted")
    engine = EngineProcess(device="cpu", max_batch=8, batch_wait_ms=1.0, torch_threads=ServingSettings().torch_threads)
    settings = ServingSettings(
        model_name=name,
        bootstrap=endpoints.kafka_bootstrap,
        promotions_topic=topic,
        checkpoints_topic=checkpoints,
        swap_work_dir=tmp_path / "swap",
    )
    controller = SwapController(engine, settings, registry=RegistryWorker(endpoints.mlflow_url))
    controller.start()
    gc.freeze()  # as the gateway freezes what its start-up made (serving.gateway.main)
    done: list[tuple[float, float, int]] = []  # (start, end, policy version)
    stop = threading.Event()

    def client(worker: int) -> None:
        while not stop.is_set():
            started = time.monotonic()
            version = engine.generate([f"bench request {worker}"], GREEDY)[0].policy_version
            done.append((started, time.monotonic(), version))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    swap_times: list[float] = []
    decision_times: list[float] = []
    baselines: list[float] = []
    stage_times: list[float] = []
    staging: list[tuple[float, float]] = []
    steady: list[tuple[float, float]] = []
    swapping: list[tuple[float, float]] = []
    deciding: list[tuple[float, float]] = []
    try:
        for model_version in range(2, SWAPS + 2):
            policy = versions[model_version]
            announced = time.monotonic()
            folder = tmp_path / f"p{policy}"
            announce_candidate(endpoints.mlflow_url, endpoints.kafka_bootstrap, checkpoints, folder, model_version)
            while controller.staged is None or controller.staged.model_version != model_version:
                assert time.monotonic() - announced < 60, f"v{model_version} was not staged in 60 s"
                time.sleep(0.005)
            stage_times.append(time.monotonic() - announced)
            staging.append((announced, time.monotonic()))
            time.sleep(0.5)  # let requests slowed by the previous baseline load end outside the window
            window = time.monotonic()
            time.sleep(STEADY_S)
            steady.append((window, time.monotonic()))
            began = time.monotonic()
            promoter.stdin.write(f"{model_version}\n")
            promoter.stdin.flush()
            while not any(v == policy and end >= began for _, end, v in done[-50:]):
                time.sleep(0.005)
            first = min(end for _, end, v in done if v == policy and end >= began)
            answer, published = promoter.stdout.readline().split()
            assert answer == "promoted"
            event = float(published)
            swap_times.append(first - event)
            decision_times.append(first - began)
            time.sleep(1.0)
            swapping.append((event, time.monotonic()))
            deciding.append((began, time.monotonic()))
            # Baseline, in the same loop: load + switch of a folder already on disk, no registry or event.
            time.sleep(0.1)  # the window's last requests end before it: its load is not a swap's
            extra = 100 + model_version
            started = time.monotonic()
            engine.load(tmp_path / f"b{extra}", extra)
            baselines.append(time.monotonic() - started)
            engine.unload(extra)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        controller.stop()
        engine.close()
        promoter.kill()
        promoter.communicate(timeout=30)  # reaps it and closes its pipes
        gc.unfreeze()

    def latencies(windows: list[tuple[float, float]]) -> list[float]:
        return [e - s for s, e, _ in done if any(s <= hi and e >= lo for lo, hi in windows)]

    during, calm, staged = latencies(swapping), latencies(steady), latencies(staging)
    decided = latencies(deciding)
    write_result(
        "swap_time",
        "s",
        statistics.median(swap_times),
        "engine.load of a local folder",
        statistics.median(baselines),
        None,
        SWAPS,
        extra={
            "goal": {"seconds_at_most": 5.0},
            "swap_times_s": swap_times,
            "decision_to_first_response_s": decision_times,
            "stage_times_s": stage_times,
        },
    )
    write_result(
        "swap_p99_latency",
        "ms",
        _p99(during) * 1000,
        "p99 latency in steady windows",
        _p99(calm) * 1000,
        None,
        SWAPS,
        extra={
            "goal": {"ratio_at_most": 1.2},
            "requests_during_swaps": len(during),
            "requests_steady": len(calm),
            "median_during_ms": statistics.median(during) * 1000,
            "median_steady_ms": statistics.median(calm) * 1000,
            "p99_during_decisions_and_swaps_ms": _p99(decided) * 1000,
            "ratio_during_decisions_and_swaps": _p99(decided) / _p99(calm),
            "requests_during_decisions_and_swaps": len(decided),
            "p99_during_staging_ms": _p99(staged) * 1000,
            "requests_during_staging": len(staged),
        },
    )
