"""The distiller's worker process: Faust's worker, which also ends when its shutdown after a crash hangs.

A crash (an agent that fails, a batch the audit store could not take) must end the process: its keeper
starts a fresh one, which reads again whatever was not committed. Faust stops its services first and
the process exits within seconds. Should that shutdown hang, the process would stay alive with nothing
running and its partitions still assigned to it, so after :data:`CRASH_EXIT_S` it ends at once, without
the rest of the shutdown. Nothing is lost by that: delivery is at least once, and every offset not
committed is read again.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import faust

log = logging.getLogger(__name__)

CRASH_EXIT_S = 30.0
"""Longest a crashed worker may take to stop before it exits without finishing its shutdown."""
CRASH_EXIT_CODE = 70
"""The exit status of a worker ended that way (EX_SOFTWARE: an internal error)."""


def exit_hard_after(seconds: float, reason: BaseException) -> threading.Timer:
    """End the process ``seconds`` from now, unless it has exited before; a daemon thread waits for it."""
    timer = threading.Timer(seconds, _exit_hard, args=(seconds, reason))
    timer.daemon = True
    timer.start()
    return timer


def _exit_hard(seconds: float, reason: BaseException) -> None:
    log.critical("the worker did not stop within %s s of its crash (%r); ending it now", seconds, reason)
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


class CrashExitingWorker(faust.Worker):
    """Faust's worker that ends the process if it is still running :data:`CRASH_EXIT_S` after a crash."""

    def _crash(self, reason: BaseException) -> None:
        # mode marks every service up to the worker as crashed through this method, whichever service failed.
        first = not self._crashed.is_set()
        super()._crash(reason)
        if first:
            exit_hard_after(CRASH_EXIT_S, reason)
