"""Test-session fixtures: one real local stack (Kafka, PostgreSQL, MLflow) for the whole session.

The stack lives in a temporary state folder on free ports, so it never collides with a stack a
developer runs with ``liveloop up``. Each test makes its own topics and databases, so tests stay
independent of one another and of the order they run in.
"""

from __future__ import annotations

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
_PORTS = random.SystemRandom()  # not the seeded `random`: every test would draw the same ports
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port nobody listens on right now, and that no outgoing connection will take before it is used.

    ``bind(0)`` hands out a port from the kernel's ephemeral range, the range it also takes each outgoing
    connection's local port from. In the seconds between picking such a port and a service binding it, a
    client connection (to Kafka, say, and held open) could take it, and the service could never start.
    So the port is drawn below that range, and never twice in one test session.
    """
    below = _BELOW_EPHEMERAL
    for _ in range(1000):
        port = _PORTS.randrange(10_000, below)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))  # every address: free only if no listener holds it on any
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free TCP port between 10000 and {below}")


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free TCP ports (as :func:`free_port` draws them), e.g. for a
    multi-broker Kafka whose brokers' ports step from one base."""
    for _ in range(1000):
        base = _PORTS.randrange(10_000, _BELOW_EPHEMERAL - count)
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
    raise RuntimeError(f"no {count} consecutive free TCP ports between 10000 and {_BELOW_EPHEMERAL}")


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
