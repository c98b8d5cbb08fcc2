"""The torch engine on the tiny model: batching, logprobs, sampling, stops, hot-swap, refused loads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from learner.tiny_model import TinyModelSpec, byte_tokenizer, save_tiny_model
from serving.engine import Generation, LoadFailed, SamplingParams, UnknownVersion
from serving.errors import InvalidRequest, NotReady
from serving.torch_decode import BatchRun, decode_batch
from serving.torch_engine import TorchEngine
from serving.torch_load import load_version

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
PROMPTS = ["def add(a, b):", "The quick brown fox jumps over", "x", "SELECT * FROM users WHERE id = "]


@pytest.fixture
def engine(folders: dict[str, Path]) -> Iterator[TorchEngine]:
    """A CPU engine serving version 1, batching up to 8 rows that arrive within 20 ms."""
    engine = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=20)
    engine.load(folders["v1"], 1)
    yield engine
    engine.close()


def _reference_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _forward_logits(model: Any, generation: Generation) -> torch.Tensor:
    """Logits that predicted each completion token, from one forward pass over prompt + completion."""
    ids = torch.tensor([generation.prompt_token_ids + generation.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(generation.prompt_token_ids) - 1
    return logits[start : start + len(generation.token_ids)]


def test_a_batch_gives_the_same_tokens_as_one_request_at_a_time(engine: TorchEngine) -> None:
    batched = engine.generate(PROMPTS, GREEDY)
    assert engine.largest_batch == len(PROMPTS)  # the prompts of different lengths really shared a batch
    alone = [engine.generate([prompt], GREEDY)[0] for prompt in PROMPTS]
    for together, single in zip(batched, alone, strict=True):
        assert together.token_ids == single.token_ids
        assert together.text == single.text
        assert together.policy_version == 1
        assert together.logprobs == pytest.approx(single.logprobs, abs=1e-4)


def test_concurrent_callers_share_batches_and_get_their_own_results(engine: TorchEngine) -> None:
    alone = {prompt: engine.generate([prompt], GREEDY)[0].token_ids for prompt in PROMPTS}
    results: dict[str, list[int]] = {}
    barrier = threading.Barrier(len(PROMPTS))

    def call(prompt: str) -> None:
        barrier.wait()
        results[prompt] = engine.generate([prompt], GREEDY)[0].token_ids

    threads = [threading.Thread(target=call, args=(prompt,)) for prompt in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == alone
    assert engine.largest_batch > 1


def test_requests_join_a_running_batch_and_decode_as_alone(engine: TorchEngine) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=400)
    long_alone = engine.generate([PROMPTS[0]], long)[0]
    short_alone = [engine.generate([p], GREEDY)[0] for p in PROMPTS[1:]]
    long_result: list[Generation] = []
    long_done = threading.Event()

    def long_request() -> None:
        long_result.extend(engine.generate([PROMPTS[0]], long))
        long_done.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    while engine.pending == 0:
        long_done.wait(0.001)
    joined = engine.generate(PROMPTS[1:], GREEDY)
    finished_before_the_long_one = not long_done.is_set()
    thread.join()
    assert finished_before_the_long_one  # they joined the running batch instead of waiting for it to end
    assert [g.token_ids for g in joined] == [g.token_ids for g in short_alone]
    for together, alone in zip(joined, short_alone, strict=True):
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert long_result[0].token_ids == long_alone.token_ids
    assert long_result[0].logprobs == pytest.approx(long_alone.logprobs, abs=1e-4)


def test_a_batch_that_never_empties_keeps_its_cache_to_what_its_rows_need(folders: dict[str, Path]) -> None:
    """Under a steady stream a batch lives on as rows join and leave; its cache must not grow with its age."""
    loaded = load_version(folders["v1"], 1, lambda: folders["v1"], torch.device("cpu"), torch.float32)
    prompts = [loaded.encode(p) for p in PROMPTS] * 12
    alone = {
        i: decode_batch(loaded.model, loaded.tokenizer, [ids], [GREEDY], torch.device("cpu"), loaded.eos_ids)[0]
        for i, ids in enumerate(prompts[: len(PROMPTS)])
    }
    run = BatchRun(loaded.model, loaded.tokenizer, torch.device("cpu"), loaded.eos_ids)
    waiting = list(enumerate(prompts))
    finished: dict[int, Any] = {}
    widest = 0
    while waiting or run.size:
        if waiting and run.size < 4:  # one row joins whenever there is room: the batch never empties
            key, ids = waiting.pop(0)
            finished.update(run.add([key], [ids], [GREEDY]))
        if run.size:
            finished.update(run.step())
            widest = max(widest, run.mask.shape[1])
    assert len(finished) == len(prompts)
    for key, decoded in finished.items():
        assert decoded.token_ids == alone[key % len(PROMPTS)].token_ids
    # A row needs its prompt and what it generates; 48 joins without trimming grew far past that.
    assert widest <= max(len(p) for p in prompts) + GREEDY.max_tokens + 1


def test_greedy_logprobs_equal_a_forward_pass_of_the_model(engine: TorchEngine, folders: dict[str, Path]) -> None:
    model = _reference_model(folders["v1"])
    for generation in engine.generate(PROMPTS, GREEDY):
        logits = _forward_logits(model, generation)
        expected = torch.log_softmax(logits, dim=-1)
        picked = expected[torch.arange(len(generation.token_ids)), torch.tensor(generation.token_ids)]
        assert generation.token_ids == logits.argmax(dim=-1).tolist()
        assert generation.logprobs == pytest.approx(picked.tolist(), abs=1e-4)
    first = engine.generate([PROMPTS[0]], GREEDY)[0]
    with_eos = byte_tokenizer()(PROMPTS[0])["input_ids"]
    assert with_eos[-1] == 1  # the tokenizer appends eos ...
    assert first.prompt_token_ids == with_eos[:-1] == [b + 3 for b in PROMPTS[0].encode()]  # ... the engine drops it


def test_sampled_logprobs_are_those_of_the_sampling_distribution(engine: TorchEngine, folders: dict[str, Path]) -> None:
    """Temperature and top-p shape the behaviour policy; its logprob of each drawn token is reported."""
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=24, seed=11)
    model = _reference_model(folders["v1"])
    for generation in engine.generate(PROMPTS[:2], params):
        logits = _forward_logits(model, generation)
        for step, token in enumerate(generation.token_ids):
            probs = torch.softmax(logits[step] / 0.7, dim=-1)
            ordered, order = torch.sort(probs, descending=True)
            kept = int(((torch.cumsum(ordered, -1) - ordered) < 0.9).sum())
            nucleus = order[:kept].tolist()
            assert token in nucleus  # never a token outside the top-p nucleus
            expected = float(torch.log(probs[token] / ordered[:kept].sum()))
            assert generation.logprobs[step] == pytest.approx(expected, abs=1e-4)


def test_a_seed_repeats_sampling_and_another_seed_does_not(engine: TorchEngine) -> None:
    def sample(seed: int) -> list[int]:
        return engine.generate([PROMPTS[1]], SamplingParams(temperature=1.0, max_tokens=32, seed=seed))[0].token_ids

    assert sample(5) == sample(5)
    assert sample(5) != sample(6)
    # Repeatable inside a batch of other requests too: each row draws from its own generator.
    params = SamplingParams(temperature=1.0, max_tokens=32, seed=5)
    assert engine.generate([PROMPTS[1], PROMPTS[0], PROMPTS[1]], params)[2].token_ids == sample(5)


def test_max_tokens_and_stop_strings_are_honoured(engine: TorchEngine) -> None:
    short = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=5))[0]
    assert len(short.token_ids) == len(short.logprobs) == 5
    assert short.finish_reason == "length"
    full = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=48))[0]
    assert full.token_ids[:5] == short.token_ids
    # Stop at an ASCII character the completion produces after its third token.
    at = next(i for i, token in enumerate(full.token_ids) if i >= 3 and 3 <= token < 3 + 128)
    stop = chr(full.token_ids[at] - 3)
    expected_text = full.text[: full.text.index(stop)]
    stopped = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=48, stop=(stop,)))[0]
    first = full.token_ids.index(full.token_ids[at])  # the stop character's first appearance
    assert stopped.finish_reason == "stop"
    assert stopped.text == expected_text
    assert stopped.token_ids == full.token_ids[: first + 1]  # tokens keep the one that completed the stop string
    assert stopped.logprobs == pytest.approx(full.logprobs[: first + 1], abs=1e-6)


def test_no_prompts_get_no_generations_at_once(engine: TorchEngine) -> None:
    assert engine.submit([], GREEDY).result(timeout=5) == []


def test_a_prompt_too_long_for_the_context_is_refused(engine: TorchEngine) -> None:
    with pytest.raises(InvalidRequest, match="exceeds the model's context of 1024"):
        engine.generate(["y" * 1000], SamplingParams(max_tokens=64))
    with pytest.raises(InvalidRequest, match="encodes to no tokens"):
        engine.generate([""], GREEDY)


def test_a_row_that_fails_to_decode_fails_only_its_own_caller(engine: TorchEngine) -> None:
    """A row torch refuses inside the batch (a seed past 64 bits, built around the validation the gateway
    does) shares a batch with other callers' rows; they are answered as if decoded alone."""
    alone = {prompt: engine.generate([prompt], GREEDY)[0].token_ids for prompt in PROMPTS}
    broken = SamplingParams.model_construct(**{**GREEDY.model_dump(), "seed": 10**30})
    batches = engine.batches_run
    good = [engine.submit([prompt], GREEDY) for prompt in PROMPTS[:2]]
    bad = engine.submit(["x"], broken)
    good += [engine.submit([prompt], GREEDY) for prompt in PROMPTS[2:]]
    with pytest.raises(ValueError, match="Overflow"):
        bad.result(timeout=60)
    for prompt, future in zip(PROMPTS, good, strict=True):
        assert future.result(timeout=60)[0].token_ids == alone[prompt]
    assert engine.batches_run == batches + 1  # the five requests really shared one batch
    assert engine.pending == 0
    assert engine.generate(["x"], GREEDY)[0].token_ids == alone["x"]  # the batcher serves on


