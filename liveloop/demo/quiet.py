"""A quiet console for ``liveloop demo``: library chatter goes to a log file, the console keeps liveloop's own lines.

While the demo runs in this process, MLflow, Kafka, urllib3, alembic, transformers and the rest log
through the root logger into ``<state>/logs/demo.log``, and so do Python warnings. Libraries that
print rather than log are switched off by their own settings: MLflow's "View run ... at: http://..."
lines (``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``), MLflow's artifact upload bars
(``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``), Hugging Face and tqdm bars (``HF_HUB_DISABLE_PROGRESS_BARS``,
``TQDM_DISABLE``, the latter read by tqdm at import, so it reaches the components' processes). The
components' own processes write into their log files already (:mod:`infra.processes`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

QUIET_ENVIRONMENT = {
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # MLflow gives its loggers their own stderr handler when it is imported unless this is false;
    # the components import it after the demo set it.
    "MLFLOW_CONFIGURE_LOGGING": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def library_output_to(log_file: Path) -> Iterator[None]:
    """Within the block, send every library's log records and Python's warnings to ``log_file`` (appended),
    and switch off the libraries' progress bars and printed links; restore the logging set-up afterwards.

    The environment variables stay set (a user's own values win), so that processes started within the
    block inherit them.
    """
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    adopt_console_loggers()
    _quiet_transformers()
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.handlers, level = saved
        root.setLevel(level)
        handler.close()


def adopt_console_loggers() -> None:
    """Make every logger that libraries configured so far (MLflow's, alembic's) hand its records to the root
    logger instead of writing them to the console itself."""
    for logger in logging.root.manager.loggerDict.values():
        if not isinstance(logger, logging.Logger):
            continue  # a placeholder of a logger not made yet: it will propagate
        console = [handler for handler in logger.handlers if _writes_to_console(handler)]
        for handler in console:
            logger.removeHandler(handler)
        if console:
            logger.propagate = True


def _writes_to_console(handler: logging.Handler) -> bool:
    # Libraries' stream handlers write to the console; a file handler is someone's deliberate log. The
    # stream is not compared with sys.stderr: a library may have captured an earlier sys.stderr object.
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def _quiet_transformers() -> None:
    """transformers gives its logger a stderr handler on its first use (after this) and its own progress bars."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
