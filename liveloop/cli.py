"""The ``liveloop`` command line: run the loop locally and operate it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from infra.errors import InfraError
from infra.stack import Stack
from liveloop.components import loop_components

app = typer.Typer(help="liveloop: online learning from production traffic.", no_args_is_help=True, add_completion=False)
schema_app = typer.Typer(help="The event contract.", no_args_is_help=True)
app.add_typer(schema_app, name="schema")
console = Console()
# Errors go to stderr as one unwrapped line, so that they can be read, grepped and copied whole.
errors = Console(stderr=True, soft_wrap=True)


def _fail(exc: Exception, code: int) -> typer.Exit:
    errors.print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(code)


def _stack() -> Stack:
    try:
        return Stack()
    except InfraError as exc:
        raise _fail(exc, 2) from exc


@app.command()
def setup() -> None:
    """Check prerequisites and fetch the Kafka broker from Maven Central into the cache (idempotent)."""
    stack = _stack()
    try:
        with console.status("checking prerequisites, resolving Kafka jars ..."):
            stack.setup()
    except InfraError as exc:
        raise _fail(exc, 1) from exc
    console.print(f"ready: Kafka {stack.settings.kafka_version} jars in {stack.kafka.jars_dir}")


@app.command()
def up() -> None:
    """Start the local stack (Kafka, PostgreSQL, MLflow and the loop's components) and wait until healthy."""
    stack = _stack()
    started = time.monotonic()
    try:
        with console.status("starting Kafka, PostgreSQL, MLflow and the loop's components ..."):
            timings = stack.up(loop_components(stack))
    except InfraError as exc:
        raise _fail(exc, 1) from exc
    parts = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in timings.items())
    console.print(f"[green]up[/green] in {time.monotonic() - started:.1f}s ({parts})")
    _print_status(stack.status(loop_components(stack)))


@app.command()
def down(
    purge: Annotated[bool, typer.Option("--purge", help="Also delete all local state (data, logs, keys).")] = False,
) -> None:
    """Stop everything ``up`` started; leaves no process behind. Data is kept for the next ``up``."""
    stack = _stack()
    names = [c.name for c in loop_components(stack)]
    stopped = stack.purge(names) if purge else stack.down(names)
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    if purge:
        console.print(f"deleted {stack.settings.state_dir} and the PostgreSQL cluster")


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False) -> None:
    """Each service and component with its address and health. Exits 1 if anything is unhealthy."""
    stack = _stack()
    report = stack.status(loop_components(stack))
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print_status(report)
    everything = list(report["services"].values()) + list(report["components"].values())
    if not all(item["healthy"] for item in everything):
        raise typer.Exit(1)


@app.command()
def demo() -> None:
    """The main job: for now it starts the stack, shows its status and stops it again."""
    up()
    down()


@schema_app.command("export")
def schema_export(directory: Annotated[Path, typer.Argument(help="Folder to write the schemas into.")]) -> None:
    """Write one JSON Schema per event type (and one for any event), generated from the models."""
    from ingest.schema_export import export_schemas

    for path in export_schemas(directory):
        typer.echo(str(path))


def _print_status(report: dict[str, dict[str, dict[str, object]]]) -> None:
    table = Table("kind", "name", "healthy", "address")
    for kind in ("services", "components"):
        for name, item in report[kind].items():
            address = item.get("address") or item.get("url") or item.get("dsn") or ""
            mark = "[green]yes[/green]" if item["healthy"] else "[red]no[/red]"
            table.add_row(kind[:-1], name, mark, str(address))
    console.print(table)


def main() -> None:
    """Console-script entry point."""
    app()
