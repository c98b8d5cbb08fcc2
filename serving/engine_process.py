"""The torch engine in a process of its own, behind the :class:`~serving.engine.Engine` interface.

Why: a small model decodes in many short torch calls with Python between them, so the decoder needs
the GIL nearly all the time; in the gateway's process it shares that GIL with the HTTP event loop,
JSON, authentication and the event sender, and each waits for the other (measured: the batcher idle
a third of the time with requests waiting to be parsed). A child process gives the engine a GIL (and
a core) of its own, which is how vLLM separates its API server from its engine core.

The child runs a :class:`~serving.torch_engine.TorchEngine` and one loop reading calls from a pipe:
a generation is queued at once (:meth:`TorchEngine.submit`) and answered from the batcher thread when
it finishes, so any number of requests batch together; ``load``, ``switch`` and ``unload`` run on a
thread of their own, so a slow load never holds up generation (the hot swap loads beside the
serving version). Every answer to a control call carries the engine's versions, which the parent
keeps: only the parent changes them, so ``default_version`` and ``loaded_versions`` (read on every
request) never cross the pipe.

Failure: when the child dies, every waiting call fails with :class:`ChildExited` and ``on_exit`` is
called (the gateway then stops, and its keeper starts it again); when the parent dies, the child
reads the end of the pipe and exits.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from serving.engine import Generation, InferenceEngineError, QueuingEngine, SamplingParams, UnknownVersion
from serving.errors import NotReady, ServingError

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005
"""How long another thread of the engine's process may hold the GIL while the batcher waits for it.

The batcher lets go of the GIL in every torch call and takes it back after; when the control thread
(a load) or the pipe loop (a request's arguments) runs Python meanwhile, CPython hands the GIL back
only after the switch interval, 5 ms by default: a decode step of about 1 ms then waited up to 5 ms.
0.5 ms bounds that wait; the cost, more GIL hand-offs while two threads are busy, is small beside a
decode step. In the swap bench (tiny model, 2 cores) the steady p99 was 16.7-18.9 ms in ten runs with
it and 17.5-21.1 ms in five without, the same day; the gateway bench's ratio was 0.91 (0.82-0.87 before).
"""

Versions = tuple[int | None, list[int]]
"""The engine's default version (None before the first load) and every loaded version."""


class ChildExited(InferenceEngineError):
    """The engine's process is gone; nothing more can be served until the gateway starts again."""


class EngineProcess(QueuingEngine):
    """A :class:`~serving.torch_engine.TorchEngine` in a child process (see the module docstring)."""

    def __init__(
        self,
        device: str = "auto",
        dtype: str = "auto",
        max_batch: int = 8,
        batch_wait_ms: float = 5.0,
        torch_threads: int = 0,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        context = multiprocessing.get_context("spawn")  # a fork would copy this process's threads' locks
        self._conn, child_end = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child_end, device, dtype, max_batch, batch_wait_ms, torch_threads),
            name="liveloop-engine",
            daemon=True,
        )
        self._process.start()
        child_end.close()
        self._on_exit = on_exit
        self._ids = itertools.count()
        self._waiting: dict[int, tuple[Future[Any], bool]] = {}  # call id -> (its future, changes versions)
        self._send_lock = threading.Lock()
        self._versions: Versions = (None, [])
        self._closing = False
        self._gone: ChildExited | None = None
        self._reader = threading.Thread(target=self._read, name="liveloop-engine-reader", daemon=True)
        self._reader.start()

    # -- the Engine interface ---------------------------------------------------------------------

    def load(self, folder: Path, policy_version: int) -> None:
        self._control("load", Path(folder), policy_version)

    def switch(self, policy_version: int) -> None:
        self._control("switch", policy_version)

    def unload(self, policy_version: int) -> None:
        self._control("unload", policy_version)

    @property
    def default_version(self) -> int:
        default = self._versions[0]
        if default is None:
            raise NotReady("no policy version is loaded yet; load a checkpoint first")
        return default

    @property
    def loaded_versions(self) -> list[int]:
        return list(self._versions[1])

    def submit(
        self, prompts: list[str], params: SamplingParams, policy_version: int | None = None
    ) -> Future[list[Generation]]:
        if policy_version is not None and policy_version not in self._versions[1]:
            raise UnknownVersion(f"policy version {policy_version} is not loaded (loaded: {self._versions[1]})")
        return self._call("submit", prompts, params, policy_version)

    def close(self) -> None:
        """Ask the child to finish what it holds and exit; kill it if it does not within 60 s."""
        self._closing = True
        with contextlib.suppress(ChildExited):
            self._send(-1, "close")
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

    @property
    def pid(self) -> int | None:
        """The child's process id (for memory accounting and fault injection)."""
        return self._process.pid

    # -- the pipe ---------------------------------------------------------------------------------

    def _control(self, method: str, *args: Any) -> None:
        self._call(method, *args, control=True).result()  # the reader keeps the versions it answers with

    def _call(self, method: str, *args: Any, control: bool = False) -> Future[Any]:
        if self._gone is not None:
            raise self._gone
        call_id = next(self._ids)
        future: Future[Any] = Future()
        self._waiting[call_id] = (future, control)
        try:
            self._send(call_id, method, *args)
        except ChildExited:
            self._waiting.pop(call_id, None)
            raise
        return future

    def _send(self, call_id: int, method: str, *args: Any) -> None:
        try:
            with self._send_lock:
                self._conn.send((call_id, method, args))
        except (OSError, ValueError) as exc:  # the pipe is closed: the child is gone
            raise ChildExited(f"the engine process is gone (exit code {self._process.exitcode})") from exc

    def _read(self) -> None:
        """Resolve each call as its answer arrives; when the pipe ends, fail whatever still waits."""
        try:
            while True:
                call_id, ok, payload = self._conn.recv()
                future, control = self._waiting.pop(call_id)
                if ok and control:
                    # Here, in the order the child answered (its control calls run one at a time), so
                    # that two control calls from two threads cannot leave the older versions behind.
                    self._versions = payload
                if ok:
                    future.set_result(payload)
                else:
                    future.set_exception(payload)
        except (EOFError, OSError):
            pass
        self._process.join(timeout=5)
        gone = ChildExited(f"the engine process exited (exit code {self._process.exitcode})")
        self._gone = gone
        for call_id in list(self._waiting):
            waiting = self._waiting.pop(call_id, None)
            if waiting is not None and not waiting[0].done():
                waiting[0].set_exception(gone)
        if not self._closing:
            log.error("%s; the gateway cannot serve without it", gone)
            if self._on_exit is not None:
                self._on_exit()


