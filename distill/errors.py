"""The distill package's exceptions: one root, with subclasses that tell the caller what to do.

- :class:`InvalidRewardSpec`: the reward spec file is wrong. Crash at start-up and fix the file; the
  message names the file and lists every problem at once.
- :class:`PrivacyModeEvent`: a privacy-mode generation reached the reward function. Drop it: such
  events are never distilled (the streaming app filters them first; this is the safety net).
- :class:`MisalignedTrajectory`: the generation cannot be trained on safely. Dead-letter it; the
  producer must fix the token ids it sends.
- :class:`InvalidSample`: bytes on the samples topic are not a sample of a supported schema.
  Dead-letter them; do not retry.
- :class:`AuditStoreUnavailable`: PostgreSQL stayed unreachable longer than the sink waits. Crash: the
  batch's offsets are not committed, so a restarted distiller reads it again.
- :class:`UnsupportedEngine`: the installed faust-streaming is not the version ``distill.tuning`` was
  checked against, or the app is configured so that its offset handling would be unsafe. Refuse to start.

Feedback that arrives after its window is not an error: :func:`distill.reward.is_late` tells the
streaming app, which counts and drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

from infra.errors import LiveloopError


class DistillError(LiveloopError):
    """Root of every error raised by ``distill``."""


class InvalidRewardSpec(DistillError):
    """The reward spec file cannot be used. Crash and fix the file.

    ``path`` names the file; ``problems`` holds one line per problem (``"weights.accepted: ..."``),
    all of them, so that one edit can fix the whole file.
    """

    def __init__(self, path: str, problems: Sequence[str]) -> None:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"reward spec {path} is invalid; fix the file:\n{listed}")
        self.path = path
        self.problems = tuple(problems)


class PrivacyModeEvent(DistillError):
    """The generation was made in privacy mode. Drop it: it is never distilled, archived or trained on."""


class MisalignedTrajectory(DistillError):
    """The trajectory's token ids do not line up with ``completion_token_ids``. Dead-letter the generation.

    The loss mask is derived per token from the trajectory's roles; without alignment the learner
    could train on tool output or user text, so no sample is made.
    """


class InvalidSample(DistillError):
    """Bytes that are not a valid sample (corrupt, or a newer schema). Dead-letter them; do not retry."""


class AuditStoreUnavailable(DistillError):
    """The audit store could not be written for longer than the sink retries. Crash and restart (nothing is lost:
    the batch's offsets were not committed); check that PostgreSQL runs and the DSN is right."""


class UnsupportedEngine(DistillError):
    """The stream engine cannot be trusted with the distiller's offsets: a faust-streaming version other than the
    one ``distill.tuning`` was checked against, or a setting it relies on changed. Refuse to start; install the
    pinned version (constraints.txt) or re-check ``distill.tuning`` against the new one."""
