"""The infra package's exceptions: one root, with subclasses that tell the caller what to do.

Errors raised by kafka-python, psycopg or MLflow are converted at the adapter that called them
(``raise ... from exc``), so callers above this floor never need to know those libraries' types.
"""

from __future__ import annotations


class InfraError(Exception):
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
