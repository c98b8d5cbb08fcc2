"""The folder's running-stack marker: followed while its processes live, removed once they are gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.active import (
    STATE_DIR_ENV,
    StackAlreadyRunning,
    clear_mark,
    mark_running,
    marker_path,
    refuse_if_other_running,
    resolve_stack_settings,
    running_stack,
)
from infra.processes import ManagedProcess
from infra.settings import StackSettings


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(STATE_DIR_ENV, raising=False)
    return tmp_path


def _start_sleeper(state: Path) -> ManagedProcess:
    process = ManagedProcess("sleeper", state / "run", state / "logs")
    process.start([sys.executable, "-c", "import time; time.sleep(60)"])
    return process


def test_a_live_marked_stack_is_followed_and_refuses_another(folder: Path) -> None:
    demo = StackSettings(state_dir=folder / ".liveloop" / "demo")
    process = _start_sleeper(demo.state_dir)
    try:
        mark_running(demo, "liveloop demo", folder=folder)
        assert resolve_stack_settings(folder).state_dir == demo.state_dir.resolve()
        with pytest.raises(StackAlreadyRunning, match=r"already runs from .*demo.*`liveloop down`"):
            refuse_if_other_running(StackSettings(state_dir=folder / ".liveloop"), folder=folder)
        refuse_if_other_running(demo, folder=folder)  # the stack itself may start again (idempotent `up`)
    finally:
        process.stop()
    clear_mark(demo, folder=folder)
    assert not marker_path(folder).exists()


def test_a_stale_marker_is_ignored_and_removed(folder: Path) -> None:
    demo = StackSettings(state_dir=folder / ".liveloop" / "demo")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (demo.state_dir / "run").mkdir(parents=True)
    (demo.state_dir / "run" / "kafka.pid").write_text(json.dumps({"pid": dead.pid, "create_time": 0.0}))
    mark_running(demo, "liveloop demo", folder=folder)
    assert marker_path(folder).exists()
    assert running_stack(folder) is None
    assert not marker_path(folder).exists()
    assert resolve_stack_settings(folder).state_dir == StackSettings().state_dir
    marker_path(folder).write_text("not json")
    assert running_stack(folder) is None
    assert not marker_path(folder).exists()


def test_an_explicit_state_dir_is_neither_followed_nor_marked(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = StackSettings(state_dir=folder / ".liveloop" / "demo")
    process = _start_sleeper(demo.state_dir)
    try:
        mark_running(demo, "liveloop demo", folder=folder)
        monkeypatch.setenv(STATE_DIR_ENV, str(folder / "mine"))
        assert resolve_stack_settings(folder).state_dir == folder / "mine"
        refuse_if_other_running(StackSettings(), folder=folder)
        mark_running(StackSettings(), "liveloop up", folder=folder)
        assert json.loads(marker_path(folder).read_text())["state_dir"] == str(demo.state_dir.resolve())
    finally:
        process.stop()
