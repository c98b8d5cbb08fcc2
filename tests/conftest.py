"""Test-session fixtures: one real local stack (Kafka, PostgreSQL, MLflow) for the whole session.

The stack lives in a temporary state folder on free ports, so it never collides with a stack a
developer runs with ``liveloop up``. Each test makes its own topics and databases, so tests stay
independent of one another and of the order they run in.
"""

from __future__ import annotations

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


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
