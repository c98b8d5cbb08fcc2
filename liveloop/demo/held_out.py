"""An agent scenario's held-out evaluation: the base and the judged checkpoint, each sampled on the same fixed tasks.

Why: the report's figures by version come from the trajectories each version served, and the version the verdict
judges (the newest promoted one) serves only the run's last minutes. In a 12-minute swarm demo that is about 50
many-part tasks, a 95 % interval of about +-1.7 critical steps, as wide as what twelve minutes teach; the base,
serving until the first promotion, is measured on a different, also small, set of tasks. A checkpoint is a
folder: here each one is sampled as the torch engine samples (:func:`serving.torch_decode.decode_batch`,
temperature 1, the session's stop and token limit) on the same tasks, drawn from their own seed (never a run's),
and its answers are worked out by the simulator's own rules. Both sides then have hundreds of tasks, the same
ones, and the verdict judges them (:mod:`liveloop.demo.agent_report`); the served figures stay in the report.

Only ``swarm`` has one: its decision is one turn, which a checkpoint answers alone. The summary and prune
sessions are many turns, each depending on the last, and their verdicts stay on served trajectories.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HELD_OUT_TASKS = 400
"""Tasks each checkpoint answers: about 210 many-part swarm tasks, a 95 % interval of about +-0.8 critical steps,
in about 10 seconds a checkpoint on one core."""

HeldOutEvaluation = Callable[[Path, int], Mapping[str, Any]]
"""``(checkpoint folder, tasks) -> figures``, keyed as the simulator's tally keys them
(``{"rate"|"mean", "n", "low", "high"}``), ``trajectories`` included."""

_BATCH = 64
"""Prompts decoded together: each row samples with its own seed, so the batch changes nothing but float rounding."""


def held_out_rng(index: int) -> random.Random:
    """The RNG of held-out task ``index``: a namespace of its own, so that no run's seed draws the same tasks."""
    return random.Random(f"liveloop-held-out:{index}")  # noqa: S311 - repeatable, not cryptography


def swarm_held_out(folder: Path, tasks: int = HELD_OUT_TASKS) -> Mapping[str, Any]:
    """The swarm figures of the checkpoint in ``folder`` on held-out tasks ``0 .. tasks - 1``.

    Each answer is sampled with the seed the task's RNG draws next, as :func:`~liveloop.demo.simulator.swarm_session.
    run_swarm_session` draws it, so that two checkpoints meet the same tasks with the same random numbers. Raises
    :class:`serving.errors.LoadFailed` if the folder does not load.
    """
    import torch

    from liveloop.demo.simulator.context import CONTEXT_BYTES
    from liveloop.demo.simulator.swarm import draw_task, read_decision, settle
    from liveloop.demo.simulator.swarm_session import swarm_figures, swarm_record
    from serving.engine import SamplingParams
    from serving.torch_decode import decode_batch
    from serving.torch_load import load_version

    device = torch.device("cpu")  # a tiny model: loading it onto a GPU would cost more than it saves

    def full_weights_only() -> Path:
        raise ValueError(f"{folder} is a LoRA adapter; the held-out evaluation loads full weights only")

    loaded = load_version(folder, 0, full_weights_only, device, torch.float32)
    drawn = []
    for index in range(tasks):
        rng = held_out_rng(index)
        task = draw_task(rng)
        drawn.append((task, rng.randrange(2**31)))
    records = []
    for start in range(0, tasks, _BATCH):
        chunk = drawn[start : start + _BATCH]
        prompts = [task.prompt() for task, _ in chunk]
        params = [
            SamplingParams(temperature=1.0, max_tokens=CONTEXT_BYTES - len(p.encode()), stop=("\n",), seed=seed)
            for p, (_, seed) in zip(prompts, chunk, strict=True)
        ]
        with torch.inference_mode():
            answers = decode_batch(
                loaded.model, loaded.tokenizer, [loaded.encode(p) for p in prompts], params, device, loaded.eos_ids
            )
        records += [
            swarm_record(settle(task, read_decision(answer.text)), policy_version=0)
            for (task, _), answer in zip(chunk, answers, strict=True)
        ]
    return swarm_figures(0, records)


def checkpoint_folder(state_dir: Path, policy_version: int) -> Path:
    """The folder the demo's learner wrote ``policy_version`` into (the base, version 1, included)."""
    from learner.checkpoint import checkpoint_id_for
    from learner.settings import LearnerSettings
    from learner.state import DataDir

    learner_dir = state_dir.resolve() / "learner"  # the learner component's data folder (liveloop.components)
    return DataDir(learner_dir).checkpoint(checkpoint_id_for(LearnerSettings().model_name, policy_version))
