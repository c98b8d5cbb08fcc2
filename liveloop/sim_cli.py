"""``liveloop simulate``: synthetic users of a code assistant against the running loop.

The lead mounts :data:`app` on the main CLI (``app.add_typer(sim_cli.app, name="simulate")``); its callback is
the command, so ``liveloop simulate --minutes 5 --seed 7`` runs it. Options override ``LIVELOOP_SIMULATOR_*``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from liveloop.exit_codes import LiveloopGroup

app = typer.Typer(help="Simulated users with hidden preferences.", add_completion=False, cls=LiveloopGroup)


def _mix(text: str) -> dict[str, float]:
    """``semicolons=3,snake_case=1`` -> ``{"semicolons": 3.0, "snake_case": 1.0}``."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        try:
            mix[name.strip()] = float(weight) if weight else 1.0
        except ValueError:
            raise typer.BadParameter(f"{part!r}: write NAME=WEIGHT, e.g. semicolons=3,snake_case=1") from None
    return mix


@app.callback(invoke_without_command=True)
def simulate(
    scenario: Annotated[
        str | None,
        typer.Option(
            help="What sessions do: 'code' (the default), 'swarm' (an orchestrator's tasks), 'summary' (sessions "
            "the model summarises) or 'prune' (lookups under a context budget)."
        ),
    ] = None,
    minutes: Annotated[float | None, typer.Option(help="How long new sessions keep starting.")] = None,
    seed: Annotated[int | None, typer.Option(help="Run seed: the same seed repeats the same users.")] = None,
    profile: Annotated[
        str | None, typer.Option(help="Profile of every session: semicolons, snake_case, fickle, noisy.")
    ] = None,
    mix: Annotated[str | None, typer.Option(help="A profile mix instead, e.g. semicolons=3,snake_case=1.")] = None,
    rate: Annotated[float | None, typer.Option(help="Sessions started per second.")] = None,
    sessions: Annotated[int | None, typer.Option(help="Stop after this many sessions.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Sessions running at once, at most.")] = None,
    gateway: Annotated[str | None, typer.Option(help="Gateway base URL, e.g. http://127.0.0.1:8000/v1.")] = None,
    summary: Annotated[Path | None, typer.Option(help="Write the run's summary here as JSON.")] = None,
) -> None:
    """Run simulated sessions against the gateway and print a summary (acceptance by policy version)."""
    from liveloop.demo.simulator.runner import simulate as run_simulation
    from liveloop.demo.simulator.settings import SimulatorSettings

    overrides: dict[str, Any] = {
        "scenario": scenario,
        "minutes": minutes,
        "seed": seed,
        "profile": profile,
        "profile_mix": _mix(mix) if mix else None,
        "session_rate": rate,
        "max_sessions": sessions,
        "concurrency": concurrency,
        "gateway_url": gateway,
        "summary_path": summary,
    }
    settings = SimulatorSettings(**{k: v for k, v in overrides.items() if v is not None})
    result = run_simulation(settings)
    typer.echo(
        f"{result.sessions} sessions, {result.requests} requests ({result.request_errors} errors), "
        f"{sum(result.events.values())} events, {len(result.planted_secrets)} secrets planted, "
        f"{result.malformed_sent} malformed events sent"
    )
    for figures in result.agents:
        shown = [f"{name.replace('_', ' ')} {_figure(value)}" for name, value in figures.items() if _figure(value)]
        typer.echo(
            f"policy version {figures['policy_version']}: {figures['trajectories']} trajectories, {', '.join(shown)}"
        )
    for v in result.versions:
        low, high = v.acceptance_ci95
        typer.echo(
            f"policy version {v.policy_version}: {v.requests} requests, acceptance {v.acceptance_rate:.3f} "
            f"[{low:.3f}, {high:.3f}], invalid tool calls {v.invalid_tool_call_rate:.3f}/request"
        )
    if summary is None and settings.summary_path is None:
        typer.echo(json.dumps(result.model_dump(mode="json", exclude={"generation_ids", "timeline"}), indent=2))


def _figure(value: Any) -> str:
    """An agent figure as one line's part: a rate or a mean with its interval; "" for what is not one."""
    if isinstance(value, dict) and "rate" in value:
        return _share(value)
    if isinstance(value, dict) and "mean" in value:
        return _mean(value)
    return ""


def _share(rate: dict[str, Any]) -> str:
    if rate["rate"] is None:
        return "n/a"
    return f"{rate['rate']:.3f} [{rate['low']:.3f}, {rate['high']:.3f}]"


def _mean(mean: dict[str, Any]) -> str:
    if mean["mean"] is None:
        return "n/a"
    if mean["low"] is None:
        return f"{mean['mean']:.1f}"
    return f"{mean['mean']:.1f} [{mean['low']:.1f}, {mean['high']:.1f}]"
