"""The running stack of a folder: ``<folder>/.liveloop/active.json``, so every command finds it.

``liveloop up`` and ``liveloop demo`` start stacks with different state folders (``.liveloop`` and
``.liveloop/demo``) on the same ports. Without a marker, a command run in the folder would look at the
default state folder only, answer "nothing was running" while the demo holds every port, and mint
fresh keys the running stack does not know. So the command that starts a stack marks it here, and
every command that resolves a stack (:func:`resolve_stack_settings`) follows the mark while the
marked stack's processes are alive. A mark whose processes are all gone is stale: ignored and removed.

An explicit ``LIVELOOP_INFRA_STATE_DIR`` names its stack itself: it is neither followed nor marked.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.errors import InfraError
from infra.kafka_broker import recorded_brokers
from infra.processes import ManagedProcess
from infra.settings import StackSettings

STATE_DIR_ENV = "LIVELOOP_INFRA_STATE_DIR"
MARKER_NAME = "active.json"
BROKERS_ENV = "LIVELOOP_INFRA_KAFKA_BROKERS"


class StackAlreadyRunning(InfraError):
    """Another stack of this folder runs; the message names it and how to stop it."""


class ActiveStack(BaseModel):
    """What the marker records about the folder's running stack."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path = Field(description="The running stack's state folder (absolute).")
    started_at: datetime = Field(description="When the stack was marked as running.")
    started_by: str = Field(min_length=1, description="The command that started it, e.g. 'liveloop demo'.")

    def running_processes(self) -> dict[str, int]:
        """Name -> pid of the marked stack's processes that are still alive (its pid files)."""
        run_dir = self.state_dir / "run"
        alive = {}
        for pid_file in sorted(run_dir.glob("*.pid")):
            pid = ManagedProcess(pid_file.stem, run_dir, self.state_dir / "logs").pid()
            if pid is not None:
                alive[pid_file.stem] = pid
        return alive


def default_state_dir(folder: Path | None = None) -> Path:
    """The folder's default state folder (``StackSettings.state_dir``'s default, under ``folder``)."""
    default = StackSettings.model_fields["state_dir"].default
    assert isinstance(default, Path)
    return (folder or Path.cwd()) / default


def marker_path(folder: Path | None = None) -> Path:
    """Where the folder's marker lives."""
    return default_state_dir(folder) / MARKER_NAME


def explicit_state_dir() -> bool:
    """Whether the environment names a state folder itself (then no marker is followed or written)."""
    return bool(os.environ.get(STATE_DIR_ENV))


def running_stack(folder: Path | None = None) -> ActiveStack | None:
    """The folder's marked stack if any of its processes is alive; a stale or unreadable marker is removed."""
    path = marker_path(folder)
    try:
        active = ActiveStack.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValidationError, OSError):
        path.unlink(missing_ok=True)
        return None
    if not active.running_processes():
        path.unlink(missing_ok=True)
        return None
    return active


def mark_running(settings: StackSettings, started_by: str, folder: Path | None = None) -> None:
    """Record ``settings``' stack as the folder's running stack (unless the state folder was given explicitly)."""
    if explicit_state_dir():
        return
    path = marker_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    active = ActiveStack(state_dir=settings.state_dir.resolve(), started_at=datetime.now(UTC), started_by=started_by)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(active.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: a command reading it never sees half a marker


def clear_mark(settings: StackSettings, folder: Path | None = None) -> None:
    """Remove the folder's marker if it names ``settings``' stack (after ``down``)."""
    path = marker_path(folder)
    try:
        active = ActiveStack.model_validate_json(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValidationError, OSError):
        return
    if active.state_dir == settings.state_dir.resolve():
        path.unlink(missing_ok=True)


def resolve_stack_settings(folder: Path | None = None) -> StackSettings:
    """The settings of the stack a command in ``folder`` acts on: the environment's, with the state folder
    of the folder's running stack when the environment does not name one."""
    settings = StackSettings()
    if not explicit_state_dir():
        active = running_stack(folder)
        if active is not None:
            settings = StackSettings(state_dir=active.state_dir)
    recorded = recorded_brokers(settings.state_dir)
    if BROKERS_ENV not in os.environ and recorded is not None and recorded != settings.kafka_brokers:
        # `up --brokers 3` in another shell: `status` and `down` must see all three.
        settings = StackSettings(state_dir=settings.state_dir, kafka_brokers=recorded)
    return settings


def refuse_if_other_running(settings: StackSettings, folder: Path | None = None) -> None:
    """Raise StackAlreadyRunning when a stack of the folder other than ``settings``' own runs: two stacks
    would fight over the ports, and starting one would mint keys the running one does not know."""
    if explicit_state_dir():
        return
    active = running_stack(folder)
    if active is None or active.state_dir == settings.state_dir.resolve():
        return
    raise StackAlreadyRunning(
        f"a stack of this folder already runs from {active.state_dir} (started by `{active.started_by}` at "
        f"{active.started_at:%Y-%m-%d %H:%M:%S} UTC); stop it first with `liveloop down`"
    )
