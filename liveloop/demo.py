"""``liveloop demo``: the whole loop, live, on one machine, ending in a report.

1. ``up`` the services; make the base model: the tiny Llama pre-trained briefly on the simulator's
   language (so its completions are plausible and about 40 % end the way ``semicolons`` users want),
   registered as version 1, alias ``champion``;
2. start the loop's components with a compressed cadence (settings below, each overridable through
   its ``LIVELOOP_<STAGE>_*`` variable), and wait for the gateway to serve the champion;
3. run the traffic simulator for ``minutes`` while a Rich view shows events, samples, the learner's
   step, checkpoints, gate decisions, the champion and acceptance by policy version;
4. stop the simulator, write the report (:mod:`liveloop.report`), and ``down`` unless asked to keep
   the loop running.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from infra.registry import CHAMPION, AliasNotSet, Registry, RegistryError
from infra.settings import StackSettings
from infra.stack import Stack
from liveloop.components import loop_components
from liveloop.leak_scan import scan_for_leaks
from liveloop.report import collect_report, write_report

# The compressed cadence of the demo, from the learnability experiment (tests/liveloop/
# learnability_experiment.py): at lr 5e-4 a round of 64 samples per step lifts acceptance by
# 15 points within about 256 samples; one torch thread per process, because on 2 cores extra
# threads only spin against the other processes. A fifth of the samples, not a tenth, is held out for
# the gate: a checkpoint every minute or two leaves it a few dozen samples to judge on, and at a tenth
# it rejected candidates that had learned, on the width of the confidence interval or on too small
# an effective sample size. The learner and the gate must hold out the same share.
DEMO_ENVIRONMENT = {
    "LIVELOOP_LEARNER_LR": "5e-4",
    "LIVELOOP_LEARNER_ROUND_SAMPLES": "64",
    "LIVELOOP_LEARNER_TOKEN_BUDGET": "4096",
    "LIVELOOP_LEARNER_MIN_SAMPLES": "64",
    "LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S": "120",
    "LIVELOOP_HELD_OUT_PERCENT": "20",
    "LIVELOOP_LEARNER_THREADS": "1",
    "LIVELOOP_SERVING_TORCH_THREADS": "1",
    "LIVELOOP_SERVING_SWAP_RECONCILE_INTERVAL_S": "5",
    "OMP_NUM_THREADS": "1",
}
GATE_POLICY = {"version": "demo-1", "auto_promote": True, "min_held_out_samples": 20}
PRETRAIN_STEPS = 400


@dataclass(frozen=True)
class DemoOptions:
    """What ``liveloop demo`` was asked for."""

    minutes: float = 8.0
    seed: int = 7
    profile: str = "semicolons"
    report_dir: Path = Path("demo-report")
    keep_running: bool = False
    state_dir: Path = Path(".liveloop/demo")
    """The demo's own stack state, apart from ``liveloop up``'s, wiped at the start of every demo."""


def make_base_model(stack: Stack, profile: str, seed: int) -> tuple[Path, int]:
    """Pre-train the tiny base on the profile's language into ``<state>/base-model``, write it as
    lineage version 0 and register it as the first champion; return the folder and its MLflow version.
    The learner must start from this folder too (``LIVELOOP_LEARNER_BASE_MODEL``), or its first
    candidate would not descend from the champion."""
    from learner.checkpoint import write_base_checkpoint
    from learner.pretrain import pretrain
    from learner.publish import register_base
    from learner.settings import LearnerSettings
    from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer
    from liveloop.simulator.language import pretraining_corpus

    state = stack.settings.state_dir.resolve()
    source = state / "base-model"
    if not (source / "config.json").is_file():
        model, tokenizer = build_tiny_model(TinyModelSpec(seed=seed)), byte_tokenizer()
        corpus = pretraining_corpus(profile, size=4000, seed=seed)
        pretrain(model, tokenizer, corpus, steps=PRETRAIN_STEPS, lr=3e-3, batch_size=32, seed=seed, threads=1)
        model.save_pretrained(source, safe_serialization=True)
        tokenizer.save_pretrained(source)
    folder = write_base_checkpoint(state / "learner", LearnerSettings().model_name, source)
    return source, register_base(folder, mlflow_uri=stack.endpoints.mlflow_url, dsn=stack.endpoints.dsn())


def run_demo(options: DemoOptions, console: Console) -> dict[str, Any]:
    """Run the demo end to end; return the report (also written to ``options.report_dir``)."""
    from liveloop.simulator.runner import Simulation
    from liveloop.simulator.settings import SimulatorSettings
    from serving.settings import ServingSettings

    stack = Stack(StackSettings(state_dir=options.state_dir))
    stack.purge()  # every demo starts from nothing: a fresh broker, database, registry and learner
    stack = Stack(StackSettings(state_dir=options.state_dir))
    state = stack.settings.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    policy_path = state / "demo-gate-policy.json"
    policy_path.write_text(json.dumps(GATE_POLICY), encoding="utf-8")
    for key, value in {**DEMO_ENVIRONMENT, "LIVELOOP_GATE_POLICY_PATH": str(policy_path)}.items():
        os.environ.setdefault(key, value)  # the components inherit these; a user's own values win
    console.print("[bold]1/4[/bold] starting Kafka, PostgreSQL and MLflow")
    stack.up()
    console.print(f"[bold]2/4[/bold] pre-training the tiny base model on the '{options.profile}' language")
    base_folder, base_version = make_base_model(stack, options.profile, options.seed)
    os.environ["LIVELOOP_LEARNER_BASE_MODEL"] = str(base_folder)
    console.print(f"      base model registered as version {base_version} (champion)")
    components = loop_components(stack)
    console.print("[bold]3/4[/bold] starting " + ", ".join(spec.name for spec in components))
    stack.up(components)
    serving = ServingSettings()
    topics = stack.topics
    simulator = SimulatorSettings(
        gateway_url=f"http://{serving.host}:{serving.port}/v1",
        credentials_path=stack.settings.credentials_path,
        ingest_url=_ingest_url(),
        bootstrap=stack.endpoints.kafka_bootstrap,
        events_topic=topics.events.name,
        sdk_journal_dir=state / "simulator-journal",
        profile=options.profile,
        seed=options.seed,
        minutes=options.minutes,
    )
    console.print(f"[bold]4/4[/bold] simulating users for {options.minutes:g} minutes (seed {options.seed})")
    simulation = Simulation(simulator)
    simulation.start()
    deadline = time.monotonic() + options.minutes * 60
    try:
        watch = _Watch.of(stack)
        with Live(console=console, refresh_per_second=1, transient=False) as live:
            while time.monotonic() < deadline:
                live.update(_progress(stack, watch, simulation))
                time.sleep(2.0)
            simulation.stop()
            live.update(_progress(stack, watch, simulation))
        summary = simulation.finish()
        report = collect_report(stack, summary, options.profile, options.minutes, base_version)
        console.print("scanning Kafka, PostgreSQL, MLflow and the checkpoints for planted secrets and private sessions")
        secrets = [secret.secret for secret in summary.planted_secrets]
        report["leaks"] = scan_for_leaks(stack, secrets, summary.privacy_session_ids)
        report["leaks_scanned_for"] = {
            "secrets": len(summary.planted_secrets),
            "privacy_sessions": len(summary.privacy_session_ids),
        }
        write_report(report, summary, options.report_dir)
    finally:
        if options.keep_running:
            console.print(f"the loop keeps running: LIVELOOP_INFRA_STATE_DIR={options.state_dir} liveloop status")
        else:
            console.print(f"stopping the loop (its data stays in {options.state_dir} until the next demo)")
            stack.down()
    return report


def _ingest_url() -> str:
    from ingest.api import IngestSettings

    api = IngestSettings()
    return f"http://{api.host}:{api.port}"


@dataclass(frozen=True)
class _Watch:
    """What the live view reads every refresh, resolved once: the learner's status URL and the registry."""

    learner_status_url: str
    registry: Registry
    model_name: str

    @classmethod
    def of(cls, stack: Stack) -> _Watch:
        from learner.settings import LearnerSettings
        from serving.settings import ServingSettings

        learner = LearnerSettings()
        return cls(
            learner_status_url=f"http://{learner.status_host}:{learner.status_port}/status",
            registry=Registry(stack.endpoints.mlflow_url),
            model_name=ServingSettings().model_name,
        )