def test_a_request_finishes_on_its_version_when_the_default_switches(
    engine: TorchEngine, folders: dict[str, Path]
) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=600)
    before = engine.generate([PROMPTS[2]], long)[0]
    engine.load(folders["v2"], 2)
    assert engine.loaded_versions == [1, 2]
    assert engine.default_version == 1
    v2_alone = engine.generate([PROMPTS[0]], GREEDY, policy_version=2)[0]
    running: list[Generation] = []
    finished = threading.Event()

    def long_request() -> None:
        running.extend(engine.generate([PROMPTS[2]], long))
        finished.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    while engine.pending == 0:
        finished.wait(0.001)
    engine.switch(2)
    engine.unload(1)  # even unloading its version does not disturb the running request
    switched_while_running = not finished.is_set()
    after = engine.generate([PROMPTS[0]], GREEDY)[0]
    thread.join()
    assert switched_while_running
    assert running[0].policy_version == 1
    assert running[0].token_ids == before.token_ids
    assert after.policy_version == 2
    assert after.token_ids == v2_alone.token_ids
    assert engine.loaded_versions == [2]
    with pytest.raises(UnknownVersion, match="policy version 1 is not loaded"):
        engine.generate([PROMPTS[0]], GREEDY, policy_version=1)


def test_a_checkpoint_with_nan_weights_is_refused_and_the_old_version_serves_on(
    engine: TorchEngine, folders: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    # The serving architecture with other weights: it loads as a copy of v1 (torch_load), checked all the same.
    broken = save_tiny_model(tmp_path / "broken", TinyModelSpec(seed=3))
    weights = load_file(broken / "model.safetensors")
    name = next(n for n in weights if "mlp" in n)
    weights[name][0, 0] = float("nan")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    before = engine.generate(PROMPTS, GREEDY)
    with pytest.raises(LoadFailed, match=f"parameter {name} holds NaN"):
        engine.load(broken, 3)
    with pytest.raises(LoadFailed, match="is not a folder"):
        engine.load(tmp_path / "missing", 4)
    assert engine.loaded_versions == [1]
    assert engine.default_version == 1
    assert [g.token_ids for g in engine.generate(PROMPTS, GREEDY)] == [g.token_ids for g in before]


def test_a_checkpoint_differing_in_weights_alone_loads_as_a_copy_that_decodes_as_a_full_load(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    cpu, f32 = torch.device("cpu"), torch.float32
    serving = load_version(folders["v1"], 1, _no_base, cpu, f32)
    v1_weights = {name: tensor.clone() for name, tensor in serving.model.state_dict().items()}
    copied = load_version(folders["v2"], 2, _no_base, cpu, f32, like=serving)
    full = load_version(folders["v2"], 2, _no_base, cpu, f32)
    assert copied.tokenizer is serving.tokenizer  # the shortcut was taken: nothing was built from files
    assert full.tokenizer is not serving.tokenizer
    reference = _reference_model(folders["v2"]).state_dict()
    assert all(torch.equal(tensor, reference[name]) for name, tensor in copied.model.state_dict().items())
    # The serving version is untouched: the copy shares none of its tensors.
    assert all(torch.equal(tensor, v1_weights[name]) for name, tensor in serving.model.state_dict().items())
    run = [(copied, [copied.encode(p) for p in PROMPTS]), (full, [full.encode(p) for p in PROMPTS])]
    tokens = [decode_batch(v.model, v.tokenizer, ids, [GREEDY] * len(ids), cpu, v.eos_ids) for v, ids in run]
    assert [g.token_ids for g in tokens[0]] == [g.token_ids for g in tokens[1]]
    # Another architecture (or any other file differing) takes the full load.
    wider = save_tiny_model(tmp_path / "wider", TinyModelSpec(seed=1, intermediate_size=256))
    other = load_version(wider, 3, _no_base, cpu, f32, like=serving)
    assert other.tokenizer is not serving.tokenizer
    assert other.model.config.intermediate_size == 256


def _no_base() -> Path:
    raise AssertionError("no adapter is loaded here")


def test_a_copy_loaded_while_a_batch_decodes_leaves_it_and_the_new_version_exact(
    engine: TorchEngine, folders: dict[str, Path]
) -> None:
    # The copy's work runs on the batcher thread between two decode steps: the running request must come
    # out as it does alone, and the new version as a full load of its folder decodes.
    long = SamplingParams(temperature=0.0, max_tokens=600)
    alone = engine.generate([PROMPTS[2]], long)[0]
    cpu, f32 = torch.device("cpu"), torch.float32
    full = load_version(folders["v2"], 2, _no_base, cpu, f32)
    expected = decode_batch(full.model, full.tokenizer, [full.encode(PROMPTS[0])], [GREEDY], cpu, full.eos_ids)[0]
    batches = engine.batches_run
    running = engine.submit([PROMPTS[2]], long)
    while engine.batches_run == batches:  # decoding, not just queued
        time.sleep(0.001)
    engine.load(folders["v2"], 2)
    loaded_while_running = not running.done()
    assert loaded_while_running
    assert running.result()[0].token_ids == alone.token_ids
    assert engine.generate([PROMPTS[0]], GREEDY, policy_version=2)[0].token_ids == expected.token_ids


def test_a_closed_engine_refuses_a_load(folders: dict[str, Path]) -> None:
    engine = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=20)
    engine.load(folders["v1"], 1)
    engine.close()
    with pytest.raises(NotReady, match="closed"):
        engine.load(folders["v2"], 2)
    assert engine.loaded_versions == []


def test_a_lora_adapter_loads_on_top_of_the_base(engine: TorchEngine, folders: dict[str, Path], tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = get_peft_model(_reference_model(folders["v1"]), config)
    adapted.save_pretrained(tmp_path / "adapter")
    engine.load(tmp_path / "adapter", 5)
    base = engine.generate([PROMPTS[1]], GREEDY, policy_version=1)[0]
    lora = engine.generate([PROMPTS[1]], GREEDY, policy_version=5)[0]
    assert lora.policy_version == 5
    assert lora.token_ids != base.token_ids
    logits = _forward_logits(adapted.eval(), lora)
    assert lora.token_ids == logits.argmax(dim=-1).tolist()
    picked = torch.log_softmax(logits, -1)[torch.arange(len(lora.token_ids)), torch.tensor(lora.token_ids)]
    assert lora.logprobs == pytest.approx(picked.tolist(), abs=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_engine_runs_on_cuda(folders: dict[str, Path]) -> None:
    """float32 on the GPU: batched equals alone, logprobs equal the forward pass; bfloat16 (auto) serves too."""
    engine = TorchEngine(device="cuda", dtype="float32", max_batch=8, batch_wait_ms=20)
    try:
        engine.load(folders["v1"], 1)
        batched = engine.generate(PROMPTS, GREEDY)
        assert [g.token_ids for g in batched] == [engine.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
        model = _reference_model(folders["v1"])
        for generation in batched:
            logits = _forward_logits(model, generation)
            picked = torch.log_softmax(logits, -1)[torch.arange(len(generation.token_ids)), generation.token_ids]
            assert generation.logprobs == pytest.approx(picked.tolist(), abs=1e-3)
        sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, seed=4)
        assert (
            engine.generate([PROMPTS[1]], sampled)[0].token_ids == engine.generate([PROMPTS[1]], sampled)[0].token_ids
        )
    finally:
        engine.close()
    half = TorchEngine(device="auto")
    try:
        assert half.dtype == torch.bfloat16
        half.load(folders["v2"], 2)
        out = half.generate(PROMPTS, SamplingParams(temperature=0.7, max_tokens=32, seed=1))
        assert all(len(g.token_ids) == len(g.logprobs) > 0 and max(g.logprobs) <= 0.0 for g in out)
    finally:
        half.close()
