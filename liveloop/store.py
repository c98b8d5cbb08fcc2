"""What the audit commands (``replay``, ``audit``, ``export``) share: where the audit store is, and time ranges.

The store is ``LIVELOOP_OPERATOR_DSN`` when set (a deployed loop), otherwise the folder's running local
stack's PostgreSQL, found as ``liveloop status`` finds it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from infra.errors import ServiceUnavailable
from liveloop.exit_codes import UsageProblem
from liveloop.settings import OperatorSettings

TIME_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S"]
"""What ``--from``/``--to`` accept; a time without a zone is UTC."""


def audit_dsn() -> str:
    """The audit store's DSN: ``LIVELOOP_OPERATOR_DSN``, else the local stack's PostgreSQL."""
    settings = OperatorSettings()
    if settings.dsn is not None:
        return settings.dsn.get_secret_value()
    from infra.active import resolve_stack_settings
    from infra.credentials import load_credentials
    from infra.postgres import LocalPostgres

    stack_settings = resolve_stack_settings()
    if stack_settings.postgres_dsn is not None:
        return stack_settings.postgres_dsn.get_secret_value()
    credentials = load_credentials(settings.credentials_path or stack_settings.credentials_path)
    return LocalPostgres(stack_settings, credentials).dsn()


def time_range(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` as aware UTC times; refuses an empty or reversed range."""
    start, end = (value if value.tzinfo else value.replace(tzinfo=UTC) for value in (start, end))
    if not start < end:
        raise UsageProblem(f"--from {start.isoformat()} must be before --to {end.isoformat()}")
    return start, end


def connect(dsn: str) -> psycopg.Connection[Any]:
    """A connection to the audit store; :class:`ServiceUnavailable` (exit 4) when PostgreSQL does not answer."""
    try:
        return psycopg.connect(dsn, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(
            f"the audit store (PostgreSQL) did not answer: {exc}; start it or check the DSN"
        ) from exc
