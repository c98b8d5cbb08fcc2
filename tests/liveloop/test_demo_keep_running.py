"""``liveloop demo --keep-running`` ends by printing the ops dashboard's address and how to sign in.

No demo runs: :func:`liveloop.demo.run.finish` is the demo's last step (``run_demo`` calls it once the
simulation is over), given a stack that is only described, with a real credential file. The address it
prints must be the one ``liveloop up`` starts the dashboard on (its component's health URL), and the
keys it names must be in that file, while their values never reach the console.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from infra.credentials import ensure_credentials
from infra.settings import StackSettings
from infra.stack import Stack
from liveloop.components import loop_components
from liveloop.demo.run import DemoOptions, finish


def _printed_at_the_end(state: Path) -> str:
    stack = Stack(StackSettings(state_dir=state))
    ensure_credentials(stack.settings.credentials_path)
    out = io.StringIO()
    # Wide enough that Rich does not wrap a line: the test reads them as a person's terminal shows them.
    finish(stack, DemoOptions(keep_running=True, state_dir=state), Console(file=out, width=500, color_system=None))
    return out.getvalue()


def _dashboard_address(state: Path) -> str:
    """Where ``liveloop up`` (and the demo) start the dashboard: its component's health URL, less /healthz."""
    (dashboard,) = [spec for spec in loop_components(Stack(StackSettings(state_dir=state))) if spec.name == "dashboard"]
    assert dashboard.health_url is not None
    return dashboard.health_url.removesuffix("healthz")


@pytest.mark.parametrize("port", [None, "18123"])
def test_keep_running_prints_the_dashboard_address_and_how_to_sign_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, port: str | None
) -> None:
    if port is None:
        monkeypatch.delenv("LIVELOOP_DASHBOARD_PORT", raising=False)
    else:  # a port of one's own: the line follows it, as the dashboard does
        monkeypatch.setenv("LIVELOOP_DASHBOARD_PORT", port)
    monkeypatch.delenv("LIVELOOP_DASHBOARD_HOST", raising=False)
    state = tmp_path / "demo"
    printed = _printed_at_the_end(state)
    address = _dashboard_address(state)
    assert address == f"http://127.0.0.1:{port or 8090}/"
    (line,) = [line for line in printed.splitlines() if "dashboard" in line]
    assert address in line
    credentials = state / "credentials.json"
    assert str(credentials) in line
    # The keys it names sign in (operator to act, viewer to look), and are the file's own fields.
    fields = json.loads(credentials.read_text())
    for key in ("operator_key", "viewer_key"):
        assert key in line
        assert fields.get(key), f"{key} is not in the credential file the line points at"
        assert fields[key] not in printed, "a key itself was printed"
    # And how to find the loop again.
    assert "liveloop down" in printed
    assert str(state) in printed


def test_without_keep_running_nothing_about_the_dashboard_is_said(tmp_path: Path) -> None:
    stack = Stack(StackSettings(state_dir=tmp_path / "demo"))
    out = io.StringIO()
    # Nothing of this stack runs, so stopping it finds nothing to stop.
    finish(stack, DemoOptions(keep_running=False, state_dir=tmp_path / "demo"), Console(file=out, width=500))
    assert "stopping the loop" in out.getvalue()
    assert "dashboard" not in out.getvalue()