def _progress(stack: Stack, watch: _Watch, simulation: Any) -> Group:
    """The live view: the loop's counters and acceptance by policy version so far."""
    snapshot = simulation.snapshot()
    loop = Table("what", "now", title="liveloop demo", title_justify="left")
    elapsed = max(snapshot.duration_s, 1e-9)
    events = sum(snapshot.events.values())
    loop.add_row("events sent", f"{events:,} ({events / elapsed:.1f}/s)")
    for label, value in _database_counts(stack).items():
        loop.add_row(label, value)
    learner = _learner_status(watch.learner_status_url)
    if learner:
        loop.add_row(
            "learner",
            f"step {learner.get('step')}, policy v{learner.get('policy_version')}, "
            f"{learner.get('samples_since_checkpoint')} samples since its checkpoint",
        )
    loop.add_row("champion", _champion(watch))
    versions = Table("policy version", "requests", "acceptance", "95 % interval", title_justify="left")
    for item in snapshot.versions:
        low, high = item.acceptance_ci95
        versions.add_row(
            str(item.policy_version), str(item.requests), f"{item.acceptance_rate:.2f}", f"{low:.2f}-{high:.2f}"
        )
    return Group(loop, versions)


def _database_counts(stack: Stack) -> dict[str, str]:
    try:
        with psycopg.connect(stack.endpoints.dsn(), connect_timeout=2) as conn:
            samples = conn.execute("SELECT count(*) FROM samples").fetchone()
            checkpoints = conn.execute("SELECT count(*) FROM checkpoints WHERE policy_version > 0").fetchone()
            decisions = conn.execute(
                "SELECT c.policy_version, e.decision FROM evaluations e "
                "JOIN checkpoints c USING (checkpoint_id) ORDER BY e.decided_at"
            ).fetchall()
    except psycopg.Error:
        return {}
    return {
        "samples": f"{samples[0] if samples else 0:,}",
        "checkpoints": str(checkpoints[0] if checkpoints else 0),
        "gate decisions": ", ".join(f"v{version}: {decision}" for version, decision in decisions) or "none yet",
    }


def _learner_status(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - an http URL built from settings
            status: dict[str, Any] = json.loads(response.read())
            return status
    except (OSError, ValueError):
        return {}


def _champion(watch: _Watch) -> str:
    try:
        version = watch.registry.version_by_alias(watch.model_name, CHAMPION)
    except (AliasNotSet, RegistryError):
        return "none"
    return f"model version {version.version}"
