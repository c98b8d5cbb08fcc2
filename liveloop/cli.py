"""The ``liveloop`` command line: run the loop locally and operate it.

Commands raise; :mod:`liveloop.exit_codes` (the ``cls`` of every app here) prints each failure as one
``error:`` line and exits with its documented code (table there and in ``docs/cli.md``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infra.active import clear_mark, mark_running, refuse_if_other_running, resolve_stack_settings
from infra.settings import MAX_LOCAL_BROKERS, StackSettings
from infra.stack import Stack
from liveloop import audit_cli, export_cli, learner_cli, replay_cli, serving_cli, sim_cli
from liveloop.components import loop_components
from liveloop.dashboard.settings import sign_in_hint
from liveloop.exit_codes import LiveloopGroup
from liveloop.models_status import models_section, print_models

app = typer.Typer(
    help="liveloop: online learning from production traffic.",
    no_args_is_help=True,
    add_completion=False,
    cls=LiveloopGroup,
)
schema_app = typer.Typer(help="The event contract.", no_args_is_help=True, cls=LiveloopGroup)
app.add_typer(schema_app, name="schema")
console = Console()


@app.command()
def setup() -> None:
    """Check prerequisites and fetch the Kafka broker from Maven Central into the cache (idempotent)."""
    stack = Stack()
    with console.status("checking prerequisites, resolving Kafka jars ..."):
        stack.setup()
    console.print(f"ready: Kafka {stack.settings.kafka_version} jars in {stack.kafka.jars_dir}")


@app.command()
def up(
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="Run the loop at a profile's cadence: 'fast' learns in minutes (a checkpoint every 2 minutes once "
            "64 samples trained, auto-promoted by the gate; `liveloop demo`'s settings). Needs a base model: "
            "--base, or the tiny model.",
            show_default=False,
        ),
    ] = None,
    base: Annotated[
        Path | None,
        typer.Option(
            "--base",
            help="A local Hugging Face model folder to start from, registered as the first champion "
            "(like `liveloop learner init-base --from`). With --profile and no --base: the tiny model.",
            show_default=False,
        ),
    ] = None,
    brokers: Annotated[
        int | None,
        typer.Option(
            "--brokers",
            min=1,
            max=MAX_LOCAL_BROKERS,
            help="Kafka brokers to run (KRaft, replication factor min(brokers, 3), min.insync.replicas 2 from 3 "
            "brokers); default LIVELOOP_INFRA_KAFKA_BROKERS or 1. A state folder keeps the count it was made with.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start the local stack (Kafka, PostgreSQL, MLflow and the loop's components) and wait until healthy.

    Refuses while another stack of this folder (a ``liveloop demo --keep-running``) runs."""
    from liveloop.profiles import apply_profile, check_base_folder, profile_named, register_base_model

    chosen = profile_named(profile) if profile is not None else None
    check_base_folder(base)
    if brokers is not None:
        # In the environment, not only in these settings: `status` and `down` of this shell read it too.
        os.environ["LIVELOOP_INFRA_KAFKA_BROKERS"] = str(brokers)
    settings = StackSettings()
    refuse_if_other_running(settings)  # before Stack(), which mints the keys of a new stack
    stack = Stack(settings)
    mark_running(settings, "liveloop up")
    started = time.monotonic()
    timings: dict[str, float] = {}
    with console.status("starting Kafka, PostgreSQL, MLflow and the loop's components ..."):
        if chosen is not None:
            apply_profile(chosen, settings.state_dir)  # the components inherit its environment
        if chosen is not None or base is not None:
            # The base must be the champion before the learner and the gateway start from it.
            timings.update(stack.up())
            version = register_base_model(stack, base)
            if base is not None:
                os.environ["LIVELOOP_LEARNER_BASE_MODEL"] = str(base.resolve())
            console.print(f"base model {base or 'tiny'}: version {version}")
        timings.update(stack.up(loop_components(stack)))
    parts = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in timings.items())
    console.print(f"[green]up[/green] in {time.monotonic() - started:.1f}s ({parts})")
    if chosen is not None:
        console.print(f"profile {chosen.name}: {chosen.summary}")
    _print_status(stack.status(loop_components(stack)))
    console.print(sign_in_hint(stack.settings.credentials_path))


@app.command()
def down(
    purge: Annotated[bool, typer.Option("--purge", help="Also delete all local state (data, logs, keys).")] = False,
) -> None:
    """Stop everything ``up`` (or ``demo --keep-running``) started in this folder; leaves no process behind.
    Data is kept for the next ``up``."""
    stack = Stack(resolve_stack_settings(), create_credentials=False)
    names = [c.name for c in loop_components(stack)]
    clear_mark(stack.settings)
    stopped = stack.purge(names) if purge else stack.down(names)
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    if purge:
        console.print(f"deleted {stack.settings.state_dir} and the PostgreSQL cluster")


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False) -> None:
    """Each service and component with its address and health, then the champion, the candidate and the
    gate's last decision. Exits 1 if anything is unhealthy."""
    stack = Stack(resolve_stack_settings(), create_credentials=False)
    report = stack.status(loop_components(stack))
    report["state_dir"] = str(stack.settings.state_dir)
    report["models"] = _models(stack, report)
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        console.print(f"stack: {stack.settings.state_dir} (keys in {stack.settings.credentials_path})")
        _print_status(report)
        print_models(report["models"], console)
    everything = list(report["services"].values()) + list(report["components"].values())
    if not all(item["healthy"] for item in everything):
        raise typer.Exit(1)


