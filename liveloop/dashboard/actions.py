"""Promote, roll back, reject: a confirmation page, then a POST that :class:`serving.promotion.Promoter`
carries out, exactly as ``liveloop promote/rollback/reject`` do (same rows, tags and announcement).

Only an operator acts: a viewer gets 403, so does a POST without this session's CSRF token. Every
action needs a reason and the confirmation box ticked; the actor recorded is the name given at sign-in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from liveloop.dashboard.app import forbidden, read_form
from serving.errors import ServingError
from serving.promotions_contract import PromotionEvent

if TYPE_CHECKING:
    from liveloop.dashboard.app import Dashboard
    from liveloop.dashboard.auth import Session

ACTIONS = ("promote", "rollback", "reject")
MAX_REASON = 2000


def add_routes(app: FastAPI, dash: Dashboard) -> None:
    """Register the confirmation pages and the actions on ``app``."""

    @app.get("/actions/{action}", response_class=HTMLResponse)
    def confirm(request: Request, action: str, version: str = "") -> Response:
        session = dash.signed_in(request)
        refused = _refusal(dash, request, session, action)
        if refused is not None:
            return refused
        return dash.page(
            request,
            "confirm.html",
            session,
            action=action,
            version=version,
            reason="",
            message=None,
            models=dash.overview.models(),
        )

    @app.post("/actions/{action}")
    async def act(request: Request, action: str) -> Response:
        session = dash.signed_in(request)
        form = await read_form(request)
        # The CSRF check comes first: a forged request learns nothing, not even whether its role could act.
        if not dash.signer.csrf_ok(session, form.get("csrf")):
            dash.actions.labels(action if action in ACTIONS else "unknown", "forged").inc()
            return forbidden(dash, request, session, "The form's CSRF token is missing or wrong; nothing was done.")
        refused = _refusal(dash, request, session, action)
        if refused is not None:
            dash.actions.labels(action if action in ACTIONS else "unknown", "refused").inc()
            return refused
        reason = form.get("reason", "").strip()
        version_text = form.get("version", "").strip()
        problems = []
        if not reason:
            problems.append("Give a reason: it is recorded in the history.")
        elif len(reason) > MAX_REASON:
            problems.append(f"The reason has {len(reason)} characters; keep it under {MAX_REASON}.")
        if action != "rollback" and not (version_text.isdigit() and int(version_text) >= 1):
            problems.append(f"Name the version to {action} (a number from 1).")
        if form.get("confirm") != "yes":
            problems.append("Tick the confirmation box.")
        if problems:
            return dash.page(
                request,
                "confirm.html",
                session,
                400,
                action=action,
                version=version_text,
                reason=reason,
                message=" ".join(problems),
                models=await run_in_threadpool(dash.overview.models),
            )
        try:
            event = await run_in_threadpool(_do, dash, action, int(version_text or 0), session.name, reason)
        except ServingError as exc:
            dash.actions.labels(action, "failed").inc()
            await run_in_threadpool(dash.overview.refresh)  # the refusal may come from a move made elsewhere
            return dash.page(
                request,
                "confirm.html",
                session,
                409,
                action=action,
                version=version_text,
                reason=reason,
                message=f"{action} refused: {exc}",
                models=await run_in_threadpool(dash.overview.models),
            )
        dash.actions.labels(action, "done").inc()
        # Read MLflow again before answering, so the operator's next page shows the champion they just made.
        await run_in_threadpool(dash.overview.refresh)
        return RedirectResponse(f"/history?done={event.history_id}", status_code=303)


def _refusal(dash: Dashboard, request: Request, session: Session, action: str) -> Response | None:
    if action not in ACTIONS:
        return dash.page(
            request,
            "error.html",
            session,
            404,
            title="No such action",
            message=f"{action!r} is not one of {', '.join(ACTIONS)}.",
        )
    if not session.can_act:
        return forbidden(
            dash, request, session, "Viewers cannot act: sign in with the operator key to promote, roll back or reject."
        )
    return None


def _do(dash: Dashboard, action: str, version: int, actor: str, reason: str) -> PromotionEvent:
    p = dash.promoter
    if action == "promote":
        return p.promote(version, actor=actor, reason=reason)
    if action == "reject":
        return p.reject(version, actor=actor, reason=reason)
    return p.rollback(actor=actor, reason=reason)
