"""Access control across the loop: every key of one deployment tried at every door.

One credential file holds two tenants' ingest keys, the gateway key and the operator key. Each door
must open to its own key only, and a refused request must leave no trace:

- the ingest API (in-process, real Kafka): no key, a malformed header, an unknown key, the gateway or
  operator key -> 401 and nothing on the events or dead-letter topic; tenant B's key with an event
  claiming tenant A -> the event is rejected, never on the events topic, and dead-lettered with a
  reason naming the mismatch;
- the gateway (in-process, a tiny CPU model, real Kafka): no key, an ingest key, the operator key ->
  401, the engine generates nothing and no generation event is emitted;
- the operator commands (``liveloop promote/rollback/reject`` through the real Typer app, real
  PostgreSQL, MLflow and Kafka): no key, an ingest key, the gateway key -> refused with a non-zero
  exit, no ``promotions`` row, aliases and the promotions topic unchanged; the operator key -> done,
  and recorded with the actor and reason given.

Every case is a row of the report section ``access-control``. Nothing listening outside 127.0.0.1 is
checked here at the level of the settings (every host field defaults to loopback); the running loop's
sockets are checked by the fault test.
"""

from __future__ import annotations

import ast
import base64
import importlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from infra.registry import CANDIDATE
from infra.stack import Endpoints
from serving.promotion import Promoter, recorded_decision
from tests.reliability.doors import (
    OTHER_TENANT,
    GatewayDoor,
    IngestDoor,
    Keys,
    OperatorDoor,
    gateway_door,
    ingest_door,
    make_credentials,
    operator_door,
)
from tests.reliability.hostile import scratch_database
from tests.reliability.profile import REPO, ReliabilityProfile
from tests.reliability.query_audit import PACKAGES, package_files
from tests.reliability.report import markdown_table, write_section
from tests.topic_reader import read_topic

Row = tuple[str, str, str, str, str]  # door, who, what, expected, got


@pytest.fixture(scope="module")
def matrix(reliability: ReliabilityProfile) -> Iterator[list[Row]]:
    """The rows of the report section, written when the module's tests are done."""
    rows: list[Row] = []
    yield rows
    header = ("door", "who", "what", "expected", "got")
    data = {"cases": [dict(zip(header, row, strict=True)) for row in rows]}
    write_section(reliability, "access-control", data, markdown_table(header, rows))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_credentials(tmp_path_factory.mktemp("access") / "credentials.json")


def headers_for(who: str, keys: Keys) -> str | None:
    """The Authorization header each kind of caller sends."""
    tenant_key = keys.ingest["default"]
    return {
        "no key": None,
        "empty bearer": "Bearer ",
        "basic auth": "Basic " + base64.b64encode(b"user:" + tenant_key.encode()).decode(),
        "key without scheme": tenant_key,
        "unknown key": "Bearer llik_" + uuid.uuid4().hex,
        "ingest key + 1 char": f"Bearer {tenant_key}x",
        "ingest key": f"Bearer {tenant_key}",
        "gateway key": f"Bearer {keys.gateway}",
        "operator key": f"Bearer {keys.operator}",
    }[who]


def an_event(**envelope: Any) -> dict[str, Any]:
    payload = {"generation_id": str(uuid.uuid4()), "thumbs": "up"}
    data = {"event_id": str(uuid.uuid4()), "type": "rating", "session_id": "s-1", "user_id": "u-1", "payload": payload}
    return data | envelope


# --------------------------------------------------------------------------------------------- ingest API


@pytest.fixture(scope="module")
def ingest(endpoints: Endpoints, keys: Keys) -> Iterator[IngestDoor]:
    with ingest_door(endpoints, keys) as door:
        yield door


INGEST_REFUSED = ["no key", "empty bearer", "basic auth", "key without scheme", "unknown key", "ingest key + 1 char"]


@pytest.mark.parametrize("who", [*INGEST_REFUSED, "gateway key", "operator key"])
def test_the_ingest_api_refuses_every_key_but_a_tenants(
    ingest: IngestDoor, keys: Keys, matrix: list[Row], who: str
) -> None:
    before = ingest.sizes()
    response = ingest.post([an_event(), an_event()], headers_for(who, keys))
    got = f"{response.status_code}, topics +{ingest.sizes()[0] - before[0]}/+{ingest.sizes()[1] - before[1]}"
    matrix.append(("ingest API", who, "POST /v1/events (2 events)", "401, topics +0/+0", got))
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert ingest.sizes() == before  # neither an event nor a dead letter


def test_a_tenants_key_writes_its_own_events(ingest: IngestDoor, keys: Keys, matrix: list[Row]) -> None:
    before = ingest.sizes()
    response = ingest.post([an_event(), an_event(tenant="default")], headers_for("ingest key", keys))
    after = ingest.sizes()
    got = f"{response.status_code}, accepted {response.json()['accepted']}, topics +{after[0] - before[0]}"
    matrix.append(("ingest API", "ingest key (default)", "POST 2 own events", "200, accepted 2, topics +2", got))
    assert response.status_code == 200
    assert response.json()["accepted"] == 2
    assert after == (before[0] + 2, before[1])