@app.command()
def demo(
    minutes: Annotated[float, typer.Option(help="How long the simulated users send traffic.", min=0.5)] = 8.0,
    seed: Annotated[int, typer.Option(help="Seed of the simulator and the base model.")] = 7,
    scenario: Annotated[
        str,
        typer.Option(
            help="What the loop learns: code (completions judged by users with a hidden style preference), or an "
            "agent scenario: swarm (when to parallelise), summary (what to keep in summaries), prune (what to "
            "prune under a budget). An agent base is pre-trained once, then taken from the base cache."
        ),
    ] = "code",
    profile: Annotated[
        str,
        typer.Option(
            help="Users' hidden preference (the code scenario): semicolons, snake_case, fickle (a degraded "
            "candidate), noisy."
        ),
    ] = "semicolons",
    report: Annotated[Path, typer.Option("--report", help="Folder for report.json, report.md, acceptance.png.")] = Path(
        "demo-report"
    ),
    keep_running: Annotated[bool, typer.Option(help="Leave the loop running afterwards.")] = False,
    state_dir: Annotated[Path, typer.Option(help="The demo's own stack state (wiped when a demo starts).")] = Path(
        ".liveloop/demo"
    ),
) -> None:
    """The main job: the whole loop live (traffic, rewards, learner, gate, hot-swap), then a report."""
    from liveloop.demo.report import plot_name
    from liveloop.demo.run import DemoOptions, run_demo

    options = DemoOptions(
        minutes=minutes,
        seed=seed,
        scenario=scenario,
        profile=profile,
        report_dir=report,
        keep_running=keep_running,
        state_dir=state_dir,
    )
    result = run_demo(options, console)
    verdict, judged = result.verdict, result.verdict.comparison
    console.print(f"report written to {report}/ (report.md, report.json, {plot_name(result)})")
    if result.agents is not None:
        agents = result.agents.verdict
        outcome = "passed" if agents.passed else f"not passed: {agents.why}"
        console.print(
            f"{scenario}: version {agents.judged_version} against the base (version {agents.base_version}): "
            f"{outcome}, {verdict.promotions} promotion(s)"
        )
        for warning in agents.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
    elif judged is not None:
        console.print(
            f"acceptance {judged.base_acceptance:.3f} (base, version {result.base_version}) -> "
            f"{judged.final_acceptance:.3f} (version {judged.judged_version}): "
            f"{judged.acceptance_gain_points:+.1f} points, {verdict.promotions} promotion(s)"
        )
    else:
        console.print(f"no improvement: {verdict.why}")


@schema_app.command("export")
def schema_export(directory: Annotated[Path, typer.Argument(help="Folder to write the schemas into.")]) -> None:
    """Write one JSON Schema per event type (and one for any event), generated from the models."""
    from ingest.schema_export import export_schemas

    for path in export_schemas(directory):
        typer.echo(str(path))


def _models(stack: Stack, report: dict[str, Any]) -> dict[str, Any]:
    from serving.settings import ServingSettings

    return models_section(
        stack.endpoints.dsn(),
        stack.endpoints.mlflow_url,
        ServingSettings().model_name,
        mlflow_healthy=bool(report["services"]["mlflow"]["healthy"]),
    )


def _print_status(report: dict[str, Any]) -> None:
    table = Table("kind", "name", "healthy", "address", "version")
    for kind in ("services", "components"):
        for name, item in report[kind].items():
            address = item.get("address") or item.get("url") or item.get("dsn") or ""
            mark = "[green]yes[/green]" if item["healthy"] else "[red]no[/red]"
            table.add_row(kind[:-1], name, mark, str(address), _version_of(item.get("details")))
    console.print(table)
    joins = report["components"].get("distiller", {}).get("details")
    if isinstance(joins, dict) and "unjoined_feedback" in joins:
        console.print(
            f"distiller: {joins['unjoined_feedback']} feedback event(s) joined no generation (see the dead-letter "
            f"topic), {joins['generations_without_feedback']} generation(s) finalised without feedback"
        )


def _version_of(details: object) -> str:
    """``version N`` for a component whose status names the policy version it holds (the learner's newest
    checkpoint), which is also that checkpoint's MLflow model version; empty otherwise."""
    version = details.get("policy_version") if isinstance(details, dict) else None
    return f"version {version}" if isinstance(version, int) else ""


app.add_typer(learner_cli.app, name="learner")
app.add_typer(sim_cli.app, name="simulate")
# Operator actions on the champion sit at the top level: `liveloop promote 3`, `liveloop rollback`.
app.command("promote")(serving_cli.promote)
app.command("rollback")(serving_cli.rollback)
app.command("reject")(serving_cli.reject)
# Offline audit: `liveloop replay`, `liveloop audit checkpoint N | session ID`, `liveloop export`.
app.command("replay")(replay_cli.replay)
app.command("export")(export_cli.export)
app.add_typer(audit_cli.app, name="audit")


def main() -> None:
    """Console-script entry point."""
    app()
