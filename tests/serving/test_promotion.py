"""Promote, roll back and reject by operator, through the real CLI, MLflow, PostgreSQL and Kafka.

The history rows, the alias after each step, the MLflow tags and the events on the promotions topic
must be exactly what the operator did; a wrong or missing key changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition
from typer.testing import CliRunner

from infra.credentials import load_credentials
from infra.migrations import migrate
from infra.registry import CANDIDATE, CHAMPION, AliasNotSet, Registry
from infra.stack import Endpoints, Stack
from liveloop.serving_cli import app
from serving.promotion import HistoryRow, Promoter, champion_stack, recorded_decision
from serving.promotions_contract import PromotionEvent, parse_message
from tests.serving.checkpoints import register


def _row(action: str, frm: int | None, to: int | None) -> HistoryRow:
    return HistoryRow(0, action, frm, to, "x", "y")


def test_champion_stack_replays_promotions_and_rollbacks() -> None:
    rows = [_row("promote", None, 1), _row("promote", 1, 2), _row("promote", 2, 3)]
    assert champion_stack(rows) == [1, 2, 3]
    assert champion_stack([*rows, _row("rollback", 3, 2)]) == [1, 2]
    assert champion_stack([*rows, _row("rollback", 3, 2), _row("rollback", 2, 1)]) == [1]
    assert champion_stack([*rows, _row("rollback", 3, 2), _row("promote", 2, 4)]) == [1, 2, 4]
    # History that starts with the alias already set (no base row): the first from_version is kept.
    assert champion_stack([_row("promote", 5, 6)]) == [5, 6]
    # A version rejected after being champion is no rollback target.
    assert champion_stack([*rows, _row("reject", 3, 1)]) == [2, 3]


def _events(bootstrap: str, topic: str) -> list[PromotionEvent]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    found = []
    while consumer.position(tp) < end:
        for records in consumer.poll(timeout_ms=1000).values():
            for record in records:
                assert record.key is not None
                message = parse_message(record.value)
                assert isinstance(message, PromotionEvent)
                assert record.key.decode() == message.model_name
                found.append(message)
    consumer.close()
    return found


def test_operator_promote_rollback_reject_with_exact_history(
    stack: Stack,
    endpoints: Endpoints,
    fresh_database: str,
    make_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    migrate(fresh_database)
    name = f"test-promote-{uuid.uuid4().hex[:8]}"
    for i in range(4):
        folder = tmp_path / f"v{i}"
        folder.mkdir()
        (folder / "weights.bin").write_bytes(f"weights {i}".encode())
        register(endpoints.mlflow_url, folder, name)
    registry = Registry(endpoints.mlflow_url)
    topic = make_topic()
    # The base model's row, as learner.publish.register_base writes it.
    Promoter(
        registry=registry, dsn=fresh_database, bootstrap=endpoints.kafka_bootstrap, topic=topic, model_name=name
    ).promote(1, actor="liveloop learner init-base", reason="base model")
    registry.set_alias(name, CANDIDATE, 4)

    for key, value in {
        "LIVELOOP_OPERATOR_MODEL_NAME": name,
        "LIVELOOP_OPERATOR_DSN": fresh_database,
        "LIVELOOP_OPERATOR_MLFLOW_URL": endpoints.mlflow_url,
        "LIVELOOP_OPERATOR_BOOTSTRAP": endpoints.kafka_bootstrap,
        "LIVELOOP_OPERATOR_PROMOTIONS_TOPIC": topic,
        "LIVELOOP_OPERATOR_CREDENTIALS_PATH": str(stack.settings.credentials_path),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("LIVELOOP_OPERATOR_KEY", raising=False)
    good = load_credentials(stack.settings.credentials_path).operator_key.get_secret_value()
    runner = CliRunner()

    def cli(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.output

    def champion() -> int:
        return int(registry.version_by_alias(name, CHAMPION).version)

    # Refused: no key, a wrong key. Nothing moves, nothing is recorded.
    assert cli("promote", "2", "--reason", "try")[0] == 2
    assert cli("promote", "2", "--reason", "try", "--key", "llok_wrong")[0] == 3
    assert champion() == 1

    assert cli("promote", "2", "--reason", "better reward", "--key", good, "--actor", "alice")[0] == 0
    assert champion() == 2
    monkeypatch.setenv("LIVELOOP_OPERATOR_KEY", good)  # the env var works as well as --key
    assert cli("promote", "3", "--reason", "even better", "--actor", "bob")[0] == 0
    assert champion() == 3
    assert cli("rollback", "--reason", "users complain", "--actor", "carol")[0] == 0
    assert champion() == 2
    code, output = cli("reject", "2", "--reason", "is champion", "--actor", "dave")
    assert code == 1
    assert "rollback" in output
    assert cli("reject", "4", "--reason", "leaks keys", "--actor", "dave")[0] == 0
    code, output = cli("promote", "4", "--reason", "again", "--actor", "eve")
    assert code == 1
    assert "rejected" in output
    assert cli("rollback", "--reason", "back to base", "--actor", "carol")[0] == 0
    assert champion() == 1
    code, output = cli("rollback", "--reason", "nothing left", "--actor", "carol")
    assert code == 1
    assert "no previous champion" in output

    with psycopg.connect(fresh_database) as conn:
        rows = conn.execute(
            "SELECT action, from_version, to_version, actor, reason FROM promotions WHERE model_name = %s ORDER BY id",
            (name,),
        ).fetchall()
    expected = [
        ("promote", None, 1, "liveloop learner init-base", "base model"),
        ("promote", 1, 2, "alice", "better reward"),
        ("promote", 2, 3, "bob", "even better"),
        ("rollback", 3, 2, "carol", "users complain"),
        ("reject", 2, 4, "dave", "leaks keys"),
        ("rollback", 2, 1, "carol", "back to base"),
    ]
    assert rows == expected
    events = _events(endpoints.kafka_bootstrap, topic)
    assert [(e.action, e.from_version, e.to_version, e.actor, e.reason) for e in events] == expected
    assert [e.history_id for e in events] == sorted(e.history_id for e in events)

    tags = {v: registry.client.get_model_version(name, str(v)).tags for v in (1, 2, 3, 4)}
    assert tags[1]["liveloop.status"] == "champion"
    assert tags[2]["liveloop.status"] == "rolled-back"
    assert tags[3]["liveloop.status"] == "rolled-back"
    assert tags[4]["liveloop.status"] == "rejected"
    assert recorded_decision(tags[4]) == {
        "status": "rejected",
        "by": "dave",
        "at": events[4].at.isoformat(),
        "reason": "leaks keys",
        "promotion_id": events[4].history_id,
    }
    with pytest.raises(AliasNotSet):  # rejecting the candidate removes the alias: its canary stops
        registry.version_by_alias(name, CANDIDATE)
