"""Test-session fixtures: one real local stack (Kafka, PostgreSQL, MLflow) for the whole session (one per
pytest-xdist worker under ``make test``), and how ``make test`` spreads the tests over its workers.

The stack lives in a temporary state folder on free ports, so it never collides with a stack a
developer runs with ``liveloop up``. Each test makes its own topics and databases, so tests stay
independent of one another and of the order they run in.
"""

from __future__ import annotations

import os
import random
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from infra.settings import StackSettings, TopicSpec
from infra.stack import Endpoints, Stack
from infra.topics import ensure_topics


def _ephemeral_ports_start() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    return max(min(low, 32768), 16_000)  # at least 6,000 ports to draw from, even on an odd machine


_BELOW_EPHEMERAL = _ephemeral_ports_start()


def _worker_ports() -> range:
    """This test process's own slice of the ports below the ephemeral range.

    ``make test`` runs pytest-xdist workers (processes that know nothing of each other's ports); each draws
    from its own slice, so two workers never hand out the same port. A plain ``pytest`` has the whole range.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    width = (_BELOW_EPHEMERAL - 10_000) // workers
    return range(10_000 + worker * width, 10_000 + (worker + 1) * width)


_OWN_PORTS = _worker_ports()
_PORTS = random.SystemRandom()  # not the seeded `random`: every test would draw the same ports
_HANDED_OUT: set[int] = set()

# A test that runs a whole loop of its own (every service, and a learner training on the CPU) and asserts
# that its training keeps pace: a promotion within a short demo, a checkpoint within its cadence, every
# sample trained before a deadline. `make test` runs two pytest workers; this group keeps all such tests
# on one of them, one after another, so that two of them never share the machine's two cores.
WHOLE_LOOP = pytest.mark.xdist_group("whole-loop")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group every other test by its file, and put the whole-loop tests first.

    A file's tests then run on one worker, in their order, as without xdist: a module-scoped fixture (a
    three-broker cluster, a set of services) starts once. The whole-loop group is the longest stretch of the
    run, so it starts at once on one worker while the other works through the rest (the sort is stable).
    """
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)  # only whole-loop tests have one
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def free_port() -> int:
    """A TCP port nobody listens on right now, and that no outgoing connection will take before it is used.

    ``bind(0)`` hands out a port from the kernel's ephemeral range, the range it also takes each outgoing
    connection's local port from. In the seconds between picking such a port and a service binding it, a
    client connection (to Kafka, say, and held open) could take it, and the service could never start.
    So the port is drawn below that range, and never twice in one test session.
    """
    for _ in range(1000):
        port = _PORTS.randrange(_OWN_PORTS.start, _OWN_PORTS.stop)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))  # every address: free only if no listener holds it on any
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free TCP port between {_OWN_PORTS.start} and {_OWN_PORTS.stop}")


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free TCP ports (as :func:`free_port` draws them), e.g. for a
    multi-broker Kafka whose brokers' ports step from one base."""
    for _ in range(1000):
        base = _PORTS.randrange(_OWN_PORTS.start, _OWN_PORTS.stop - count)
        run = range(base, base + count)
        if _HANDED_OUT.intersection(run):
            continue
        try:
            for port in run:
                with socket.socket() as sock:
                    sock.bind(("", port))
        except OSError:
            continue
        _HANDED_OUT.update(run)
        return base
    raise RuntimeError(f"no {count} consecutive free TCP ports between {_OWN_PORTS.start} and {_OWN_PORTS.stop}")


def stack_settings(state_dir: Path) -> StackSettings:
    """Settings for a private stack in ``state_dir`` on free ports."""
    return StackSettings(
        state_dir=state_dir,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        postgres_port=free_port(),
        mlflow_port=free_port(),
    )


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The session's running stack; stopped and deleted (leaving no process, no files) when the session ends."""
    local = Stack(stack_settings(tmp_path_factory.mktemp("stack")))
    try:
        local.up()
        yield local
    finally:
        local.purge()  # the cluster may live outside the temporary folder (see infra.postgres)


@pytest.fixture(scope="session")
def endpoints(stack: Stack) -> Endpoints:
    return stack.endpoints


@pytest.fixture
def make_topic(endpoints: Endpoints) -> Callable[..., str]:
    """Create a fresh topic with a unique name: ``make_topic(partitions=3)`` returns its name."""

    def create(partitions: int = 1, prefix: str = "test") -> str:
        name = f"{prefix}.{uuid.uuid4().hex[:12]}"
        ensure_topics(endpoints.kafka_bootstrap, [TopicSpec(name=name, partitions=partitions)])
        return name

    return create


@pytest.fixture
def fresh_database(endpoints: Endpoints) -> Iterator[str]:
    """A new, empty database on the session's PostgreSQL; yields its DSN and drops it afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin_dsn = endpoints.dsn("postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield endpoints.dsn(name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
