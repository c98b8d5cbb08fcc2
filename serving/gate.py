"""The evaluation gate: judges a candidate checkpoint against the champion, records and acts on it.

For one announced candidate, in one MLflow run (experiment ``liveloop-gate``):

1. sanity: the candidate's and the champion's folders match their manifests' sha256 and hold no
   NaN/Inf weight, and the candidate's manifest records the gate's own held-out rule (a failure rejects
   at once, nothing is loaded);
2. off-policy reward estimate on held-out logged samples for both (:mod:`serving.offpolicy`: SNIS,
   truncated weights, paired bootstrap interval of the difference, ESS);
3. mean KL(candidate || champion) on the held-out sequences and the suite's prompts;
4. the regression suite, greedy (:mod:`serving.regression`), for both (the champion's rate is reported);
   then both sampled on the suite's diversity probe (:mod:`serving.diversity`: distinct share, token
   entropy, well-formed share where the suite defines it), so a candidate that collapsed is caught;
   where the policy bounds it (``max_guard_rise``), each reward guard's firing rate on the held-out agent turns,
   estimated off-policy (:func:`guard_rates`) for the candidate and for the base (policy version 1), so a
   candidate that learned a hack is caught even where its reward pays for the guard's charge. Against the
   base, not the champion: a hack learned a little per cycle rises by less than any bound between two
   neighbours, and by all of it from the base; likewise, where the policy bounds it
   (``max_reward_drop_from_base``), the base's estimated reward on the same samples, so that cycles each let
   through a little below their champion cannot lose more than the bound in all;
5. the decision by the :class:`GatePolicy`, recorded in PostgreSQL ``evaluations``, on the run and the
   model version as tags; ``promote`` and ``reject`` then go through :class:`Promoter` (alias move,
   ``promotions`` row, event); ``hold`` waits for an operator.

Held-out samples are read from the PostgreSQL ``samples`` table (the archive the distiller writes),
not from the topic: the table holds every sample for as long as the audit store keeps it. The split is
:class:`distill.samples.HeldOutRule` (one setting, one hash rule in Python, never restated in SQL); a
candidate whose manifest names another rule skipped another split, so the gate would score it on samples
it trained on: it is refused, and the refusal recorded like any failed sanity check.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from distill.samples import HeldOutRule, Sample, parse_sample
from infra.registry import CHAMPION, AliasNotSet, Registry, RegistryError
from learner.manifest import BASE_POLICY_VERSION, CheckpointAnnouncement, CheckpointManifest
from learner.publish import PublishError, record_checkpoint
from serving.diversity import DiversityStats, WellFormed, probe
from serving.errors import ServingError
from serving.gate_policy import Decision, GateMetrics, GatePolicy, decide
from serving.offpolicy import compare, snis, truncated_weights
from serving.policy_scores import load_policy_model, log_ratios, mean_kl, usable_for_ope
from serving.promotion import Promoter
from serving.regression import Suite, SuiteResult, run_suite
from serving.sanity import CheckpointRefused, check_checkpoint

EXPERIMENT = "liveloop-gate"


class GateError(ServingError):
    """The gate could not evaluate a candidate (no champion, MLflow/PostgreSQL unreachable); retry later."""


@dataclass(frozen=True)
class GateResult:
    """What the gate decided about one candidate."""

    evaluation_id: uuid.UUID
    decision: Decision
    reasons: list[str]
    metrics: GateMetrics
    run_id: str
    champion_version: int
    suite: SuiteResult | None


class Gate:
    """Evaluates candidates of one model; see the module docstring for the steps."""

    def __init__(
        self,
        *,
        registry: Registry,
        dsn: str,
        promoter: Promoter,
        policy: GatePolicy,
        suite: Suite,
        held_out: HeldOutRule,
        max_held_out: int = 2000,
        work_dir: Path | None = None,
    ) -> None:
        self.registry = registry
        self.client: MlflowClient = registry.client
        self.dsn = dsn
        self.promoter = promoter
        self.policy = policy
        self.suite = suite
        self.held_out = held_out
        self.max_held_out = max_held_out
        self.work_dir = work_dir

    # -- data ------------------------------------------------------------------------------------

    def held_out_samples(self) -> list[Sample]:
        """The newest held-out samples (at most ``max_held_out``), private ones excluded, oldest first."""
        # The rule is applied here, in Python, to the ids alone, newest first, read in pages by a server-side
        # cursor until enough are held out; only the chosen samples' bodies are fetched. That reads about
        # max_held_out * 100 / percent short ids once per evaluation (hours apart): cheap, and no second copy
        # of the hash rule in SQL that could drift from the learner's.
        if self.held_out.percent == 0:
            return []
        chosen: list[str] = []
        with psycopg.connect(self.dsn) as conn:
            with conn.cursor(name="liveloop_gate_held_out") as ids:
                ids.itersize = 10_000
                # An agent turn is held out by its trajectory (distill.samples.held_out_key), so its id comes too.
                ids.execute(
                    "SELECT sample_id, body->'agent'->>'trajectory_id' FROM samples ORDER BY created_at DESC, sample_id"
                )
                for sample_id, trajectory_id in ids:
                    if self.held_out.holds_out(sample_id, trajectory_id):
                        chosen.append(sample_id)
                        if len(chosen) == self.max_held_out:
                            break
            rows = conn.execute(
                "SELECT body FROM samples WHERE sample_id = ANY(%s) ORDER BY created_at, sample_id DESC", (chosen,)
            ).fetchall()
        samples = [parse_sample(json.dumps(row[0])) for row in rows]
        return [s for s in samples if not s.privacy_mode]

    def reward_by_version(self) -> dict[int, tuple[int, float]]:
        """policy version -> (samples, mean reward) over every sample: the canary's outcome per arm."""
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute("SELECT policy_version, count(*), avg(reward) FROM samples GROUP BY 1").fetchall()
        return {int(v): (int(n), float(mean)) for v, n, mean in rows}

    def already_evaluated(self, checkpoint_id: str) -> bool:
        """Whether an evaluation of this checkpoint is recorded (the gate evaluates a checkpoint once)."""
        with psycopg.connect(self.dsn) as conn:
            return (
                conn.execute("SELECT 1 FROM evaluations WHERE checkpoint_id = %s", (checkpoint_id,)).fetchone()
                is not None
            )

    # -- evaluating ------------------------------------------------------------------------------

    def evaluate(self, announcement: CheckpointAnnouncement) -> GateResult:
        """Evaluate, record and act on one candidate (see the module docstring)."""
        name = announcement.model_name
        try:
            champion_version = int(self.registry.version_by_alias(name, CHAMPION).version)
        except (AliasNotSet, RegistryError) as exc:
            raise GateError(f"cannot evaluate {announcement.checkpoint_id}: {exc}") from exc
        if self.work_dir is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="liveloop-gate-", dir=self.work_dir))
        try:
            return self._evaluate(announcement, champion_version, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _evaluate(self, a: CheckpointAnnouncement, champion_version: int, scratch: Path) -> GateResult:
        candidate_dir = self._download(a.model_name, a.model_version, scratch / "candidate")
        champion_dir = self._download(a.model_name, champion_version, scratch / "champion")
        problems: list[str] = []
        manifest: CheckpointManifest | None = None
        try:
            manifest = check_checkpoint(candidate_dir)
            if manifest.checkpoint_id != a.checkpoint_id or manifest.policy_version != a.policy_version:
                problems.append(
                    f"model version {a.model_version} holds {manifest.checkpoint_id} "
                    f"(policy {manifest.policy_version}), "
                    f"not the announced {a.checkpoint_id} (policy {a.policy_version})"
                )
            if manifest.held_out != self.held_out:
                recorded = manifest.held_out.describe() if manifest.held_out else "no rule (a schema 1 manifest)"
                problems.append(
                    f"candidate: trained with held-out split {recorded}, but the gate scores on "
                    f"{self.held_out.describe()} (LIVELOOP_HELD_OUT_PERCENT, distill.samples.HELD_OUT_RULE_VERSION); "
                    "it could be scored on samples it trained on: retrain it, or run the gate with its split"
                )
        except CheckpointRefused as exc:
            problems.append(f"candidate: {exc}")
        try:
            check_checkpoint(champion_dir)
        except CheckpointRefused as exc:
            problems.append(f"champion v{champion_version}: {exc}")
        suite_result: SuiteResult | None = None
        diversity: dict[str, DiversityStats] = {}
        by_version = self.reward_by_version()
        if problems:
            metrics = GateMetrics(held_out_samples=0, sanity_ok=False)
        else:
            base_dir = None
            if self.policy.compares_with_base:
                base_dir = (
                    champion_dir
                    if champion_version == BASE_POLICY_VERSION
                    else self._download(a.model_name, BASE_POLICY_VERSION, scratch / "base")
                )
            metrics, suite_result, diversity = self._measure(candidate_dir, champion_dir, base_dir)
        decision, reasons = decide(self.policy, metrics, problems)
        evaluation_id = uuid.uuid4()
        run_id = self._log_run(a, champion_version, metrics, decision, reasons, suite_result, by_version, diversity)
        self._record(a, manifest, evaluation_id, champion_version, run_id, metrics, decision, reasons, by_version)
        if decision == "reject":
            summary = "gate reject: " + "; ".join(r.removeprefix("FAIL ") for r in reasons if r.startswith("FAIL"))
        else:
            summary = f"gate pass (policy {self.policy.version}, evaluation {evaluation_id}, run {run_id})"
        if decision == "promote":
            self.promoter.promote(a.model_version, actor="gate", reason=summary, evaluation_id=evaluation_id)
        elif decision == "reject":
            self.promoter.reject(a.model_version, actor="gate", reason=summary, evaluation_id=evaluation_id)
        return GateResult(evaluation_id, decision, reasons, metrics, run_id, champion_version, suite_result)

    def _download(self, name: str, version: int, destination: Path) -> Path:
        try:
            return self.registry.download(name, version, destination)
        except RegistryError as exc:
            raise GateError(f"cannot fetch {name} v{version} for evaluation: {exc}") from exc

    def _measure(
        self, candidate_dir: Path, champion_dir: Path, base_dir: Path | None = None
    ) -> tuple[GateMetrics, SuiteResult, dict[str, DiversityStats]]:
        candidate, tokenizer = load_policy_model(candidate_dir)
        champion, champion_tokenizer = load_policy_model(champion_dir)
        samples = [s for s in self.held_out_samples() if usable_for_ope(s)]
        p = self.policy
        fields: dict[str, Any] = {"held_out_samples": len(samples)}
        if samples:
            candidate_ratios, champion_ratios = log_ratios(candidate, samples), log_ratios(champion, samples)
            rewards = [s.reward for s in samples]
            cmp = compare(
                candidate_ratios,
                champion_ratios,
                rewards,
                clip=p.importance_weight_clip,
                level=p.ci_level,
                resamples=p.bootstrap_resamples,
                seed=p.seed,
            )
            fields.update(
                candidate_reward=cmp.candidate.value,
                champion_reward=cmp.champion.value,
                reward_difference=cmp.difference,
                difference_ci_low=cmp.difference_ci_low,
                difference_ci_high=cmp.difference_ci_high,
                candidate_ess=cmp.candidate.ess,
                champion_ess=cmp.champion.ess,
            )
            agent_turns = sum(1 for s in samples if s.agent is not None)
            fields["agent_samples"] = agent_turns
            if base_dir is not None:
                # The base is the champion at the first evaluation; otherwise one more model, read once a cycle.
                base_ratios = (
                    champion_ratios if base_dir == champion_dir else log_ratios(load_policy_model(base_dir)[0], samples)
                )
                base_weights = truncated_weights(base_ratios, p.importance_weight_clip)
                fields["base_reward"] = snis(base_weights, np.asarray(rewards, dtype=np.float64))
                if agent_turns >= p.min_held_out_samples:
                    fields["candidate_guard_rates"] = guard_rates(samples, candidate_ratios, p.importance_weight_clip)
                    fields["base_guard_rates"] = guard_rates(samples, base_ratios, p.importance_weight_clip)
        sequences = [list(s.prompt_token_ids or []) + list(s.completion_token_ids or []) for s in samples[:256]]
        sequences += [tokenizer(case.prompt, add_special_tokens=False)["input_ids"] for case in self.suite.cases]
        fields["mean_kl"] = mean_kl(candidate, champion, sequences)
        suite_result = run_suite(self.suite, candidate, tokenizer)
        fields["regression_pass_rate"] = suite_result.pass_rate
        fields["champion_regression_pass_rate"] = run_suite(self.suite, champion, champion_tokenizer).pass_rate
        diversity = self._diversity(candidate, tokenizer, champion, champion_tokenizer, samples)
        fields.update(_diversity_fields(diversity, self.suite.diversity.well_formed))
        return GateMetrics(**fields), suite_result, diversity

    def _diversity(
        self, candidate: Any, tokenizer: Any, champion: Any, champion_tokenizer: Any, samples: list[Sample]
    ) -> dict[str, DiversityStats]:
        """Both policies sampled on the same prompts with the same seed (the suite's diversity probe)."""
        settings = self.suite.diversity
        prompts = list(settings.prompts)
        held_out = list(dict.fromkeys(s.prompt for s in samples if s.prompt))  # distinct, oldest first
        prompts += held_out[: settings.held_out_prompts]
        return {
            "candidate": probe(candidate, tokenizer, prompts, settings),
            "champion": probe(champion, champion_tokenizer, prompts, settings),
        }

    # -- recording -------------------------------------------------------------------------------

    def _log_run(
        self,
        a: CheckpointAnnouncement,
        champion_version: int,
        metrics: GateMetrics,
        decision: Decision,
        reasons: list[str],
        suite: SuiteResult | None,
        by_version: dict[int, tuple[int, float]],
        diversity: dict[str, DiversityStats] | None = None,
    ) -> str:
        tags = {
            "liveloop.checkpoint_id": a.checkpoint_id,
            "liveloop.model_version": str(a.model_version),
            "liveloop.policy_version": str(a.policy_version),
            "liveloop.champion_version": str(champion_version),
            "liveloop.training_run_id": a.run_id,
            "liveloop.decision": decision,
            "liveloop.gate_policy_version": self.policy.version,
            "liveloop.suite": f"{self.suite.name}@{self.suite.version}",
        }
        try:
            experiment = self.client.get_experiment_by_name(EXPERIMENT)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
            run_id: str = self.client.create_run(
                experiment_id, run_name=f"gate-{a.checkpoint_id}", tags=tags
            ).info.run_id
            for key, value in self.policy.model_dump().items():
                self.client.log_param(run_id, f"policy.{key}", str(value))
            for key, value in metrics.model_dump().items():
                if isinstance(value, int | float) and math.isfinite(float(value)):
                    self.client.log_metric(run_id, key, float(value))
            for policy, rates in (
                ("candidate", metrics.candidate_guard_rates),
                ("base", metrics.base_guard_rates),
            ):
                for guard, rate in rates.items():
                    self.client.log_metric(run_id, f"guard_rate.{guard}.{policy}", rate)
            for version, (count, mean) in by_version.items():
                self.client.log_metric(run_id, f"reward_mean.policy_{version}", mean)
                self.client.log_metric(run_id, f"sample_count.policy_{version}", float(count))
            self.client.log_dict(run_id, {"decision": decision, "reasons": reasons}, "decision.json")
            if suite is not None:
                self.client.log_dict(run_id, suite.model_dump(), "regression.json")
            if diversity:
                # What each policy wrote most often: the evidence behind a diversity verdict.
                self.client.log_dict(run_id, {k: v.model_dump() for k, v in diversity.items()}, "diversity.json")
            self.client.set_terminated(run_id, "FINISHED")
            for key, value in {
                "liveloop.gate_decision": decision,
                "liveloop.gate_run_id": run_id,
                "liveloop.gate_champion_version": str(champion_version),
            }.items():
                self.client.set_model_version_tag(a.model_name, str(a.model_version), key, value)
        except MlflowException as exc:
            raise GateError(f"recording the evaluation of {a.checkpoint_id} in MLflow failed: {exc}") from exc
        return run_id

    def _record(
        self,
        a: CheckpointAnnouncement,
        manifest: CheckpointManifest | None,
        evaluation_id: uuid.UUID,
        champion_version: int,
        run_id: str,
        metrics: GateMetrics,
        decision: Decision,
        reasons: list[str],
        by_version: dict[int, tuple[int, float]],
    ) -> None:
        if manifest is not None:
            try:
                record_checkpoint(self.dsn, manifest, ())  # normally the learner did; the row must exist
            except PublishError as exc:
                raise GateError(f"cannot record checkpoint {a.checkpoint_id}: {exc}") from exc
        values = {
            k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in metrics.model_dump().items()
        }
        values["reward_by_policy_version"] = {str(v): {"samples": n, "mean": m} for v, (n, m) in by_version.items()}
        values["gate_policy"] = self.policy.model_dump()
        try:
            with psycopg.connect(self.dsn) as conn:
                conn.execute(
                    "INSERT INTO evaluations (evaluation_id, checkpoint_id, champion_version, mlflow_run_id, metrics,"
                    " decision, reasons) VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s::jsonb)",
                    (
                        evaluation_id,
                        a.checkpoint_id,
                        champion_version,
                        run_id,
                        json.dumps(values),
                        decision,
                        json.dumps(reasons),
                    ),
                )
        except psycopg.errors.ForeignKeyViolation as exc:
            raise GateError(
                f"checkpoint {a.checkpoint_id} is not in the checkpoints table and its manifest failed sanity; "
                "the learner's publish_checkpoint records it"
            ) from exc


def guard_rates(samples: list[Sample], ratios: list[float], clip: float) -> dict[str, float]:
    """Per reward guard, the share of the agent turns among ``samples`` on which it fired, under the policy whose
    ``ratios`` (:func:`serving.policy_scores.log_ratios`, one per sample) these are: the self-normalised estimate
    with weights truncated at ``clip``, as the reward's. A multi-turn trajectory counts once per trainable turn,
    as its reward does. Guards that fired on none of them are left out (their rate is 0 under any policy)."""
    picked = [(s.agent, ratio) for s, ratio in zip(samples, ratios, strict=True) if s.agent is not None]
    if not picked:
        return {}
    weights = truncated_weights([ratio for _, ratio in picked], clip)
    names = sorted({name for credit, _ in picked for name, metric in credit.guards.items() if metric > 0})
    return {
        name: snis(weights, np.array([float(credit.guards.get(name, 0.0) > 0) for credit, _ in picked]))
        for name in names
    }


def _diversity_fields(diversity: dict[str, DiversityStats], well_formed: WellFormed | None) -> dict[str, Any]:
    candidate, champion = diversity["candidate"], diversity["champion"]
    return {
        "diversity_completions": candidate.completions,
        "candidate_distinct_share": candidate.distinct_share,
        "champion_distinct_share": champion.distinct_share,
        "candidate_token_entropy": candidate.token_entropy,
        "champion_token_entropy": champion.token_entropy,
        "candidate_completion_entropy": candidate.completion_entropy,
        "champion_completion_entropy": champion.completion_entropy,
        "candidate_well_formed_share": candidate.well_formed_share,
        "champion_well_formed_share": champion.well_formed_share,
        "well_formed_validator": well_formed.label if well_formed is not None else None,
    }
