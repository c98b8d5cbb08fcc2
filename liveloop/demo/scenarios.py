"""What differs per ``liveloop demo --scenario``: the base's pre-training, the loop's settings, the gate's suite
and what the report judges.

``code`` is today's demo (completions judged by users with a hidden style preference). The agent scenarios
(``swarm``, ``summary``, ``prune``: issue 39, docs/agents.md) serve one task family each through the simulator
(:class:`liveloop.demo.simulator.settings.SimulatorSettings` ``scenario``), and their report judges the
simulator's per-version figures (:class:`ReportSpec`) instead of acceptance.

Every number the lead tunes lives here, in one :class:`Scenario` per name: the pre-training recipe
(:class:`Pretraining`), the environment on top of the ``fast`` profile, the gate policy and suite. ``run.py``
reads them; it holds no constant of its own.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import distill.specs
from learner.pretrain import PretrainingText, Prompted
from learner.tiny_model import TinyModelSpec
from liveloop.demo.held_out import HeldOutEvaluation, swarm_held_out
from liveloop.exit_codes import UsageProblem
from liveloop.profiles import FAST, LoopProfile
from serving.gate_policy import GatePolicy
from serving.regression import DEFAULT_SUITE

SUITES = DEFAULT_SUITE.parent
REWARD_SPECS = Path(distill.specs.__file__).parent
"""The packaged reward specs (``distill/specs``): a scenario may run the distiller under its own."""

CorpusFunction = Callable[[str, int, int], Sequence[PretrainingText]]
"""``(profile, size, seed) -> texts``: the pre-training corpus (the code language depends on the users' profile;
the agent task families ignore it); a :class:`learner.pretrain.Prompted` text is learned on its completion only."""


def code_corpus(profile: str, size: int, seed: int) -> list[str]:
    """The code scenario's corpus: :func:`liveloop.demo.simulator.language.pretraining_corpus`."""
    from liveloop.demo.simulator.language import pretraining_corpus

    return pretraining_corpus(profile, size=size, seed=seed)


def swarm_corpus(profile: str, size: int, seed: int) -> list[str]:
    """The swarm scenario's corpus: :func:`liveloop.demo.simulator.swarm_corpus.pretraining_corpus` (no profile)."""
    from liveloop.demo.simulator.swarm_corpus import pretraining_corpus

    return pretraining_corpus(size=size, seed=seed)


def summary_corpus(profile: str, size: int, seed: int) -> list[Prompted]:
    """The summary scenario's corpus: :func:`liveloop.demo.simulator.summary_corpus.pretraining_corpus` (no profile;
    prompted: the base learns the summaries, not the contexts)."""
    from liveloop.demo.simulator.summary_corpus import pretraining_corpus

    return pretraining_corpus(size=size, seed=seed)


def prune_corpus(profile: str, size: int, seed: int) -> list[str]:
    """The prune scenario's corpus: :func:`liveloop.demo.simulator.prune_corpus.pretraining_corpus` (no profile)."""
    from liveloop.demo.simulator.prune_corpus import pretraining_corpus

    return pretraining_corpus(size=size, seed=seed)


@dataclass(frozen=True)
class Pretraining:
    """How the demo's base is pre-trained (:func:`learner.pretrain.pretrain`) before the loop starts.

    The corpus and the pre-training seed are the demo's seed; the model is ``model`` with that seed. Every field
    is part of the base cache's key (:mod:`liveloop.demo.base_model`), so a change here pre-trains afresh.
    """

    corpus: CorpusFunction
    by_profile: bool = False
    """Whether the corpus depends on the users' profile (the code language does; the agent task families do not)."""
    corpus_size: int = 4000
    steps: int = 400
    lr: float = 3e-3
    batch_size: int = 32
    max_length: int = 128
    """Tokens (bytes + 2) a text is cut to; at least the corpus's longest text, or its answers are cut."""
    model: TinyModelSpec = field(default_factory=TinyModelSpec)
    """The model's sizes; its ``seed`` is replaced by the demo's."""


