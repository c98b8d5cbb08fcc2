"""``python -m liveloop.dashboard``: the dashboard under uvicorn, with ``DashboardSettings`` from the environment."""

from __future__ import annotations

import uvicorn

from infra.credentials import load_credentials
from infra.postgres import LocalPostgres
from infra.settings import StackSettings
from liveloop.dashboard.app import create_app
from liveloop.dashboard.settings import DashboardSettings


def main() -> None:
    """Run the dashboard: one worker, warnings only, no access log (keys never travel in URLs anyway)."""
    settings = DashboardSettings()
    if settings.dsn is not None:
        dsn = settings.dsn.get_secret_value()
    else:  # the local stack's audit store, as the CLI finds it
        stack = StackSettings()
        dsn = LocalPostgres(stack, load_credentials(settings.credentials_path)).dsn()
    app = create_app(settings, dsn)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
