"""docs/backend.md as a newcomer's backend uses it: its code, run as written against a real gateway, ingest
API and distiller, joins (one sample, the accepted reward); the mistake of liveloop issue 37 (a completion
requested without a session, its feedback sent under the backend's own) is dead-lettered with a reason
that says what to do, and counted, and the completion left without feedback is counted too."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import pytest

from distill.trajectory import GUARDS
from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.api import IngestSettings
from ingest.api import create_app as ingest_app
from ingest.client import Client, SdkSettings
from ingest.dead_letters import DeadLetter
from learner.tiny_model import TinyModelSpec, save_tiny_model
from serving.gateway import create_app as gateway_app
from serving.settings import ServingSettings
from serving.torch_engine import TorchEngine
from tests.conftest import free_port
from tests.distill.stream_harness import StreamHarness, read_topic, spec_document
from tests.serving.gateway_server import serve_in_thread

DOC = Path(__file__).resolve().parents[2] / "docs" / "backend.md"
# Short windows: a completion without feedback becomes final in seconds rather than an hour.
WINDOWS = {name: 5 for name in ("suggestion", "edit", "followup", "rating", "tests", "tool")}


@dataclass
class Loop:
    gateway_url: str
    ingest_url: str
    credentials: Path
    harness: StreamHarness


@pytest.fixture
def loop(endpoints: Endpoints, fresh_database: str, tmp_path: Path) -> Iterator[Loop]:
    """Gateway (tiny CPU model), ingest API and a distiller worker, on one events topic and one DLQ topic."""
    credentials = tmp_path / "credentials.json"
    ensure_credentials(credentials)
    harness = StreamHarness(
        endpoints.kafka_bootstrap,
        fresh_database,
        tmp_path / "distill",
        spec=spec_document(windows_s=WINDOWS),
        orphan_grace_s=2.0,
        name="backend",
    )
    engine = TorchEngine(device="cpu", max_batch=4, batch_wait_ms=5)
    engine.load(save_tiny_model(tmp_path / "model", TinyModelSpec(seed=7)), 1)
    engine.switch(1)
    serving = ServingSettings(
        port=free_port(),
        credentials_path=credentials,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=harness.events_topic,
        sdk_journal_dir=tmp_path / "gateway-journal",
    )
    sdk = Client(SdkSettings(bootstrap=serving.bootstrap, topic=harness.events_topic, journal_dir=tmp_path / "sdk"))
    ingest = IngestSettings(
        port=free_port(),
        credentials_path=credentials,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=harness.events_topic,
        dlq_topic=harness.dlq_topic,
    )
    try:
        with (
            harness,
            serve_in_thread(gateway_app(serving, engine, emitter=sdk), serving.port) as gateway_url,
            serve_in_thread(ingest_app(ingest), ingest.port) as ingest_url,
        ):
            harness.start()
            harness.wait_ready()
            yield Loop(f"{gateway_url}/v1", ingest_url, credentials, harness)
    finally:
        sdk.close()
        engine.close()


def doc_example() -> str:
    """The Python example of docs/backend.md (its one block that asks the gateway for a completion)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
    [example] = [block for block in blocks if "with_raw_response" in block]
    return str(example)


def distiller_status(harness: StreamHarness) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{harness.web_port}/status", timeout=5) as response:
        status: dict[str, object] = json.loads(response.read())
    return status


@pytest.mark.timeout(600)
def test_the_docs_example_joins_and_feedback_under_another_session_is_dead_lettered(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = loop.harness
    monkeypatch.setenv("LIVELOOP_CREDENTIALS", str(loop.credentials))
    monkeypatch.setenv("LIVELOOP_GATEWAY_URL", loop.gateway_url)
    monkeypatch.setenv("LIVELOOP_INGEST_URL", loop.ingest_url)
    namespace: dict[str, object] = {}
    try:
        exec(compile(doc_example(), str(DOC), "exec"), namespace)  # noqa: S102 (our own documentation)
    finally:
        for client in ("gateway", "ingest"):
            if client in namespace:
                namespace[client].close()  # type: ignore[attr-defined]
    documented = str(namespace["generation_id"])
    assert namespace["session_id"] == "checkout-1234"

    # The backend: no X-Liveloop-Session on the completion, feedback under its own session.
    keys = json.loads(loop.credentials.read_text())
    with openai.OpenAI(base_url=loop.gateway_url, api_key=keys["gateway_key"], max_retries=0) as gateway:
        unnamed = gateway.completions.create(model="liveloop-policy", prompt="def sub(a, b):", max_tokens=8)
    assert unnamed.model_extra is not None
    stray = unnamed.model_extra["liveloop"]["generation_id"]
    filed_under = unnamed.model_extra["liveloop"]["session_id"]
    now = datetime.now(UTC).isoformat()
    wrong = [
        {"type": kind, "ts": now, "session_id": "backend-own", "user_id": "user-42", "payload": payload}
        for kind, payload in (("suggestion.accepted", {"generation_id": stray}), ("session.ended", {}))
    ]
    posted = httpx.post(
        f"{loop.ingest_url}/v1/events",
        json=wrong,
        headers={"Authorization": f"Bearer {keys['ingest_keys']['default']}"},
    )
    assert (posted.status_code, posted.json()["accepted"]) == (200, 2), posted.text  # well-formed, not yet joined

    harness.wait_for_samples(2, timeout=120)
    by_generation = {str(sample.generation_id): sample for sample in harness.samples()}
    assert set(by_generation) == {documented, stray}
    joined = by_generation[documented]
    assert (joined.session_id, joined.reward, joined.finalised_by) == ("checkout-1234", 0.75, "session_end")
    alone = by_generation[stray]
    # No feedback joined it: it earned nothing. The tiny model's text is random, though, and one that ends in a
    # question pays the deferral guard (-0.1 under the default spec), whatever the join.
    assert (alone.session_id, alone.reward, len(alone.source_event_ids)) == (
        filed_under,
        -0.1 if alone.deferral else 0.0,
        1,
    )

    harness.wait_until(
        lambda: harness.metric("liveloop_distill_unjoined_feedback_total") >= 1, 60, "the unjoined feedback"
    )
    [letter] = [DeadLetter.model_validate_json(value) for _, value in read_topic(harness.bootstrap, harness.dlq_topic)]
    assert (letter.source, letter.session_id, letter.tenant) == ("distill", "backend-own", "default")
    assert f"names generation {stray}, which session backend-own never had" in letter.reason
    assert "X-Liveloop-Session" in letter.reason
    assert json.loads(letter.raw())["payload"]["generation_id"] == stray
    assert distiller_status(harness) == {
        "state": "running",
        "unjoined_feedback": 1,
        "generations_without_feedback": 1,
        "agent_guards": {"trajectories": 0, **dict.fromkeys(GUARDS, 0)},
    }
    assert harness.metric("liveloop_distill_generations_without_feedback_total") == 1
