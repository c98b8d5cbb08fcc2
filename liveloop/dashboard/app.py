"""The dashboard's FastAPI app: sessions, sign-in and -out, ``/healthz``, ``/metrics``, static files, and
the pages and actions of :mod:`liveloop.dashboard.pages` and :mod:`liveloop.dashboard.actions`.

Pages need a signed-in session (a viewer or an operator key); a browser without one is sent to the
sign-in page, a script gets 401. Every POST carries the session's CSRF token or is refused with 403.
"""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from infra.credentials import load_credentials
from infra.errors import CredentialsError, LiveloopError
from infra.registry import Registry
from liveloop.dashboard.auth import COOKIE_NAME, Session, SessionSigner, role_of_key, valid_name
from liveloop.dashboard.overview import Overview
from liveloop.dashboard.settings import DashboardSettings
from serving.promotion import Promoter

HERE = Path(__file__).parent
MAX_FORM_BYTES = 64 * 1024
_STATIC = {"dashboard.css": "text/css", "overview.js": "text/javascript"}
# Our own files only: no inline script, no other origin, and no page of ours inside another site's frame.
_CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"


class NotSignedIn(LiveloopError):
    """The request has no signed-in session (a page redirects to sign-in, JSON answers 401)."""


@dataclass
class Dashboard:
    """What the routes share: settings, the signer, the promoter, the overview, templates and metrics."""

    settings: DashboardSettings
    dsn: str
    signer: SessionSigner
    promoter: Promoter
    overview: Overview
    templates: Jinja2Templates
    requests: Counter
    actions: Counter
    metrics_registry: CollectorRegistry

    def session(self, request: Request) -> Session:
        """The request's session; a fresh anonymous one when it has none (or a forged or expired one)."""
        found = self.signer.load(request.cookies.get(COOKIE_NAME))
        return found if found is not None else self.signer.new("anonymous")

    def signed_in(self, request: Request) -> Session:
        """The request's session if signed in, else :class:`NotSignedIn`."""
        session = self.session(request)
        if not session.signed_in:
            raise NotSignedIn()
        return session

    def page(self, request: Request, name: str, session: Session, status_code: int = 200, **context: Any) -> Response:
        """Render template ``name`` for ``session``, with its CSRF token, and keep its cookie set."""
        context.update(session=session, csrf=self.signer.csrf_token(session), model_name=self.settings.model_name)
        response = self.templates.TemplateResponse(request, name, context, status_code=status_code)
        self.set_cookie(response, session)
        return response

    def set_cookie(self, response: Response, session: Session) -> None:
        """Attach the session cookie: HttpOnly, SameSite=Strict, for the session's remaining lifetime."""
        response.set_cookie(
            COOKIE_NAME,
            self.signer.dump(session),
            max_age=self.settings.session_max_age_s,
            httponly=True,
            samesite="strict",
            secure=False,  # loopback by default; behind TLS a proxy adds Secure
            path="/",
        )


