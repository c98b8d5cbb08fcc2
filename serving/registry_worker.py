"""The swap controller's registry calls, made by a helper process of their own.

Why: MLflow's client spends a lot of Python per request (request-header providers, retries, and a
thread pool and progress bar per download: about 100 ms of CPU to fetch a six-file checkpoint). In
the gateway's process that CPU holds the GIL that the HTTP event loop needs, so requests in flight
wait for it; on 2 cores the slowest requests during a swap fell inside the download. The helper has
a GIL of its own and runs at a lower CPU priority (:data:`HELPER_NICE`), so serving keeps its core.

The checks of a downloaded checkpoint (:func:`serving.sanity.check_checkpoint`: every sha256 of its
manifest, every weight finite) run in the helper too: they hash and read every file, and they import
torch (about 1.5 s of the GIL, at the first swap), which the gateway's own process never needs.

The helper starts (and imports MLflow and torch, about 4 s) as soon as the :class:`RegistryWorker` is made,
while the gateway loads its engine. If it dies, the call in flight fails with :class:`RegistryError`
(the controller then keeps the champion serving and retries at its next reconcile) and the next
call starts a fresh helper. If the gateway dies (a SIGKILL leaves no time to stop anything), the
helper notices within a second and exits: the pool's queue would never tell it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from infra.registry import Registry, RegistryError
from learner.manifest import CheckpointManifest
from serving.sanity import check_checkpoint

T = TypeVar("T")

# Lowering one's own priority needs no privilege. The helper only fetches what serving will switch to:
# a swap may take a little longer on a busy machine, requests in flight should not.
HELPER_NICE = 10

_registry: Registry | None = None  # the helper's own client, made once by _start


class RegistryWorker:
    """What the swap controller asks of the registry (:meth:`alias_version`, :meth:`download`), answered
    by a helper process; :meth:`close` stops it."""

    def __init__(self, tracking_uri: str, nice: int = HELPER_NICE) -> None:
        self.tracking_uri = tracking_uri
        self.nice = nice
        self._pool = self._start_helper()

    def alias_version(self, name: str, alias: str) -> int:
        """The version number ``alias`` points at; AliasNotSet if there is none."""
        return self._call(_alias_version, name, alias)

    def download(self, name: str, version: int, destination: Path) -> Path:
        """Download the files of a model version into ``destination``; return the folder."""
        return self._call(_download, name, version, destination)

    def download_checked(self, name: str, version: int, destination: Path) -> tuple[Path, CheckpointManifest]:
        """:meth:`download`, then :func:`serving.sanity.check_checkpoint` on the folder, both in the helper;
        the folder and its manifest, or CheckpointRefused."""
        return self._call(_download_checked, name, version, destination)

    def helper_pids(self) -> list[int]:
        """The helper's process id (a list: empty while none runs), for accounting and fault injection."""
        return list(getattr(self._pool, "_processes", None) or {})

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _start_helper(self) -> ProcessPoolExecutor:
        # spawn, not fork: a fork would copy the gateway's threads' locks (and its engine's pipe).
        spawn = multiprocessing.get_context("spawn")
        started_by = (self.tracking_uri, self.nice, os.getpid())
        pool = ProcessPoolExecutor(1, mp_context=spawn, initializer=_start, initargs=started_by)
        pool.submit(int)  # the pool starts its process on the first task: start it now, not at the first swap
        return pool

    def _call(self, function: Callable[..., T], *args: Any) -> T:
        try:
            return self._pool.submit(function, *args).result()
        except BrokenProcessPool as exc:
            self._pool.shutdown(wait=False)
            self._pool = self._start_helper()
            raise RegistryError(f"the registry helper process died ({exc}); a new one is starting") from exc


ORPHAN_CHECK_S = 1.0


def _start(tracking_uri: str, nice: int, parent: int) -> None:
    global _registry
    with contextlib.suppress(OSError):
        os.nice(nice)
    threading.Thread(target=_exit_when_orphaned, args=(parent,), name="liveloop-orphan-check", daemon=True).start()
    _registry = Registry(tracking_uri)
    import torch  # noqa: F401 - the weight check's, now rather than during the first swap


def _exit_when_orphaned(parent: int) -> None:
    # A dead parent's children are adopted by another process (init, or a subreaper), so the parent
    # process id changes (``parent`` comes from the owner: it may have died before this thread started).
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(0)


def _helper_registry() -> Registry:
    assert _registry is not None, "called outside the helper process"
    return _registry


def _alias_version(name: str, alias: str) -> int:
    return _helper_registry().alias_version(name, alias)


def _download(name: str, version: int, destination: Path) -> Path:
    return _helper_registry().download(name, version, destination)


def _download_checked(name: str, version: int, destination: Path) -> tuple[Path, CheckpointManifest]:
    folder = _download(name, version, destination)
    return folder, check_checkpoint(folder)
