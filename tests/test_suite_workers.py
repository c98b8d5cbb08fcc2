"""`make test` runs the suite on two pytest-xdist workers (``--dist loadgroup``); this checks the grouping it relies
on, with the suite's own hook (tests/conftest.py), on a small suite of its own.

Nothing fails loudly when the grouping breaks: on pytest 9.2 xdist silently spreads grouped tests over every
worker (pytest-dev/pytest-xdist#1386), and two whole-loop tests would then train side by side on two cores.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

CONFTEST = """
import os
import pytest
from tests.conftest import WHOLE_LOOP, pytest_collection_modifyitems  # the suite's own hook

@pytest.fixture(autouse=True)
def _record(request):
    yield
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(f"{os.environ['PYTEST_XDIST_WORKER']} {request.node.nodeid.split('@')[0]}\\n")
"""

ROOT = Path(__file__).resolve().parents[1]


def makefile_pytest_options() -> list[str]:
    """The options the Makefile's ``pytest`` target gives pytest, at its default worker count: the test runs
    what ``make test`` runs, not a copy that could drift from it."""
    makefile = (ROOT / "Makefile").read_text()
    workers = re.search(r"^TEST_WORKERS \?= (\d+)$", makefile, re.MULTILINE)
    command = re.search(r"^pytest: .*\n\t\$\(BIN\)/python -m pytest (.*)$", makefile, re.MULTILINE)
    assert workers, "the Makefile's TEST_WORKERS default moved"
    assert command, "the Makefile's pytest target moved"
    return command.group(1).replace("$(TEST_WORKERS)", workers.group(1)).split()


# Eight files of one whole-loop test and five quick ones each.
TEST_FILE = """
import time
from conftest import WHOLE_LOOP

@WHOLE_LOOP
def test_whole_loop():
    time.sleep(0.3)

""" + "".join(f"def test_quick_{n}():\n    time.sleep(0.05)\n\n" for n in range(5))


def test_whole_loop_tests_run_first_on_one_worker_and_each_file_on_one_worker(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name in "abcdefgh":
        (suite / f"test_{name}.py").write_text(TEST_FILE)
    ran = tmp_path / "ran.log"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *makefile_pytest_options(), "-p", "no:cacheprovider"],
        cwd=suite,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{suite}", "RAN_LOG": str(ran)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    workers_by_group: dict[str, set[str]] = defaultdict(set)
    order_by_worker: dict[str, list[str]] = defaultdict(list)
    for line in ran.read_text().splitlines():
        worker, nodeid = line.split(" ", 1)
        group = "whole-loop" if "whole_loop" in nodeid else nodeid.split("::")[0]
        workers_by_group[group].add(worker)
        order_by_worker[worker].append(nodeid)
    assert sum(len(ids) for ids in order_by_worker.values()) == 8 * 6  # every test ran, once
    assert len(order_by_worker) == 2, order_by_worker  # both workers had work
    assert {group: len(workers) for group, workers in workers_by_group.items()} == dict.fromkeys(
        ["whole-loop", *(f"test_{name}.py" for name in "abcdefgh")], 1
    ), workers_by_group
    (loop_worker,) = workers_by_group["whole-loop"]
    assert ["whole_loop" in nodeid for nodeid in order_by_worker[loop_worker][:8]] == [True] * 8  # and first
