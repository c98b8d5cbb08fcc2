"""The models section of `liveloop status` answers at once, saying what it could not read, when the
registry and the audit store are down (status must never hang on a stopped stack)."""

from __future__ import annotations

import io
import time

from rich.console import Console

from liveloop.models_status import models_section, print_models
from tests.conftest import free_port


def test_services_that_do_not_answer_leave_the_section_unavailable_quickly() -> None:
    started = time.monotonic()
    section = models_section(
        f"postgresql://liveloop:wrong@127.0.0.1:{free_port()}/liveloop",
        f"http://127.0.0.1:{free_port()}",
        "liveloop-policy",
        mlflow_healthy=False,
    )
    assert time.monotonic() - started < 10
    assert (section["champion"], section["candidate"], section["last_decision"]) == (None, None, None)
    assert section["errors"][0].startswith("mlflow unavailable")
    assert section["errors"][1].startswith("postgres unavailable")
    out = io.StringIO()
    print_models(section, Console(file=out, width=200))
    assert "none yet" in out.getvalue()
    assert "postgres unavailable" in out.getvalue()
