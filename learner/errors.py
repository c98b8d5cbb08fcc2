"""The learner package's exceptions: one root, with subclasses that tell the caller what to do.

Every error the learner raises on purpose derives from :class:`LearnerError`, so a service can tell
its own failures from a library's. Subclasses are added next to the code that raises them.
"""

from __future__ import annotations

from infra.errors import LiveloopError


class LearnerError(LiveloopError):
    """Root of every error raised by ``learner``."""