def test_a_tenants_key_cannot_write_another_tenants_event(ingest: IngestDoor, keys: Keys, matrix: list[Row]) -> None:
    before = ingest.sizes()
    claimed = an_event(tenant="default")
    response = ingest.post(claimed, f"Bearer {keys.ingest[OTHER_TENANT]}")
    after = ingest.sizes()
    letters = [json.loads(r.value) for r in read_topic(ingest.settings.bootstrap, ingest.settings.dlq_topic)]
    mine = [letter for letter in letters if claimed["event_id"].encode() in base64.b64decode(letter["raw_b64"])]
    reason = mine[0]["reason"] if mine else "no dead letter"
    got = f"{response.status_code}, events +{after[0] - before[0]}, DLQ +{after[1] - before[1]}: {reason}"
    expected = "422, events +0, DLQ +1 naming the mismatch"
    matrix.append(("ingest API", f"ingest key ({OTHER_TENANT})", "POST an event of tenant 'default'", expected, got))
    assert response.status_code == 422
    (result,) = response.json()["results"]
    assert (result["status"], result["field"]) == ("rejected", "tenant")
    assert after == (before[0], before[1] + 1)
    assert len(mine) == 1
    assert reason == f"tenant 'default' does not match the API key's tenant '{OTHER_TENANT}'"
    assert mine[0]["tenant"] == OTHER_TENANT


# ------------------------------------------------------------------------------------------------ gateway


@pytest.fixture(scope="module")
def gateway(endpoints: Endpoints, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayDoor]:
    with gateway_door(endpoints, keys, tmp_path_factory.mktemp("gateway")) as door:
        yield door


