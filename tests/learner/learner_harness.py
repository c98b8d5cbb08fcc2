"""Running real learner processes in tests: samples on a real topic, ``python -m learner.service`` as ranks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from kafka import KafkaProducer

from distill.samples import Sample, sample_to_json
from tests.conftest import free_port
from tests.learner.sample_factory import make_sample

REPO = Path(__file__).resolve().parents[2]


def training_samples(first: int, count: int, seed: int = 7) -> list[Sample]:
    """``count`` trainable samples with varied tokens and rewards, numbered from ``first`` (deterministic)."""
    rng = random.Random(seed * 100_003 + first)
    samples = []
    for number in range(first, first + count):
        prompt = [rng.randrange(3, 259) for _ in range(rng.randrange(3, 8))]
        completion = [rng.randrange(3, 259) for _ in range(rng.randrange(2, 6))]
        mask = [1] * len(completion)
        if len(completion) > 2:
            mask[1] = 0  # a tool token inside the completion: must not be trained on
        samples.append(
            make_sample(
                number,
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                behaviour_logprobs=[round(-5.9 + rng.uniform(-0.5, 0.5), 4) for _ in completion],
                loss_mask=mask,
                reward=round(rng.uniform(-1, 1), 3),
                task_kind=rng.choice(["edit", "chat"]),
            )
        )
    return samples


def produce(bootstrap: str, topic: str, samples: Iterable[Sample]) -> None:
    """Send samples keyed by sample id (the distiller's convention) and wait until all are acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for sample in samples:
            producer.send(topic, key=sample.sample_id.encode(), value=sample_to_json(sample))
        producer.flush()
    finally:
        producer.close()


def learner_env(
    *, bootstrap: str, topic: str, checkpoints_topic: str, data_dir: Path, extra: Mapping[str, str] = ()
) -> dict[str, str]:
    """The environment of a learner process for tests: tiny model, one thread, checkpoints as soon as due."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVELOOP_", "MASTER_", "RANK", "LOCAL_RANK"))}
    env.pop("WORLD_SIZE", None)
    env.update(
        {
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            "LIVELOOP_LEARNER_BOOTSTRAP": bootstrap,
            "LIVELOOP_LEARNER_SAMPLES_TOPIC": topic,
            "LIVELOOP_LEARNER_CHECKPOINTS_TOPIC": checkpoints_topic,
            "LIVELOOP_LEARNER_DATA_DIR": str(data_dir),
            "LIVELOOP_LEARNER_MODEL_NAME": "test-policy",
            "LIVELOOP_LEARNER_ROUND_SAMPLES": "8",
            "LIVELOOP_LEARNER_MIN_SAMPLES": "8",
            "LIVELOOP_HELD_OUT_PERCENT": "0",  # exact counts per phase; the split has its own test
            "LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S": "0",
            "LIVELOOP_LEARNER_TOKEN_BUDGET": "30",
            "LIVELOOP_LEARNER_LR": "0.001",
            "LIVELOOP_LEARNER_THREADS": "1",
            "LIVELOOP_LEARNER_POLL_TIMEOUT_MS": "200",
            "LIVELOOP_LEARNER_STATUS_PORT": str(free_port()),
        }
    )
    env.update(dict(extra))
    return env


class LearnerJob:
    """The processes (one per rank) of one learner, with their logs."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, name: str, world_size: int = 1) -> None:
        self.name = name
        self.logs: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        port = str(free_port())
        log_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(world_size):
            rank_env = dict(env)
            rank_env["LIVELOOP_LEARNER_WORLD_SIZE"] = str(world_size)
            if world_size > 1:  # a lone learner makes its own rendezvous, as `liveloop up` runs it
                rank_env.update(
                    {
                        "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": port,
                        "RANK": str(rank),
                        "LOCAL_RANK": str(rank),
                        "WORLD_SIZE": str(world_size),
                    }
                )
            log = log_dir / f"{name}-rank{rank}-{int(time.time() * 1000)}.log"
            self.logs.append(log)
            with log.open("wb") as handle:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "learner.service"],
                        cwd=REPO,
                        env=rank_env,
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                    )
                )

    def log_tail(self, lines: int = 40) -> str:
        """The end of every rank's log, for a failure message."""
        parts = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            parts.append(f"--- {log.name} ---\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def check_alive(self) -> None:
        """Fail with the logs if a rank exited."""
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"learner {self.name} exited with {proc.returncode}:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL every rank (a crash) and reap them."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=30)

    def stop(self, timeout_s: float = 180.0) -> list[int]:
        """SIGTERM rank 0 (a graceful stop) and wait for every rank; return the exit codes."""
        self.procs[0].send_signal(signal.SIGTERM)
        codes = []
        try:
            for proc in self.procs:
                codes.append(proc.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"learner {self.name} did not stop:\n{self.log_tail()}") from None
        return codes


def wait_for(paths: Sequence[Path], jobs: Sequence[LearnerJob], timeout_s: float = 300.0) -> None:
    """Wait until every path exists, failing early (with logs) if a learner process dies."""
    deadline = time.monotonic() + timeout_s
    while not all(path.exists() for path in paths):
        for job in jobs:
            job.check_alive()
        if time.monotonic() > deadline:
            missing = [str(p) for p in paths if not p.exists()]
            logs = "\n".join(job.log_tail() for job in jobs)
            raise AssertionError(f"timed out waiting for {missing}:\n{logs}")
        time.sleep(0.3)