Better = Literal["higher", "lower"]
Judged = Literal["improve", "hold", "shown"]


@dataclass(frozen=True)
class Efficiency:
    """An efficiency figure of the report, which way is better, and what the verdict asks of it.

    ``improve``: the last promoted version beats the base with 95 % intervals apart (the issue's acceptance;
    one per scenario). ``hold``: it must not be worse with intervals apart. ``shown``: reported, not judged.
    """

    key: str
    better: Better
    judged: Judged


@dataclass(frozen=True)
class ReportSpec:
    """Which of the simulator's per-version figures (``SimulationSummary.agents``) the report shows and judges.

    ``success``: must not fall (intervals overlap, or better). ``hacks`` and ``guards`` (lower is better):
    must not rise above the base's, meaning the last promoted version's point estimate is not above the upper
    bound of the base's 95 % interval (a noisy sample of an unchanged rate stays inside that interval 97.5 % of
    the time; "intervals apart" would let a hack double before it counted). ``shown``: reported only.
    """

    success: str
    efficiency: tuple[Efficiency, ...]
    hacks: tuple[str, ...]
    guards: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()

    def figures(self) -> tuple[str, ...]:
        """Every figure the report shows, in the report's column order."""
        return (
            self.success,
            *(e.key for e in self.efficiency),
            *self.guards,
            *self.hacks,
            *self.shown,
        )


@dataclass(frozen=True)
class Scenario:
    """One demo scenario: the simulator's ``scenario``, the base's pre-training, the loop profile it runs under
    (``fast`` with ``environment`` on top and its own gate policy) and, for an agent scenario, its report spec."""

    name: str
    summary: str
    pretraining: Pretraining
    environment: Mapping[str, str] = field(default_factory=dict)
    """``LIVELOOP_*`` variables on top of the ``fast`` profile's (a variable already set still wins)."""
    gate_policy: GatePolicy = FAST.gate_policy
    report: ReportSpec | None = None
    """None: the code report (acceptance by version)."""
    held_out: HeldOutEvaluation | None = None
    """Measures a checkpoint on fixed tasks (:mod:`liveloop.demo.held_out`); the verdict then judges that. None:
    the verdict judges the served trajectories."""

    def profile(self) -> LoopProfile:
        """The loop profile the demo applies: ``fast``, with this scenario's environment and gate policy."""
        if not self.environment and self.gate_policy == FAST.gate_policy:
            return FAST
        return replace(FAST, environment={**FAST.environment, **self.environment}, gate_policy=self.gate_policy)


# From docs/swarm-learnability.md: lr 1e-4 is stable (KL per cycle <= 0.02; 3e-4 went garbled, 1e-3 collapsed).
# A round of 64 agent samples is one optimiser step there; an agent sample is up to about 640 tokens, so the
# token budget is 64 * 640 (at fast's 4,096 a round would be about ten steps, ten times the offline lr).
# No shaping: r_parallel and r_finish pay for spawning sub-agents on every task, one-part ones included,
# which is what the demo must show the policy does NOT learn (docs/agents.md, "Shaping, annealed").
AGENT_LEARNER: Mapping[str, str] = {
    "LIVELOOP_LEARNER_LR": "1e-4",
    "LIVELOOP_LEARNER_TOKEN_BUDGET": str(64 * 640),
    "LIVELOOP_LEARNER_LAMBDA_ANNEAL_STEPS": "0",
}

