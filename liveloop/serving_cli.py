"""Operator commands on the champion: ``promote VERSION``, ``rollback``, ``reject VERSION``.

A Typer sub-app; the top-level CLI exposes its commands as ``liveloop promote/rollback/reject``.
Every command needs the operator key (``--key`` or env ``LIVELOOP_OPERATOR_KEY``), checked against
``operator_key`` of the credential file, and records who (``--actor``, default the login name), why
(``--reason``) and when, through :class:`serving.promotion.Promoter`.

Where things are: by default the local stack's (``StackSettings``: credentials, PostgreSQL, MLflow,
Kafka); each can be overridden with ``LIVELOOP_OPERATOR_*`` settings to operate a deployed loop.
"""

from __future__ import annotations

import getpass
import secrets
from collections.abc import Callable
from typing import Annotated

import typer
from rich.console import Console

from infra.active import resolve_stack_settings
from infra.credentials import load_credentials
from infra.errors import AccessRefused
from infra.registry import Registry
from liveloop.exit_codes import LiveloopGroup, Refused, UsageProblem
from liveloop.settings import OperatorSettings
from serving.errors import ServingError
from serving.promotion import Promoter
from serving.promotions_contract import PromotionEvent

app = typer.Typer(
    help="Operate the champion: promote, roll back, reject.",
    no_args_is_help=True,
    add_completion=False,
    cls=LiveloopGroup,
)
console = Console()

KeyOption = Annotated[
    str | None, typer.Option("--key", help="Operator key (env LIVELOOP_OPERATOR_KEY).", show_default=False)
]
ReasonOption = Annotated[str, typer.Option("--reason", help="Why; recorded in the history.")]
ActorOption = Annotated[str | None, typer.Option("--actor", help="Who decides; default: your login name.")]


def _promoter(key: str | None) -> Promoter:
    """Check the operator key, then build a Promoter on the configured (or local) stack."""
    settings = OperatorSettings()
    stack_settings = resolve_stack_settings()  # the folder's running stack, e.g. a kept-running demo
    credentials = load_credentials(settings.credentials_path or stack_settings.credentials_path)
    given = key if key is not None else (settings.key.get_secret_value() if settings.key else None)
    if not given:
        raise UsageProblem("an operator key is required: pass --key or set LIVELOOP_OPERATOR_KEY")
    if not secrets.compare_digest(given.encode(), credentials.operator_key.get_secret_value().encode()):
        raise AccessRefused("the operator key is wrong; use operator_key from the credential file")
    if settings.dsn is not None:
        dsn = settings.dsn.get_secret_value()
    elif stack_settings.postgres_dsn is not None:
        dsn = stack_settings.postgres_dsn.get_secret_value()
    else:
        from infra.postgres import LocalPostgres

        dsn = LocalPostgres(stack_settings, credentials).dsn()
    return Promoter(
        registry=Registry(settings.mlflow_url or stack_settings.mlflow_address),
        dsn=dsn,
        bootstrap=settings.bootstrap or stack_settings.kafka_address,
        topic=settings.promotions_topic,
        model_name=settings.model_name,
    )


def _show(event: PromotionEvent) -> None:
    moved = f"version {event.to_version}"
    if event.action != "reject" and event.from_version is not None:
        moved = f"version {event.from_version} -> {event.to_version}"
    console.print(f"{event.action} {event.model_name} {moved} by {event.actor} (history #{event.history_id})")


def _run(action: str, key: str | None, call: Callable[[Promoter], PromotionEvent]) -> None:
    promoter = _promoter(key)
    try:
        event = call(promoter)
    except ServingError as exc:
        # Only the refusal gets the action's name in front; other failures reach the boundary as they are.
        raise Refused(f"{action} refused: {exc}") from exc
    finally:
        promoter.close()
    _show(event)


@app.command()
def promote(
    version: Annotated[
        int, typer.Argument(help="The version to make champion (what responses and the history call it).", min=1)
    ],
    reason: ReasonOption,
    key: KeyOption = None,
    actor: ActorOption = None,
) -> None:
    """Move ``champion`` to VERSION (serving swaps to it)."""
    who = actor or getpass.getuser()
    _run("promote", key, lambda p: p.promote(version, actor=who, reason=reason))


@app.command()
def rollback(reason: ReasonOption, key: KeyOption = None, actor: ActorOption = None) -> None:
    """Move ``champion`` back to the previous champion of the promotion history, in one step."""
    who = actor or getpass.getuser()
    _run("rollback", key, lambda p: p.rollback(actor=who, reason=reason))


@app.command()
def reject(
    version: Annotated[
        int, typer.Argument(help="The version to refuse for good (what responses and the history call it).", min=1)
    ],
    reason: ReasonOption,
    key: KeyOption = None,
    actor: ActorOption = None,
) -> None:
    """Refuse VERSION: recorded, never promoted, and its canary stops."""
    who = actor or getpass.getuser()
    _run("reject", key, lambda p: p.reject(version, actor=who, reason=reason))