GATEWAY_CALLS = {
    "POST /v1/completions": ("/v1/completions", {"model": "liveloop-policy", "prompt": "hi", "max_tokens": 3}),
    "POST /v1/chat/completions": (
        "/v1/chat/completions",
        {"model": "liveloop-policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    ),
    "GET /v1/models": ("/v1/models", None),
}


def _call(gateway: GatewayDoor, what: str, authorization: str | None) -> Any:
    path, body = GATEWAY_CALLS[what]
    headers = {"Authorization": authorization} if authorization is not None else {}
    if body is None:
        return gateway.client.get(path, headers=headers)
    return gateway.client.post(path, json=body, headers=headers)


@pytest.mark.parametrize("what", list(GATEWAY_CALLS))
@pytest.mark.parametrize("who", ["no key", "unknown key", "ingest key", "operator key", "basic auth"])
def test_the_gateway_refuses_every_key_but_its_own(
    gateway: GatewayDoor, keys: Keys, matrix: list[Row], who: str, what: str
) -> None:
    generated, emitted = gateway.generated(), gateway.emitted()
    response = _call(gateway, what, headers_for(who, keys))
    new_generations, new_events = gateway.generated() - generated, gateway.emitted() - emitted
    got = f"{response.status_code}, generated +{new_generations:g}, events +{new_events}"
    matrix.append(("gateway", who, what, "401, generated +0, events +0", got))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert (new_generations, new_events) == (0, 0)


def test_the_gateway_key_generates_and_emits(gateway: GatewayDoor, keys: Keys, matrix: list[Row]) -> None:
    generated, emitted = gateway.generated(), gateway.emitted()
    response = _call(gateway, "POST /v1/completions", f"Bearer {keys.gateway}")
    new_generations, new_events = gateway.generated() - generated, gateway.emitted() - emitted
    got = f"{response.status_code}, generated +{new_generations:g}, events +{new_events}"
    matrix.append(("gateway", "gateway key", "POST /v1/completions", "200, generated +1, events +1", got))
    assert response.status_code == 200
    assert (new_generations, new_events) == (1, 1)


# -------------------------------------------------------------------------------------- operator commands


@pytest.fixture(scope="module")
def operator(endpoints: Endpoints, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorDoor]:
    """Model versions 1-3 in MLflow, v1 champion (recorded as the base), v3 the candidate."""
    with scratch_database(endpoints) as dsn:
        door = operator_door(endpoints, keys, dsn, tmp_path_factory.mktemp("versions"), versions=3)
        promoter = Promoter(
            registry=door.registry, dsn=dsn, bootstrap=door.bootstrap, topic=door.topic, model_name=door.model
        )
        promoter.promote(1, actor="liveloop learner init-base", reason="base model")
        door.registry.set_alias(door.model, CANDIDATE, 3)
        yield door


ACTIONS = {
    "promote": ["promote", "2", "--reason", "looks better", "--actor", "mallory"],
    "rollback": ["rollback", "--reason", "undo", "--actor", "mallory"],
    "reject": ["reject", "3", "--reason", "spite", "--actor", "mallory"],
}
OPERATOR_REFUSED = {  # who -> (--key value or None, LIVELOOP_OPERATOR_KEY value or None, expected exit code)
    "no key": (None, None, 2),
    "empty --key": ("", None, 2),
    "ingest key": ("ingest", None, 3),
    "ingest key in env": (None, "ingest", 3),
    "gateway key": ("gateway", None, 3),
    "unknown key": ("llok_" + "x" * 43, None, 3),
}


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("who", list(OPERATOR_REFUSED))
def test_operator_actions_refuse_every_key_but_the_operators(
    operator: OperatorDoor, keys: Keys, matrix: list[Row], who: str, action: str
) -> None:
    given, in_env, code = OPERATOR_REFUSED[who]
    real = {"ingest": keys.ingest["default"], "gateway": keys.gateway}
    key_args = [] if given is None else ["--key", real.get(given, given)]
    before = operator.state()
    exit_code, output = operator.run(ACTIONS[action] + key_args, env_key=real.get(in_env or "", in_env))
    changed = operator.state() != before
    got = f"exit {exit_code}, {'CHANGED' if changed else 'nothing changed'}"
    matrix.append(("operator CLI", who, f"liveloop {action}", f"exit {code}, nothing changed", got))
    assert exit_code == code, output
    assert "operator key" in output
    assert not changed, (before, operator.state())


def test_operator_actions_with_the_operator_key_are_done_and_recorded(
    operator: OperatorDoor, keys: Keys, matrix: list[Row]
) -> None:
    key = ["--key", keys.operator]
    start = operator.state()
    assert (start["champion"], start["candidate"]) == (1, 3)
    base_id = start["rows"][-1][0]
    steps = [
        ("promote", ["promote", "2", "--reason", "better reward", "--actor", "alice", *key], (2, 3)),
        ("rollback", ["rollback", "--reason", "users complain", "--actor", "bob", *key], (1, 3)),
        ("reject", ["reject", "3", "--reason", "leaks keys", "--actor", "carol", *key], (1, None)),
    ]
    for action, args, (champion, candidate) in steps:
        exit_code, output = operator.run(args)
        state = operator.state()
        got = f"exit {exit_code}, champion v{state['champion']}, candidate {state['candidate']}"
        expected = f"exit 0, champion v{champion}, candidate {candidate}"
        matrix.append(("operator CLI", "operator key", f"liveloop {action}", expected, got))
        assert exit_code == 0, output
        assert (state["champion"], state["candidate"]) == (champion, candidate)
    state = operator.state()
    assert [row[1:] for row in state["rows"] if row[0] > base_id] == [
        ("promote", 1, 2, "alice", "better reward"),
        ("rollback", 2, 1, "bob", "users complain"),
        ("reject", 1, 3, "carol", "leaks keys"),
    ]
    assert state["published"] == start["published"] + 3
    rejected, rolled_back = recorded_decision(state["tags"][3]), recorded_decision(state["tags"][2])
    assert (rejected["status"], rejected["by"], rejected["reason"]) == ("rejected", "carol", "leaks keys")
    assert (rolled_back["status"], rolled_back["by"]) == ("rolled-back", "bob")


# --------------------------------------------------------------------------------------- listening addresses

HOST_FIELD_SUFFIXES = ("host", "_bind")


def host_fields() -> dict[str, object]:
    """``module.Class.field`` -> default, for every host-like field of every settings class in the packages."""
    found: dict[str, object] = {}
    for path in package_files(REPO, PACKAGES):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or not any("Settings" in ast.unparse(b) for b in node.bases):
                continue
            settings_class = getattr(importlib.import_module(module_name), node.name)
            for name, field in settings_class.model_fields.items():
                if name.endswith(HOST_FIELD_SUFFIXES):
                    found[f"{module_name}.{node.name}.{name}"] = field.default
    return found


def test_every_listening_address_defaults_to_loopback(matrix: list[Row]) -> None:
    fields = host_fields()
    for name, default in sorted(fields.items()):
        matrix.append(("settings", name, "default listening address", "127.0.0.1", str(default)))
    assert {
        "infra.settings.StackSettings.host",
        "ingest.settings.IngestSettings.host",
        "ingest.settings.ArchiverSettings.metrics_host",
        "distill.settings.DistillSettings.web_host",
        "learner.settings.LearnerSettings.status_host",
        "serving.settings.ServingSettings.host",
    } <= set(fields)
    assert {name: default for name, default in fields.items() if default != "127.0.0.1"} == {}
    # prometheus_client's start_http_server listens on 0.0.0.0 unless given an address.
    for path in package_files(REPO, PACKAGES):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("start_http_server"):
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                assert any(k.arg == "addr" for k in node.keywords) or len(node.args) > 1, where
