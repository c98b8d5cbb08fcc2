"""The simulator's exceptions: one root, :class:`SimulatorError`."""

from __future__ import annotations

from infra.errors import LiveloopError


class SimulatorError(LiveloopError):
    """Root of the simulator's errors."""


class UnknownProfile(SimulatorError, ValueError):
    """A profile name (or a profile mix entry) names no profile; the message lists the known ones."""


class GatewayUnavailable(SimulatorError):
    """The gateway did not answer (or answered an error) for longer than the simulator waits; start it first."""
