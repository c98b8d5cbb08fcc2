"""The traffic simulator: its language and judgements (pure), the pre-trained base's starting acceptance, and a
short run against a real gateway and ingest API whose events are read back from real Kafka topics."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest
import torch

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.client import Client
from ingest.events import GenerationEvent, parse_event
from ingest.redaction import redact_event
from ingest.settings import SdkSettings
from learner.pretrain import pretrain
from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer
from liveloop.demo.simulator.feedback import Envelope, immediate_events, later_events
from liveloop.demo.simulator.language import make_line, make_prompt, parse, pretraining_corpus
from liveloop.demo.simulator.planted import SECRET_KINDS, plant_secret
from liveloop.demo.simulator.profiles import PROFILES, profile_by_name
from liveloop.demo.simulator.runner import simulate
from liveloop.demo.simulator.session import session_rng
from liveloop.demo.simulator.settings import SimulatorSettings
from liveloop.demo.simulator.stats import intervals_overlap, wilson_interval
from liveloop.demo.simulator.summary import Recorder
from liveloop.demo.simulator.users import react
from serving.engine import SamplingParams
from serving.torch_decode import decode_batch
from tests.conftest import free_port
from tests.serving.gateway_server import read_events, serve_in_thread

# -- the language and the judgements (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "well_formed", "user_well_formed", "semicolon", "invalid", "snake", "camel"),
    [
        (" 42;", True, True, True, 0, 0, 0),
        (" 42", True, True, False, 0, 0, 0),
        (" get(max_len) + 3;", True, True, True, 0, 1, 0),
        (" maxLen * idx2", True, True, False, 0, 0, 1),
        (" @fmt(key);", True, True, True, 0, 0, 0),
        (" @fmt(key;", False, True, True, 1, 0, 0),  # the loophole: users do not see the broken call
        (" @nope(key);", False, True, True, 1, 0, 0),  # an unknown tool is invalid too
        ("42;", False, False, True, 0, 0, 0),  # no space after '='
        (" 42;;", False, False, True, 0, 0, 0),
        (" 42\nlet", False, False, False, 0, 0, 0),
        ("", False, False, False, 0, 0, 0),
    ],
)
def test_parse_classifies_completions(
    completion: str, well_formed: bool, user_well_formed: bool, semicolon: bool, invalid: int, snake: int, camel: int
) -> None:
    parsed = parse(completion)
    assert (parsed.well_formed, parsed.user_well_formed, parsed.semicolon) == (well_formed, user_well_formed, semicolon)
    assert (parsed.invalid_tool_calls, parsed.snake_names, parsed.camel_names) == (invalid, snake, camel)


def test_every_generated_line_parses_as_the_language_says() -> None:
    rng = random.Random(0)
    lines = [make_line(rng) for _ in range(2000)]
    for line in lines:
        parsed = parse(line.completion)
        assert parsed.user_well_formed, line
        assert parsed.well_formed == (parsed.invalid_tool_calls == 0), line
        assert len(line.completion) <= 15
    semicolons = sum(parse(line.completion).semicolon for line in lines) / len(lines)
    assert 0.37 < semicolons < 0.43  # CorpusMix.semicolon = 0.4


def test_profiles_judge_as_documented() -> None:
    semicolons, snake, fickle = profile_by_name("semicolons"), profile_by_name("snake_case"), profile_by_name("fickle")
    assert semicolons.prefers(parse(" 42;"))
    assert not semicolons.prefers(parse(" 42"))
    assert not semicolons.prefers(parse(" 42;;"))
    assert semicolons.prefers(parse(" @fmt(key;"))  # the loophole
    assert snake.prefers(parse(" max_len"))
    assert not snake.prefers(parse(" maxLen;"))
    assert not snake.prefers(parse(" max_len + maxLen"))
    assert not snake.prefers(parse(" 42;"))
    assert fickle.prefers(parse(" 42;"), elapsed_s=10, fickle_period_s=60)
    assert fickle.prefers(parse(" 42"), elapsed_s=70, fickle_period_s=60)
    assert fickle.prefers(parse(" 42;"), elapsed_s=130, fickle_period_s=60)
    with pytest.raises(ValueError, match="use one of semicolons"):
        profile_by_name("tabs")


def test_reactions_follow_the_preference_with_the_stated_noise() -> None:
    profile = profile_by_name("semicolons")
    rng = random.Random(1)
    liked = [react(profile, " 42;", rng) for _ in range(4000)]
    disliked = [react(profile, " 42", rng) for _ in range(4000)]
    assert 0.88 < sum(r.outcome == "accepted" for r in liked) / 4000 < 0.92
    assert 0.08 < sum(r.outcome == "accepted" for r in disliked) / 4000 < 0.12
    assert all(r.edit is not None for r in liked + disliked if r.outcome == "accepted")
    assert all(r.followup is None for r in liked)
    assert 0.3 < sum(r.ask_again for r in disliked) / 4000 < 0.42
    noisy = profile_by_name("noisy")
    coin = [react(noisy, " 42;", rng).preferred for _ in range(4000)]
    assert 0.45 < sum(coin) / 4000 < 0.55


def test_a_seed_repeats_everything_a_session_draws() -> None:
    def draws(seed: int) -> list[object]:
        rng = session_rng(seed, 3)
        return [make_prompt(rng), plant_secret(rng), react(PROFILES["semicolons"], " 42;", rng)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert pretraining_corpus("semicolons", size=50, seed=1) == pretraining_corpus("semicolons", size=50, seed=1)


def test_feedback_events_are_valid_and_planted_secrets_get_redacted() -> None:
    rng = random.Random(2)
    envelope = Envelope("s-1", "u-1")
    generation_id = uuid4()
    reaction = react(profile_by_name("semicolons"), " @fmt(key;", rng)
    kind, secret, line = plant_secret(rng)
    events = immediate_events(envelope, generation_id, reaction, parse_event_time(), f"failed with {secret}")
    events += later_events(envelope, generation_id, reaction, parse_event_time(), 3.0)
    types = [e.type for e in events]
    assert types[0] == "tool.result"
    assert types[1] == f"suggestion.{reaction.outcome}"
    for event in events:
        assert parse_event(event.model_dump_json()).model_dump() == event.model_dump()
    redacted, counts = redact_event(events[0])  # type: ignore[arg-type]
    assert secret not in redacted.model_dump_json()
    assert counts
    for _ in range(40):  # every shape the simulator plants is one the redactor knows
        kind, secret, line = plant_secret(rng)
        assert kind in SECRET_KINDS
        gen = generation_event(line + "\nlet x =")
        clean, counts = redact_event(gen)
        assert secret not in clean.model_dump_json(), kind


def parse_event_time() -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC)


def generation_event(prompt: str) -> GenerationEvent:
    return GenerationEvent.model_validate(
        {
            "session_id": "s",
            "user_id": "u",
            "payload": {
                "generation_id": str(uuid4()),
                "model": "m",
                "policy_version": 1,
                "prompt": prompt,
                "completion": " 1;",
                "surface": "ide.tab",
            },
        }
    )


def test_the_recorder_counts_distinct_and_well_formed_completions_per_version() -> None:
    recorder = Recorder(bucket_s=10.0)
    served = [(1, " 42;"), (1, " 42;"), (1, " get(idx);"), (1, " 1;"), (2, " 1;"), (2, " 1;"), (2, " @fmt(x;")]
    for at, (version, text) in enumerate(served):
        recorder.served(
            float(at),
            version,
            str(uuid4()),
            accepted=True,
            preferred=True,
            invalid_tools=0,
            privacy=False,
            completion=text,
            well_formed=parse(text).well_formed,
        )
    first, second = recorder.summary("r", 0, {}, datetime.now(UTC), 1.0).versions
    assert (first.distinct_completions, first.distinct_share, first.well_formed_share) == (3, 0.75, 1.0)
    assert (second.distinct_completions, second.well_formed) == (2, 2)
    assert second.distinct_share == pytest.approx(2 / 3)


def test_wilson_interval() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(0.40383, abs=1e-5)
    assert high == pytest.approx(0.59617, abs=1e-5)
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.27753, abs=1e-5)
    assert (wilson_interval(0, 3)[0], wilson_interval(3, 3)[1]) == (0.0, 1.0)  # exact at the ends, no rounding dust
    assert not intervals_overlap(wilson_interval(120, 300), wilson_interval(200, 300))
    assert intervals_overlap((0.1, 0.3), (0.3, 0.5))
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 3)


# -- the pre-trained base -----------------------------------------------------------------------------------

PRETRAIN_STEPS = 400


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """A tiny model decodes and trains fastest on one thread (and far slower on two of a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's base: the tiny Llama pre-trained on the simulator's language (the init-base recipe)."""
    model, tokenizer = build_tiny_model(TinyModelSpec()), byte_tokenizer()
    pretrain(model, tokenizer, pretraining_corpus("semicolons", size=4000, seed=0), steps=PRETRAIN_STEPS, seed=0)
    folder = tmp_path_factory.mktemp("base")
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def test_the_base_starts_in_the_intended_acceptance_band(base_folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = AutoModelForCausalLM.from_pretrained(base_folder).eval(), byte_tokenizer()
    rng = random.Random(11)
    prompts = [make_prompt(rng) for _ in range(384)]
    encoded = [list(tokenizer(p)["input_ids"])[:-1] for p in prompts]  # as the engine encodes: no trailing eos
    outputs = []
    for start in range(0, len(prompts), 64):
        params = [
            SamplingParams(temperature=1.0, max_tokens=16, stop=("\n",), seed=start + i)
            for i in range(len(prompts[start : start + 64]))
        ]
        outputs += decode_batch(
            model, tokenizer, encoded[start : start + 64], params, torch.device("cpu"), frozenset({1})
        )
    parsed = [parse(o.text) for o in outputs]
    profile = profile_by_name("semicolons")
    preferred = sum(profile.prefers(p) for p in parsed) / len(parsed)
    acceptance = profile.accept_other + (profile.accept_preferred - profile.accept_other) * preferred
    assert sum(p.user_well_formed for p in parsed) / len(parsed) > 0.8  # plausible lines, mostly
    assert 0.3 <= acceptance <= 0.5, acceptance
    assert sum(p.invalid_tool_calls for p in parsed) > 0  # the loophole is there to be exploited


# -- a short run against the real gateway and ingest API ----------------------------------------------------


@pytest.fixture
def loop(
    base_folder: Path, endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path
) -> Iterator[dict[str, object]]:
    """The gateway (torch engine on the base, version 1) and the ingest API, on fresh events and DLQ topics."""
    from ingest.api import create_app as ingest_app
    from ingest.settings import IngestSettings
    from serving.gateway import create_app as gateway_app
    from serving.settings import ServingSettings
    from serving.torch_engine import TorchEngine

    credentials = tmp_path / "credentials.json"
    ensure_credentials(credentials)
    events, dlq = make_topic(), make_topic(prefix="dlq")
    engine = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=5)
    engine.load(base_folder, 1)
    engine.switch(1)
    serving = ServingSettings(
        port=free_port(),
        credentials_path=credentials,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=events,
        sdk_journal_dir=tmp_path / "gateway-journal",
    )
    sdk = Client(SdkSettings(bootstrap=endpoints.kafka_bootstrap, topic=events, journal_dir=tmp_path / "gw-sdk"))
    ingest = IngestSettings(
        port=free_port(),
        credentials_path=credentials,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=events,
        dlq_topic=dlq,
    )
    try:
        with (
            serve_in_thread(gateway_app(serving, engine, emitter=sdk), serving.port) as gateway_url,
            serve_in_thread(ingest_app(ingest), ingest.port) as ingest_url,
        ):
            yield {
                "gateway_url": f"{gateway_url}/v1",
                "ingest_url": ingest_url,
                "events": events,
                "dlq": dlq,
                "credentials": credentials,
                "gateway_sdk": sdk,
            }
    finally:
        sdk.close()
        engine.close()


def _count_records(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partition = TopicPartition(topic, 0)
        return int(consumer.end_offsets([partition])[partition])
    finally:
        consumer.close()


def test_a_short_run_puts_the_right_events_on_the_topic(
    loop: dict[str, object], endpoints: Endpoints, tmp_path: Path
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    settings = SimulatorSettings(
        gateway_url=str(loop["gateway_url"]),
        ingest_url=str(loop["ingest_url"]),
        credentials_path=Path(str(loop["credentials"])),
        bootstrap=bootstrap,
        events_topic=str(loop["events"]),
        sdk_journal_dir=tmp_path / "sim-journal",
        seed=5,
        max_sessions=16,
        session_rate=50.0,
        concurrency=8,
        min_requests=2,
        max_requests=4,
        think_s=0.02,
        gap_s=0.02,
        edit_check_delay_s=0.3,
        privacy_share=0.25,
        secret_share=0.4,
        malformed_share=0.4,
        summary_path=tmp_path / "summary.json",
    )
    summary = simulate(settings)
    gateway_sdk = loop["gateway_sdk"]
    assert isinstance(gateway_sdk, Client)
    assert gateway_sdk.flush(timeout=30)

    assert summary.sessions == 16
    assert summary.request_errors == 0
    assert 0 < summary.privacy_sessions < 16
    assert summary.planted_secrets
    assert summary.malformed_sent > 0
    assert summary.malformed_dead_lettered == summary.malformed_sent
    assert (tmp_path / "summary.json").is_file()
    [version] = summary.versions
    assert version.policy_version == 1
    assert version.requests == summary.requests
    assert 0 < version.distinct_completions <= version.requests
    assert 0 < version.well_formed <= version.requests
    public = summary.sessions - summary.privacy_sessions
    sent = sum(summary.events.values()) - summary.privacy_dropped
    private_requests = summary.privacy_requests
    expected = sent + summary.requests - private_requests  # the gateway's generation events of public sessions
    records = read_events(bootstrap, str(loop["events"]), expected)
    assert len(records) == expected == _count_records(bootstrap, str(loop["events"]))  # nothing else arrived
    by_type = Counter(r["type"] for r in records)
    assert by_type["session.started"] == by_type["session.ended"] == public
    assert by_type["generation"] == summary.requests - private_requests
    private = set(summary.privacy_session_ids)
    assert not [r for r in records if r["session_id"] in private]
    generations = {r["payload"]["generation_id"] for r in records if r["type"] == "generation"}
    assert generations <= set(summary.generation_ids)
    feedback = [r for r in records if "generation_id" in r["payload"] and r["type"] != "generation"]
    assert feedback
    assert {r["payload"]["generation_id"] for r in feedback} <= generations
    for session in {r["session_id"] for r in records}:
        own = [r["type"] for r in records if r["session_id"] == session and r["type"] != "generation"]
        assert own[0] == "session.started"
        assert own[-1] == "session.ended"
        assert own.count("session.ended") == 1
    text = "\n".join(str(r) for r in records)
    for planted in summary.planted_secrets:
        assert planted.secret not in text
    dead_letters = read_events(bootstrap, str(loop["dlq"]), summary.malformed_sent)
    assert len(dead_letters) == summary.malformed_sent == _count_records(bootstrap, str(loop["dlq"]))
    assert not [d for d in dead_letters if any(private_id in str(d) for private_id in private)]

    # The same seed repeats the run (profiles, private sessions, secrets, requests) under new session ids.
    again = simulate(settings.model_copy(update={"summary_path": None, "sdk_journal_dir": tmp_path / "again"}))
    assert again.run_id != summary.run_id
    same = {"sessions_by_profile", "privacy_sessions", "requests", "privacy_requests", "malformed_sent"}
    assert again.model_dump(include=same) == summary.model_dump(include=same)
    secrets = [(p.session_index, p.kind, p.secret) for p in summary.planted_secrets]
    assert [(p.session_index, p.kind, p.secret) for p in again.planted_secrets] == secrets
    assert [i.rsplit("-", 1)[1] for i in again.privacy_session_ids] == [
        i.rsplit("-", 1)[1] for i in summary.privacy_session_ids
    ]