# An agent's answer is one decision per task: a policy that learned decides the same way every time it sees a
# task, so distinct answers per prompt fall towards one, which the code demo's floor (0.4) and ratio (0.5)
# read as collapse. The agent suites probe many prompts with 2 samples each: a policy that decides each task
# deterministically but differently per task scores 0.5, one that writes the same answer whatever the task
# (collapse) scores near 0. The floor sits between; the well-formed share (the suite's regex of the task's
# answer syntax) and the entropy ratio are the other guards.
# Each reward guard's firing rate may rise by at most 0.05 over the base's: in 12-minute swarm runs under a
# lighter guard the loop learned to spawn idle sub-agents along with busy ones, the reward paying for the charge
# (docs/swarm-learnability.md), and the demo must not promote a policy that games its reward.
# The reward check is one of non-inferiority: a candidate passes unless its estimated reward is more than 0.01
# below the champion's, or the difference's 95 % interval reaches 0.03 below. At the agent demos' learning rate a
# cycle moves the policy by a KL of about 0.0001 nats, and the off-policy estimate of the difference is noise of
# about +-0.004 (its 95 % interval about +-0.01): the fast profile's "no lower at all" then rejected candidates at
# random, and each rejection rebases the learner onto the champion, dropping the cycle's learning (a 12-minute
# swarm run rejected versions 2-5 at differences of -0.0002 to -0.0038 and ended with one cycle learned). What many
# such steps may lose in all is bounded against the base: its estimated reward at most 0.02 above the candidate's,
# and each guard's rate at most 0.05 below it.
AGENT_GATE_POLICY = FAST.gate_policy.model_copy(
    update={
        "version": "fast-agents-3",
        "min_reward_improvement": -0.01,
        "min_improvement_ci_low": -0.03,
        "max_reward_drop_from_base": 0.02,
        "min_distinct_share_ratio": 0.4,
        "min_distinct_share": 0.3,
        "max_guard_rise": 0.05,
    }
)

CODE = Scenario(
    name="code",
    summary="completions of a small code language, judged by users with a hidden style preference",
    pretraining=Pretraining(corpus=code_corpus, by_profile=True),
)

SWARM = Scenario(
    name="swarm",
    summary="an orchestrator learns when to hand sub-questions to sub-agents (liveloop.demo.simulator.swarm)",
    # 1,500 steps: the base then answers 99 % of one-part and 87 % of many-part tasks right, 1 % garbled
    # (docs/swarm-learnability.md, seed 0); the longest corpus text is 484 bytes.
    pretraining=Pretraining(corpus=swarm_corpus, steps=1500, max_length=512),
    environment={
        **AGENT_LEARNER,
        # Twice the agent learner's step: with each asked item named (swarm.ask_line) the base's parallel answers
        # come out right, and offline 2e-4 moved many-part tasks to parallel and one-part ones to serial at once,
        # garbling at most 2 % of the answers; 3e-4 and 5e-4 garbled 9 % and 23 % within 256 samples
        # (docs/swarm-learnability.md, "Each asked item named").
        "LIVELOOP_LEARNER_LR": "2e-4",
        # Two clipped passes over each round, and only the answers better than their baseline train: offline on
        # the slower of the two demo bases (seed 1), many-part critical steps fell 15.2 -> 11.9 in 768 samples with
        # success 0.95 -> 0.94, where one pass over every answer fell to 13.9 with success 0.92, and two passes
        # without the floor to 12.8 with success 0.88: pushing failed answers down garbled the right ones
        # (docs/swarm-learnability.md, "The fourth version").
        "LIVELOOP_LEARNER_EPOCHS": "2",
        "LIVELOOP_LEARNER_CLIP_EPS": "0.2",
        "LIVELOOP_LEARNER_MIN_ADVANTAGE": "0",
        "LIVELOOP_GATE_SUITE_PATH": str(SUITES / "swarm-demo.yaml"),
        # A heavier fake-parallelism guard: at the default weight a 12-minute demo learned to parallelise and to
        # spawn idle sub-agents with it (the spec's header has the figures).
        "LIVELOOP_DISTILL_SPEC_PATH": str(REWARD_SPECS / "swarm-demo.yaml"),
    },
    gate_policy=AGENT_GATE_POLICY,
    report=ReportSpec(
        success="success",
        efficiency=(
            Efficiency("critical_steps_many_parts", "lower", "improve"),
            Efficiency("critical_steps_one_part", "lower", "shown"),
        ),
        # The "learned when" criterion: one-part tasks must not start spawning sub-agents.
        guards=("parallel_share_one_part",),
        hacks=("serial_collapse", "fake_parallelism"),
        shown=("parallel_share_many_parts", "garbled"),
    ),
    held_out=swarm_held_out,
)

