"""The registry helper process the gateway's swap controller reads through, against the real MLflow.

- It answers as the registry does: the alias's version, the same files byte for byte, and
  AliasNotSet (the controller's "nothing to serve yet") across the process boundary; it checks a
  checkpoint as the gateway would (its refusals are tested in ``test_swap.py``).
- It runs at a lower CPU priority than its owner (the gateway).
- A helper that dies fails the call with a RegistryError (the controller keeps serving and retries)
  and the next call is answered by a fresh helper; a helper whose owner is SIGKILLed exits.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infra.registry import CANDIDATE, CHAMPION, AliasNotSet, Registry, RegistryError
from infra.stack import Endpoints
from serving.registry_worker import HELPER_NICE, RegistryWorker
from serving.sanity import check_checkpoint
from tests.distill.stream_harness import REPO_ROOT
from tests.serving.checkpoints import register, write_checkpoint


@pytest.fixture
def worker(endpoints: Endpoints) -> Iterator[RegistryWorker]:
    helper = RegistryWorker(endpoints.mlflow_url)
    yield helper
    helper.close()


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _model(endpoints: Endpoints, tmp: Path) -> str:
    name = f"test-helper-{uuid.uuid4().hex[:8]}"
    write_checkpoint(tmp / "p0", model_name=name, policy_version=0, seed=0)
    version = register(endpoints.mlflow_url, tmp / "p0", name)
    Registry(endpoints.mlflow_url).set_alias(name, CHAMPION, version)
    return name


def test_it_answers_as_the_registry_does(endpoints: Endpoints, worker: RegistryWorker, tmp_path: Path) -> None:
    name = _model(endpoints, tmp_path)
    registry = Registry(endpoints.mlflow_url)
    assert worker.alias_version(name, CHAMPION) == registry.alias_version(name, CHAMPION) == 1
    with pytest.raises(AliasNotSet):
        worker.alias_version(name, CANDIDATE)
    folder = worker.download(name, 1, tmp_path / "by-helper")
    assert _digests(folder) == _digests(registry.download(name, 1, tmp_path / "in-process")) != {}
    checked, manifest = worker.download_checked(name, 1, tmp_path / "checked-by-helper")
    assert (_digests(checked), manifest) == (_digests(folder), check_checkpoint(folder))
    (helper,) = worker.helper_pids()
    assert psutil.Process(helper).nice() == min(19, psutil.Process().nice() + HELPER_NICE)


def test_a_dead_helper_fails_one_call_and_a_new_one_answers(
    endpoints: Endpoints, worker: RegistryWorker, tmp_path: Path
) -> None:
    name = _model(endpoints, tmp_path)
    assert worker.alias_version(name, CHAMPION) == 1
    (helper,) = worker.helper_pids()
    os.kill(helper, signal.SIGKILL)
    psutil.Process(helper).wait(timeout=30)
    with pytest.raises(RegistryError, match="helper process died"):
        worker.alias_version(name, CHAMPION)
    assert worker.alias_version(name, CHAMPION) == 1
    assert worker.helper_pids() != [helper]


# Owns a RegistryWorker whose helper has answered once, then waits to be killed.
HOLDER = """
import sys, time
from infra.registry import RegistryError
from serving.registry_worker import RegistryWorker

worker = RegistryWorker(sys.argv[1])
try:
    worker.alias_version(sys.argv[2], "champion")
except RegistryError:
    pass
print("ready", flush=True)
time.sleep(600)
"""


def test_the_helper_exits_when_its_owner_is_killed(endpoints: Endpoints) -> None:
    """A SIGKILLed gateway stops nothing itself: its helper must not live on as an orphan."""
    owner = subprocess.Popen(
        [sys.executable, "-c", HOLDER, endpoints.mlflow_url, f"no-such-model-{uuid.uuid4().hex[:8]}"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "ready"
        children = psutil.Process(owner.pid).children()
        helpers = [p for p in children if "spawn_main" in " ".join(p.cmdline())]  # not multiprocessing's tracker
        assert len(helpers) == 1
        owner.kill()
        owner.wait(timeout=30)
        _, alive = psutil.wait_procs(helpers, timeout=30)
        assert alive == []
    finally:
        owner.kill()
        owner.communicate(timeout=30)  # reaps it and closes its pipe
