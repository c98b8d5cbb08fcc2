"""``liveloop demo``: the whole loop, live, on one machine, ending in a report.

What differs per ``--scenario`` (``code``, the default, or an agent scenario: ``swarm``, ``summary``,
``prune``) is :mod:`liveloop.demo.scenarios`'s: the base's pre-training, the loop's settings, the gate's
suite and what the report judges.

1. ``up`` the services; make the base model: the tiny Llama pre-trained on the scenario's corpus (code: the
   simulator's language, so its completions are plausible and about 40 % end the way ``semicolons`` users
   want), or taken from the base cache (:mod:`liveloop.demo.base_model`), registered as version 1, alias
   ``champion``;
2. start the loop's components at the ``fast`` profile's cadence (:mod:`liveloop.profiles`, with the
   scenario's settings on top, each overridable through its ``LIVELOOP_<STAGE>_*`` variable), and wait for
   the gateway to serve the champion;
3. run the traffic simulator for ``minutes`` while a Rich view shows events, samples, the learner's
   step, checkpoints, gate decisions, the champion and acceptance by version (an agent scenario: its
   success and efficiency by version);
4. stop the simulator, write the report (:mod:`liveloop.demo.report`), and ``down`` unless asked to keep
   the loop running.

The live view is :mod:`liveloop.demo.view`; while the demo runs, libraries log into
``<state>/logs/demo.log`` rather than onto the console (:mod:`liveloop.demo.quiet`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live

from infra.active import clear_mark, mark_running, refuse_if_other_running
from infra.settings import StackSettings
from infra.stack import Stack
from liveloop.components import loop_components
from liveloop.dashboard.settings import sign_in_hint
from liveloop.demo.base_model import prepare_base
from liveloop.demo.leak_scan import scan_for_leaks
from liveloop.demo.quiet import library_output_to
from liveloop.demo.report import DemoReport, LeakScan, collect_report, write_report
from liveloop.demo.scenarios import CODE, scenario_named
from liveloop.demo.settings import DemoSettings
from liveloop.demo.view import Watch, progress
from liveloop.profiles import FAST, apply_profile

# The demo runs the loop at the `fast` profile's cadence (liveloop.profiles), which `liveloop up --profile
# fast` offers to a team's own traffic. The name stays for the loops that reuse the demo's environment.
DEMO_ENVIRONMENT = FAST.environment


@dataclass(frozen=True)
class DemoOptions:
    """What ``liveloop demo`` was asked for."""

    minutes: float = 8.0
    seed: int = 7
    scenario: str = "code"
    """The demo scenario (:data:`liveloop.demo.scenarios.SCENARIOS`)."""
    profile: str = "semicolons"
    report_dir: Path = Path("demo-report")
    keep_running: bool = False
    state_dir: Path = Path(".liveloop/demo")
    """The demo's own stack state, apart from ``liveloop up``'s, wiped at the start of every demo."""


def make_base_model(stack: Stack, profile: str, seed: int) -> tuple[Path, int]:
    """The code scenario's base in ``<state>/base-model``, pre-trained on the profile's language (or from the
    base cache), made the lineage's base and first champion; return the folder and its version
    (:func:`liveloop.demo.base_model.prepare_base`). The learner must start from this folder too
    (``LIVELOOP_LEARNER_BASE_MODEL``)."""
    base = prepare_base(stack, CODE, profile, seed)
    return base.folder, base.version


def run_demo(options: DemoOptions, console: Console) -> DemoReport:
    """Run the demo end to end; return the report (also written to ``options.report_dir``). The console
    shows the demo's own steps and live view; libraries log into ``<state>/logs/demo.log``."""
    scenario_named(options.scenario)  # an unknown scenario fails before anything starts or is wiped
    settings = StackSettings(state_dir=options.state_dir)
    refuse_if_other_running(settings)  # a `liveloop up` of this folder holds the ports and its own keys
    Stack(settings).purge()  # every demo starts from nothing: a fresh broker, database, registry and learner
    stack = Stack(settings)
    mark_running(settings, "liveloop demo")  # so `liveloop status`/`down` in this folder find the demo's stack
    log_file = stack.settings.logs_dir.resolve() / "demo.log"
    with library_output_to(log_file):
        console.print(f"libraries log to {log_file}")
        return _run(stack, options, console)