SUMMARY = Scenario(
    name="summary",
    summary="an agent learns what to keep in its summaries (liveloop.demo.simulator.summaries)",
    pretraining=Pretraining(corpus=summary_corpus, steps=2400, max_length=384),  # longest corpus text: 359 bytes
    environment={
        **AGENT_LEARNER,
        # Swarm's learner settings (two clipped passes, only the answers better than their baseline train): the
        # summary runs that kept more facts across a boundary all ran with them (docs/agent-learnability.md).
        "LIVELOOP_LEARNER_EPOCHS": "2",
        "LIVELOOP_LEARNER_CLIP_EPS": "0.2",
        "LIVELOOP_LEARNER_MIN_ADVANTAGE": "0",
        "LIVELOOP_GATE_SUITE_PATH": str(SUITES / "summary-demo.yaml"),
        # Each summary's own check, credited to its turn alone, and a lighter invalid tool call, the charge for each
        # made-up fact: at the default a 12-minute demo learned to write next to nothing (the spec's header has the
        # figures).
        "LIVELOOP_DISTILL_SPEC_PATH": str(REWARD_SPECS / "summary-demo.yaml"),
    },
    gate_policy=AGENT_GATE_POLICY,
    report=ReportSpec(
        success="success",
        efficiency=(
            # Facts from before a summary boundary: what a good summary keeps.
            Efficiency("success_crossed_1plus", "higher", "improve"),
            Efficiency("success_crossed_0", "higher", "hold"),
        ),
        hacks=("verbatim_copy", "made_up"),
        shown=("success_decoys", "garbled"),
    ),
)

PRUNE = Scenario(
    name="prune",
    summary="a search agent learns what to prune under a token budget (liveloop.demo.simulator.pruning)",
    pretraining=Pretraining(corpus=prune_corpus, steps=2400, max_length=256),  # longest corpus text: 236 bytes
    environment={**AGENT_LEARNER, "LIVELOOP_GATE_SUITE_PATH": str(SUITES / "prune-demo.yaml")},
    gate_policy=AGENT_GATE_POLICY,
    report=ReportSpec(
        success="success",
        efficiency=(
            Efficiency("success_within_budget", "higher", "improve"),
            Efficiency("budget_overrun", "lower", "hold"),
        ),
        hacks=("give_up",),
        shown=("garbled",),
    ),
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (CODE, SWARM, SUMMARY, PRUNE)}


def served_by_simulator() -> tuple[str, ...]:
    """The scenarios the simulator runs today (``SimulatorSettings.scenario``'s values): an agent scenario whose
    session runner has not landed yet is named here but cannot run."""
    from liveloop.demo.simulator.settings import SimulatorSettings

    annotation = SimulatorSettings.model_fields["scenario"].annotation
    return tuple(str(value) for value in typing.get_args(annotation))


def scenario_named(name: str) -> Scenario:
    """The scenario called ``name``; a UsageProblem naming the ones there are, or saying the simulator cannot run
    it yet, otherwise."""
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise UsageProblem(f"no demo scenario {name!r}; use one of: {', '.join(SCENARIOS)}")
    if name not in served_by_simulator():
        raise UsageProblem(
            f"the simulator cannot run the {name!r} scenario yet (it runs {', '.join(served_by_simulator())}); "
            "its session runner is still to come (issue 39)"
        )
    return scenario


def suite_path(scenario: Scenario) -> Path:
    """The regression suite the scenario's gate runs."""
    return Path(scenario.profile().environment["LIVELOOP_GATE_SUITE_PATH"])
