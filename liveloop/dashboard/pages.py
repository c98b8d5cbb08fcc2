"""The pages: overview (and its JSON), checkpoints, one checkpoint, the promotion history.

Handlers are plain ``def``: FastAPI runs them in its thread pool, where the blocking PostgreSQL calls
belong. What MLflow and the components say comes from the overview's background snapshot, never from a
request of a page's own (:mod:`liveloop.dashboard.overview`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from liveloop.dashboard import store
from liveloop.dashboard.charts import line_chart

if TYPE_CHECKING:
    from liveloop.dashboard.app import Dashboard

# The gate's figures shown beside each checkpoint, in this order: (metrics key, label).
GATE_FIGURES = (
    ("candidate_reward", "reward"),
    ("champion_reward", "champion reward"),
    ("difference_ci_low", "difference CI low"),
    ("difference_ci_high", "difference CI high"),
    ("mean_kl", "KL"),
    ("regression_pass_rate", "regression pass rate"),
    ("held_out_samples", "held-out samples"),
)


def add_routes(app: FastAPI, dash: Dashboard) -> None:
    """Register the pages on ``app``."""

    @app.get("/", response_class=HTMLResponse)
    def overview(request: Request) -> Response:
        session = dash.signed_in(request)
        return dash.page(request, "overview.html", session, doc=dash.overview.get())

    @app.get("/overview.json")
    def overview_json(request: Request) -> Response:
        dash.signed_in(request)
        return JSONResponse(_jsonable(dash.overview.get()))

    @app.get("/checkpoints", response_class=HTMLResponse)
    def checkpoints(request: Request) -> Response:
        session = dash.signed_in(request)
        models = dash.overview.models()
        with store.connect(dash.dsn) as conn:
            rows = store.checkpoints(conn, dash.settings.model_name)
        return dash.page(request, "checkpoints.html", session, rows=rows, models=models, figures=GATE_FIGURES)

    @app.get("/checkpoints/{version}", response_class=HTMLResponse)
    def checkpoint(request: Request, version: int) -> Response:
        session = dash.signed_in(request)
        with store.connect(dash.dsn) as conn:
            row = store.checkpoint(conn, dash.settings.model_name, version)
            if row is None:
                message = f"{dash.settings.model_name} has no checkpoint with version {version}."
                return dash.page(request, "error.html", session, 404, title="No such checkpoint", message=message)
            # Only the versions: the whole listing (lineage, offsets, evaluations) is the checkpoints page's.
            series = store.by_version(conn, store.versions(conn, dash.settings.model_name))
        keys = sorted({key for s in series for key in s["components"]})
        charts = [
            line_chart("mean reward by version", [(f"v{s['version']}", s["reward"]) for s in series]),
            line_chart("acceptance by version", [(f"v{s['version']}", s["acceptance"]) for s in series]),
            *(
                line_chart(f"{key} by version", [(f"v{s['version']}", s["components"].get(key)) for s in series])
                for key in keys
            ),
        ]
        return dash.page(
            request,
            "checkpoint.html",
            session,
            row=row,
            figures=GATE_FIGURES,
            series=series,
            keys=keys,
            charts=charts,
        )

    @app.get("/history", response_class=HTMLResponse)
    def history(request: Request, action: str = "", actor: str = "", version: str = "", before: str = "") -> Response:
        session = dash.signed_in(request)
        filters = store.HistoryFilter(
            action=action if action in store.HISTORY_ACTIONS else "",
            actor=actor[:256],
            version=int(version) if version.isdigit() else None,
            before_id=int(before) if before.isdigit() else None,
        )
        limit = dash.settings.history_page_size
        with store.connect(dash.dsn) as conn:
            rows = store.history(conn, dash.settings.model_name, filters, limit + 1)
        more = rows[limit - 1]["id"] if len(rows) > limit else None  # the next page starts below the last shown
        return dash.page(
            request,
            "history.html",
            session,
            rows=rows[:limit],
            filters=filters,
            more=more,
            actions=store.HISTORY_ACTIONS,
        )


def _jsonable(value: Any) -> Any:
    """``value`` with dates and other non-JSON values as strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
