"""The project's error root, :class:`LiveloopError`, and the infra package's exceptions under it.

Every package root (``InfraError``, ``IngestError``, ``DistillError``, ``LearnerError``,
``ServingError``, the simulator's ``SimulatorError``) derives from :class:`LiveloopError`, so a caller
(the command line's single error boundary, :mod:`liveloop.exit_codes`) can tell liveloop's own,
explained failures from a library's bug with one ``except``. ``tests/test_errors.py`` keeps it so.

Errors raised by kafka-python, psycopg or MLflow are converted at the adapter that called them
(``raise ... from exc``), so callers above this floor never need to know those libraries' types.
"""

from __future__ import annotations


class LiveloopError(Exception):
    """Root of every error liveloop raises on purpose; its message tells the reader what to do.

    It lives on the lowest floor so that every package can derive from it. Catch a package's root
    (or a narrower class) in code; catch this only at a process boundary such as the command line.
    """


class InfraError(LiveloopError):
    """Root of every error raised by ``infra``."""


class PrerequisiteMissing(InfraError):
    """A program the local stack needs is not installed. Install it (the message names it) and retry."""


class ServiceStartError(InfraError):
    """A local service did not become healthy in time. Read the log file the message names."""


class ServiceUnavailable(InfraError):
    """A service could not be reached. Transient: retry with back-off, or start the stack."""


class MigrationError(InfraError):
    """The audit store's schema could not be brought up to date; the message names the migration."""


class ProvisioningError(InfraError):
    """A topic could not be created or does not match its settings; the message says how it differs."""


class CredentialsError(InfraError):
    """The credentials file is missing, unreadable or too permissive; the message says how to fix it."""


class AccessRefused(InfraError):
    """A key was given but it is not the one the credential file holds for this door.

    Do not retry with the same key: use the key the message names (from the credential file).
    """
