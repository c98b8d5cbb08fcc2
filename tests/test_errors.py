"""One error root: every exception class the six packages define derives from ``LiveloopError``.

The command line's single error boundary (:mod:`liveloop.exit_codes`) turns a ``LiveloopError`` into
one line and a documented exit code, and treats anything else as a bug; an exception class outside
the root would end as "unexpected" (exit 5) however well its message explains the problem.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

from infra.errors import LiveloopError

PACKAGES = ("infra", "ingest", "distill", "learner", "serving", "liveloop")


def _modules() -> list[ModuleType]:
    modules = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            modules.append(importlib.import_module(info.name))
    return modules


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for module in _modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, BaseException):
                found.append(cls)
    return found


def test_the_walk_finds_the_package_roots() -> None:
    names = {cls.__name__ for cls in _exception_classes()}
    assert {"LiveloopError", "InfraError", "IngestError", "DistillError", "LearnerError", "ServingError"} <= names
    assert "SimulatorError" in names


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_exception_class_derives_from_liveloop_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, LiveloopError), f"{cls.__module__}.{cls.__qualname__} bases {cls.__bases__}"