async def read_form(request: Request) -> dict[str, str]:
    """The url-encoded form of a POST (first value per field); a body over 64 KiB or not a form gives {}."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = urllib.parse.parse_qs(body.decode(errors="replace"), keep_blank_values=True, max_num_fields=32)
    return {key: values[0] for key, values in parsed.items()}


def create_app(settings: DashboardSettings, dsn: str) -> FastAPI:
    """The dashboard on the audit store at ``dsn`` and the services that ``settings`` name."""
    from liveloop.dashboard import actions, pages

    secret = (
        settings.session_secret.get_secret_value().encode()
        if settings.session_secret is not None
        else secrets.token_bytes(32)
    )
    registry = CollectorRegistry()
    dash = Dashboard(
        settings=settings,
        dsn=dsn,
        signer=SessionSigner(secret, settings.session_max_age_s),
        promoter=Promoter(
            registry=Registry(settings.mlflow_url),
            dsn=dsn,
            bootstrap=settings.bootstrap,
            topic=settings.promotions_topic,
            model_name=settings.model_name,
        ),
        overview=Overview(
            settings,
            dsn,
            Histogram(
                "liveloop_dashboard_refresh_seconds",
                "Time to read the overview (MLflow's aliases, components, lag), in the background or after an action.",
                buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
                registry=registry,
            ),
        ),
        templates=Jinja2Templates(directory=str(HERE / "templates")),
        requests=Counter(
            "liveloop_dashboard_requests",
            "Requests answered, by route and status.",
            ["route", "code"],
            registry=registry,
        ),
        actions=Counter(
            "liveloop_dashboard_actions",
            "Operator actions taken, by action and outcome.",
            ["action", "outcome"],
            registry=registry,
        ),
        metrics_registry=registry,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # The overview is read in the background from the start, so that no page waits on MLflow.
        dash.overview.start()
        try:
            yield
        finally:
            await run_in_threadpool(dash.overview.stop)
            dash.promoter.close()

    app = FastAPI(title="liveloop dashboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.dashboard = dash

    @app.middleware("http")
    async def headers_and_counts(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers["Content-Security-Policy"] = _CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers.setdefault("Cache-Control", "no-store")
        route = request.scope.get("route")
        dash.requests.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    @app.exception_handler(NotSignedIn)
    async def to_sign_in(request: Request, _: NotSignedIn) -> Response:
        if request.url.path.endswith(".json") or request.method != "GET":
            return Response('{"detail": "sign in first"}', status_code=401, media_type="application/json")
        target = urllib.parse.quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return RedirectResponse(f"/signin?next={target}", status_code=303)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response('{"status": "ok"}', media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in _STATIC:
            return Response("not found", status_code=404)
        return Response((HERE / "static" / name).read_bytes(), media_type=_STATIC[name])

    @app.get("/signin", response_class=HTMLResponse)
    async def sign_in_page(request: Request, next: str = "/") -> Response:
        return dash.page(request, "signin.html", dash.session(request), next=_local(next), message=None)

    @app.post("/signin")
    async def sign_in(request: Request) -> Response:
        session = dash.session(request)
        form = await read_form(request)
        if not dash.signer.csrf_ok(session, form.get("csrf")):
            return forbidden(dash, request, session, "The form's CSRF token is missing or wrong; reload the page.")
        name, key, target = form.get("name", "").strip(), form.get("key", ""), _local(form.get("next", "/"))
        if not valid_name(name):
            message = "Give your name (1 to 64 characters): it is recorded with every action you take."
            return dash.page(request, "signin.html", session, 400, next=target, message=message)
        try:
            role = role_of_key(load_credentials(settings.credentials_path), key)
        except CredentialsError as exc:
            return dash.page(request, "signin.html", session, 503, next=target, message=str(exc))
        if role is None:
            message = "Wrong key: use operator_key (to act) or viewer_key (to look) from the credential file."
            return dash.page(request, "signin.html", session, 401, next=target, message=message)
        response = RedirectResponse(target, status_code=303)
        dash.set_cookie(response, dash.signer.new(role, name))  # a new session id: no fixation
        return response

    @app.post("/signout")
    async def sign_out(request: Request) -> Response:
        session = dash.session(request)
        form = await read_form(request)
        if not dash.signer.csrf_ok(session, form.get("csrf")):
            return forbidden(dash, request, session, "The form's CSRF token is missing or wrong; reload the page.")
        response = RedirectResponse("/signin", status_code=303)
        dash.set_cookie(response, dash.signer.new("anonymous"))
        return response

    pages.add_routes(app, dash)
    actions.add_routes(app, dash)
    return app


def forbidden(dash: Dashboard, request: Request, session: Session, message: str) -> Response:
    """403 with ``message`` on the error page."""
    return dash.page(request, "error.html", session, 403, title="Refused", message=message)


def _local(target: str) -> str:
    """``target`` if it is a path of this site, else ``/``: a sign-in link cannot send anyone elsewhere."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"