# -- the child --------------------------------------------------------------------------------------


def _serve(conn: Connection, device: str, dtype: str, max_batch: int, batch_wait_ms: float, torch_threads: int) -> None:
    """The child's main: a TorchEngine, and the loop that answers the parent's calls."""
    import torch

    from serving.torch_engine import TorchEngine
    from serving.torch_load import import_loaders

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the gateway, which closes this engine
    if torch_threads:
        torch.set_num_threads(torch_threads)
    engine = TorchEngine(device, dtype, max_batch, batch_wait_ms)
    # What start-up made (torch and transformers: about half a million objects) lives as long as the
    # process. Frozen, the cycle collector never scans it again: a full collection of it held the GIL
    # for about 240 ms (measured in the swap bench), stalling every running request. Models are loaded
    # after the freeze, so an unloaded one is still collected.
    import_loaders()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    send_lock = threading.Lock()
    controls = ThreadPoolExecutor(1, thread_name_prefix="liveloop-engine-control")  # one load at a time

    def answer(call_id: int, ok: bool, payload: Any) -> None:
        # A closed pipe means the parent is gone; the loop below sees the pipe's end too.
        with send_lock, contextlib.suppress(OSError, ValueError):
            conn.send((call_id, ok, payload))

    def failed(call_id: int, exc: BaseException) -> None:
        answer(call_id, False, _portable(exc))

    def finished(call_id: int, future: Future[list[Generation]]) -> None:
        exc = future.exception()
        if exc is None:
            answer(call_id, True, future.result())
        else:
            failed(call_id, exc)

    def control(call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            getattr(engine, method)(*args)
            default = engine.default_version if engine.loaded_versions else None
            answer(call_id, True, (default, engine.loaded_versions))
        except Exception as exc:  # every failure goes back to the caller, who decides
            failed(call_id, exc)

    try:
        while True:
            try:
                call_id, method, args = conn.recv()
            except (EOFError, OSError):
                break
            if method == "close":
                break
            if method == "submit":
                try:
                    future = engine.submit(*args)
                except Exception as exc:
                    failed(call_id, exc)
                    continue
                future.add_done_callback(functools.partial(finished, call_id))
            else:
                controls.submit(control, call_id, method, args)
    finally:
        controls.shutdown(wait=True)
        engine.close()
        conn.close()
        gc.unfreeze()  # what start-up made is reclaimed at exit, as extension modules expect (triton checks)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as the parent can unpickle it: serving's own errors as they are, anything else
    (torch's, transformers') as an InferenceEngineError naming it."""
    if isinstance(exc, ServingError):
        return exc
    return InferenceEngineError(f"{type(exc).__name__}: {exc}")
