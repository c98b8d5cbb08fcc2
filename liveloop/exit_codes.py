"""How every ``liveloop`` command fails: one stderr line and a documented exit code, decided here only.

Every Typer app of the command line is built with ``cls=LiveloopGroup``; its :meth:`LiveloopGroup.invoke`
is the single boundary around every command (sub-apps included, also when a test invokes one alone).
Commands raise; they never print errors or pick exit codes themselves.

======  ==================================================================================================
code    meaning
======  ==================================================================================================
0       ok.
1       the command ran and found a problem: ``status`` saw something unhealthy, a promotion was refused, a
        service did not start, a prerequisite is missing; any other :class:`~infra.errors.LiveloopError`.
2       usage or configuration: a bad option (Typer's own usage errors), a missing key, invalid settings
        (pydantic's ``ValidationError``: the line names each bad ``LIVELOOP_*`` variable), a bad credential
        file, reward spec, gate policy, regression suite or simulator profile.
3       access refused: a key was given but it is the wrong one.
4       a service is unavailable: Kafka, PostgreSQL, MLflow or the gateway did not answer. Start it
        (``liveloop up``) or retry.
5       unexpected: an error that is not a ``LiveloopError`` (a bug, or a library error no adapter
        converted). The line names it and the file holding its traceback.
======  ==================================================================================================

stderr gets one line, ``error: <what went wrong and what to do>`` (an error whose message lists several
problems, such as an invalid reward spec, prints them as one block under that line). Set
``LIVELOOP_DEBUG=1`` to also print the traceback of any error. ``docs/cli.md`` repeats this table.
"""

from __future__ import annotations

import errno
import os
import tempfile
import traceback
from typing import Any

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from typer._click.core import Context as ClickContext  # Typer vendors click; its groups take this Context
from typer.core import TyperGroup

from distill.errors import AuditStoreUnavailable, InvalidRewardSpec
from infra.errors import AccessRefused, CredentialsError, LiveloopError, ServiceUnavailable
from infra.settings import LiveloopSettings
from ingest.errors import BrokerUnavailable
from liveloop.demo.simulator.errors import GatewayUnavailable, UnknownProfile
from serving.errors import NotReady
from serving.gate_policy import InvalidGatePolicy
from serving.regression import InvalidSuite

OK = 0
PROBLEM = 1
USAGE = 2
ACCESS_REFUSED = 3
UNAVAILABLE = 4
UNEXPECTED = 5

DEBUG_ENV = "LIVELOOP_DEBUG"
"""Set to ``1`` to print the traceback of any error after its line."""


class UsageProblem(LiveloopError):
    """The command lacks something it needs (a key, an option); the message says what to pass. Exit 2."""


class Refused(LiveloopError):
    """The command ran and what it asked for was refused (a promotion of a rejected version); the message
    says why. Exit 1."""


# First match wins: the narrower classes come before the code-1 default of every LiveloopError.
EXIT_CODES: tuple[tuple[tuple[type[BaseException], ...], int], ...] = (
    ((AccessRefused,), ACCESS_REFUSED),
    ((ServiceUnavailable, BrokerUnavailable, AuditStoreUnavailable, NotReady, GatewayUnavailable), UNAVAILABLE),
    (
        (
            UsageProblem,
            ValidationError,
            CredentialsError,
            InvalidRewardSpec,
            InvalidGatePolicy,
            InvalidSuite,
            UnknownProfile,
        ),
        USAGE,
    ),
    ((LiveloopError,), PROBLEM),
)


def exit_code(exc: BaseException) -> int:
    """The documented exit code of ``exc`` (see the module's table)."""
    for kinds, code in EXIT_CODES:
        if isinstance(exc, kinds):
            return code
    return UNEXPECTED


def message(exc: BaseException) -> str:
    """What follows ``error:`` for ``exc``: its own message, or for invalid settings each bad variable."""
    if isinstance(exc, ValidationError):
        return _validation_message(exc)
    if isinstance(exc, LiveloopError):
        return str(exc) or type(exc).__name__
    return f"unexpected {type(exc).__name__}: {exc}"


def _validation_message(exc: ValidationError) -> str:
    settings = _settings_class(exc.title)
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        field = ".".join(str(part) for part in error["loc"]) or "(settings)"
        if settings is not None:
            prefix = str(settings.model_config.get("env_prefix", ""))
            delimiter = str(settings.model_config.get("env_nested_delimiter") or "__")
            name = prefix + delimiter.join(str(part) for part in error["loc"])
            field = f"{name.upper()} ({field})"
        problems.append(f"{field}: {error['msg']}")
    # The input values are left out on purpose: a bad value may be a secret (a DSN, a key).
    return f"invalid settings ({exc.title}): " + "; ".join(problems)


def _settings_class(title: str) -> type[BaseSettings] | None:
    """The settings class a ValidationError's title names, to turn its field names into env variables."""
    pending: list[type[BaseSettings]] = [LiveloopSettings]
    while pending:
        cls = pending.pop()
        if cls.__name__ == title:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def _report(exc: BaseException) -> int:
    """Print ``exc`` as one ``error:`` line (plus where its traceback is); return its exit code."""
    code = exit_code(exc)
    line = message(exc)
    details = "".join(traceback.format_exception(exc))
    if code == UNEXPECTED:
        # A bug: the traceback is what someone needs to fix it, but not on the user's screen.
        fd, path = tempfile.mkstemp(prefix="liveloop-error-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            log.write(details)
        line += f" (a bug; traceback in {path}, or set {DEBUG_ENV}=1 to print it)"
    typer.echo(typer.style("error:", fg="red") + " " + line, err=True)
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        typer.echo(details, err=True, nl=False)
    return code


class LiveloopGroup(TyperGroup):
    """A Typer group whose :meth:`invoke` is the command line's single error boundary."""

    def invoke(self, ctx: ClickContext) -> Any:
        """Run the command; turn whatever it raises into one stderr line and the documented exit code."""
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, EOFError, KeyboardInterrupt):
            raise  # Typer's own ways out (usage errors, explicit exits) keep their codes and messages.
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # Typer exits quietly when stdout's reader has gone (``liveloop status | head``).
            raise typer.Exit(_report(exc)) from exc
        except Exception as exc:
            raise typer.Exit(_report(exc)) from exc