def _run(stack: Stack, options: DemoOptions, console: Console) -> DemoReport:
    from liveloop.demo.simulator.runner import Simulation
    from liveloop.demo.simulator.settings import SimulatorSettings
    from serving.settings import ServingSettings

    scenario = scenario_named(options.scenario)
    state = stack.settings.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    apply_profile(scenario.profile(), state)  # the components inherit its environment; a user's own values win
    console.print("[bold]1/4[/bold] starting Kafka, PostgreSQL and MLflow")
    stack.up()
    corpus = f"'{options.profile}' language" if scenario.pretraining.by_profile else f"'{scenario.name}' corpus"
    console.print(f"[bold]2/4[/bold] the tiny base model, pre-trained on the {corpus}")
    base = prepare_base(stack, scenario, options.profile, options.seed)
    base_version = base.version
    os.environ["LIVELOOP_LEARNER_BASE_MODEL"] = str(base.folder)
    origin = {"cache": "taken from the base cache", "pretrained": "pre-trained now", "state": "kept from the state"}
    console.print(f"      base model {origin[base.origin]} (key {base.key or '-'})")
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
        scenario=scenario.name,  # type: ignore[arg-type]  # one the simulator runs: scenario_named checked
        profile=options.profile,
        seed=options.seed,
        minutes=options.minutes,
    )
    who = "users" if scenario.report is None else f"{scenario.name} sessions"
    console.print(f"[bold]4/4[/bold] simulating {who} for {options.minutes:g} minutes (seed {options.seed})")
    simulation = Simulation(simulator)
    simulation.start()
    deadline = time.monotonic() + options.minutes * 60
    try:
        watch = Watch.of(stack)
        with Live(console=console, refresh_per_second=1, transient=False) as live:
            while time.monotonic() < deadline:
                live.update(progress(stack, watch, simulation, scenario.report))
                time.sleep(2.0)
            simulation.stop()
            live.update(progress(stack, watch, simulation, scenario.report))
        summary = simulation.finish()
        console.print("scanning Kafka, PostgreSQL, MLflow and the checkpoints for planted secrets and private sessions")
        leaks = LeakScan(
            secrets=len(summary.planted_secrets),
            privacy_sessions=len(summary.privacy_session_ids),
            found=scan_for_leaks(stack, [s.secret for s in summary.planted_secrets], summary.privacy_session_ids),
        )
        held_out = DemoSettings().held_out_tasks
        if scenario.held_out is not None:
            console.print(f"measuring the base and the last promoted checkpoint on {held_out} held-out tasks each")
        report = collect_report(
            stack, summary, options.profile, options.minutes, base_version, leaks, scenario, held_out
        )
        write_report(report, summary, options.report_dir)
    finally:
        finish(stack, options, console)
    return report


def finish(stack: Stack, options: DemoOptions, console: Console) -> None:
    """The demo's last step, once the simulation is over (or failed): with ``keep_running``, say where the
    loop runs and how to reach its dashboard (:func:`keep_running_lines`); otherwise stop the loop."""
    if options.keep_running:
        for line in keep_running_lines(options.state_dir, stack.settings.credentials_path):
            console.print(line)
    else:
        console.print(f"stopping the loop (its data stays in {options.state_dir} until the next demo)")
        stack.down()
        clear_mark(stack.settings)


def keep_running_lines(state_dir: Path, credentials_path: Path) -> list[str]:
    """What ``demo --keep-running`` prints at the end: where the loop's state is and how to find and stop it,
    then the ops dashboard's address and which key of ``credentials_path`` signs in (never a key itself)."""
    return [
        f"the loop keeps running from {state_dir}: `liveloop status` and `liveloop down` in this "
        f"folder find it; its keys are in {credentials_path}",
        sign_in_hint(credentials_path),
    ]


def _ingest_url() -> str:
    from ingest.settings import IngestSettings

    api = IngestSettings()
    return f"http://{api.host}:{api.port}"
