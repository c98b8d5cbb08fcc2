"""The demo's base model: pre-trained on the scenario's corpus, cached across demos, registered as the champion.

Pre-training an agent base takes minutes to tens of minutes on one core (docs/swarm-learnability.md: 1,500
steps, about 10 minutes, for swarm), most of the demo's own length, so a pre-trained base is kept under
``~/.cache/liveloop/base-models/<scenario>-<key>`` (:class:`DemoSettings` ``base_cache_dir``) and copied into
the demo's state on the next run. The key (:func:`recipe_key`) hashes everything the weights depend on: the
scenario, the users' profile (the code corpus depends on it), the pre-training recipe, the model's sizes and
seed, and a fingerprint of the corpus texts themselves, so a change to a task family's corpus (its
``pretraining_corpus``) pre-trains afresh rather than reusing a stale base.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.stack import Stack
from learner.pretrain import PretrainingText
from liveloop.demo.scenarios import Pretraining, Scenario
from liveloop.demo.settings import DemoSettings
from liveloop.profiles import register_base_model

CACHE_KEY_VERSION = 1
"""Bump when the cache's layout or the meaning of a key's fields changes."""
PROMPTED_MARK = b"\xff"
"""Marks a prompted text in the corpus fingerprint: a plain text's 8-byte length never starts with it."""


Origin = Literal["cache", "pretrained", "state"]
"""Where the demo's base came from: the cache, pre-trained by this demo, or already in the demo's state."""


@dataclass(frozen=True)
class DemoBase:
    """The demo's base: its folder in the demo's state, its registered version, where it came from, its cache key."""

    folder: Path
    version: int
    origin: Origin
    key: str


def recipe(scenario: Scenario, profile: str, seed: int, steps: int | None = None) -> dict[str, object]:
    """Everything the base's weights depend on, except the corpus's texts (see :func:`recipe_key`)."""
    p: Pretraining = scenario.pretraining
    return {
        "cache_key_version": CACHE_KEY_VERSION,
        "scenario": scenario.name,
        "profile": profile if p.by_profile else None,
        "seed": seed,
        "corpus_size": p.corpus_size,
        "steps": steps if steps is not None else p.steps,
        "lr": p.lr,
        "batch_size": p.batch_size,
        "max_length": p.max_length,
        "model": p.model.model_copy(update={"seed": seed}).model_dump(),
    }


def corpus_fingerprint(texts: Sequence[PretrainingText]) -> str:
    """sha256 of the corpus texts, each part length-prefixed (so two corpora never hash alike by concatenation);
    a prompted text is marked by a leading byte no length starts with, so it never hashes like a plain one."""
    digest = hashlib.sha256()
    for text in texts:
        if isinstance(text, str):
            parts = [text]
        else:
            digest.update(PROMPTED_MARK)
            parts = [text.prompt, text.completion]
        for part in parts:
            data = part.encode()
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
    return digest.hexdigest()


def recipe_key(recipe_fields: dict[str, object], fingerprint: str) -> str:
    """The cache key of a recipe and its corpus: 16 hex digits of sha256 over both."""
    document = json.dumps({**recipe_fields, "corpus_sha256": fingerprint}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def pretrained_base(scenario: Scenario, profile: str, seed: int, settings: DemoSettings) -> tuple[Path, bool, str]:
    """A folder holding the scenario's pre-trained base, from the cache or pre-trained now (and cached); return
    the folder, whether it came from the cache, and its key. The folder is the cache's own unless caching is
    off (then a fresh temporary one): copy it, never write into it."""
    fields = recipe(scenario, profile, seed, settings.pretrain_steps)
    texts = scenario.pretraining.corpus(profile, scenario.pretraining.corpus_size, seed)
    key = recipe_key(fields, corpus_fingerprint(texts))
    cached = settings.base_cache_dir / f"{scenario.name}-{key}"
    if settings.base_cache and (cached / "config.json").is_file():
        return cached, True, key
    if settings.base_cache:
        settings.base_cache_dir.mkdir(parents=True, exist_ok=True)
    # Pre-trained into a sibling temporary folder and renamed into place: a demo killed mid-way, or two demos at
    # once, never leave a half-written base under the key.
    parent = settings.base_cache_dir if settings.base_cache else None
    work = Path(tempfile.mkdtemp(prefix=f".{scenario.name}-{key}-", dir=parent))
    _pretrain(scenario.pretraining, texts, fields, seed, work)
    (work / "recipe.json").write_text(json.dumps({**fields, "key": key}, indent=2) + "\n", encoding="utf-8")
    if not settings.base_cache:
        return work, False, key
    try:
        os.replace(work, cached)
    except OSError:  # another demo cached the same recipe meanwhile: theirs is as good
        shutil.rmtree(work, ignore_errors=True)
    return cached, False, key


def _pretrain(
    p: Pretraining, texts: Sequence[PretrainingText], fields: dict[str, object], seed: int, into: Path
) -> None:
    from learner.pretrain import pretrain
    from learner.tiny_model import build_tiny_model, byte_tokenizer

    model = build_tiny_model(p.model.model_copy(update={"seed": seed}))
    tokenizer = byte_tokenizer()
    steps = int(fields["steps"])  # type: ignore[call-overload]
    pretrain(
        model, tokenizer, texts, steps=steps, lr=p.lr, batch_size=p.batch_size, seed=seed, max_length=p.max_length,
        threads=1,
    )  # fmt: skip
    model.save_pretrained(into, safe_serialization=True)
    tokenizer.save_pretrained(into)


def prepare_base(
    stack: Stack, scenario: Scenario, profile: str, seed: int, settings: DemoSettings | None = None
) -> DemoBase:
    """Put the scenario's pre-trained base into ``<state>/base-model`` (from the cache, or pre-trained now), then
    make it the lineage's base and first champion (:func:`liveloop.profiles.register_base_model`). The learner
    must start from this folder too (``LIVELOOP_LEARNER_BASE_MODEL``)."""
    settings = settings or DemoSettings()
    target = stack.settings.state_dir.resolve() / "base-model"
    if (target / "config.json").is_file():  # the same demo's stack, restarted: keep the base it registered
        return DemoBase(target, register_base_model(stack, target), origin="state", key="")
    source, cached, key = pretrained_base(scenario, profile, seed, settings)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    if not settings.base_cache:
        shutil.rmtree(source, ignore_errors=True)
    return DemoBase(target, register_base_model(stack, target), origin="cache" if cached else "pretrained", key=key)
