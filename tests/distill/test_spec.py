"""The reward spec: the default loads, the hash is canonical and stable, and bad files say everything at once."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from distill.errors import InvalidRewardSpec
from distill.spec import WINDOW_KIND_BY_EVENT_TYPE, RewardSpec, load_spec, parse_spec
from ingest.events import FEEDBACK_TYPES

ROOT = Path(__file__).resolve().parents[2]


def default_data() -> dict[str, Any]:
    """The default spec as plain data, to edit in a test."""
    return load_spec().model_dump(mode="json")


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")  # JSON is YAML
    return path


def test_default_spec_loads() -> None:
    spec = load_spec()
    assert spec.version == "2026-12-1"
    assert spec.weights.accepted == 0.75
    assert spec.weights.invalid_tool_call < 0
    assert spec.clip == (-2.0, 2.0)
    assert spec.windows_s.suggestion == 60
    assert spec.windows_s.longest == 3600
    assert spec.guards.max_samples_per_session > 0
    assert load_spec(ROOT / "distill" / "specs" / "default.yaml") == spec


def test_every_feedback_type_has_a_window() -> None:
    assert set(WINDOW_KIND_BY_EVENT_TYPE) == set(FEEDBACK_TYPES)
    spec = load_spec()
    assert all(spec.windows_s.for_event_type(kind) is not None for kind in FEEDBACK_TYPES)
    assert spec.windows_s.for_event_type("session.ended") is None


def test_hash_is_sha256_of_canonical_json() -> None:
    spec = load_spec()
    canonical = spec.canonical_json()
    assert b" " not in canonical
    assert b"\n" not in canonical
    assert canonical == json.dumps(json.loads(canonical), sort_keys=True, separators=(",", ":")).encode()
    assert spec.spec_hash == hashlib.sha256(canonical).hexdigest()
    assert load_spec().spec_hash == spec.spec_hash


FIXED: dict[str, Any] = {
    "version": "fixed-1",
    "weights": {
        "accepted": 0.75,
        "rejected": -0.25,
        "dismissed": 0,
        "silent": 0.0,
        "edit_persisted": 1,
        "edit_reverted": -1.0,
        "followup_dissatisfied": -0.5,
        "followup_rephrase": -0.25,
        "rating_up": 0.5,
        "rating_down": -0.5,
        "tests_passed": 0.5,
        "tests_failed": -0.5,
        "invalid_tool_call": -1.0,
        "deferral": -0.1,
    },
    "clip": [-2, 2],
    "windows_s": {"suggestion": 60, "edit": 600, "followup": 300, "rating": 3600, "tests": 1800, "tool": 300},
    "surface_normalisation": {"ide.tab": {"scale": 0.5}},
    "guards": {"max_samples_per_user_per_window": 200, "user_window_s": 3600, "max_samples_per_session": 500},
}


def test_hash_of_a_fixed_spec_never_changes() -> None:
    # Pinned: a change here would give every sample a new id. Change it only on purpose.
    spec = RewardSpec.model_validate(FIXED)
    assert spec.canonical_json() == (
        b'{"clip":[-2.0,2.0],"guards":{"max_samples_per_session":500,"max_samples_per_user_per_window":200,'
        b'"user_window_s":3600},"surface_normalisation":{"ide.tab":{"offset":0.0,"scale":0.5}},'
        b'"version":"fixed-1","weights":{"accepted":0.75,"deferral":-0.1,"dismissed":0.0,"edit_persisted":1.0,'
        b'"edit_reverted":-1.0,"followup_dissatisfied":-0.5,"followup_rephrase":-0.25,"invalid_tool_call":-1.0,'
        b'"rating_down":-0.5,"rating_up":0.5,"rejected":-0.25,"silent":0.0,"tests_failed":-0.5,"tests_passed":0.5},'
        b'"windows_s":{"edit":600,"followup":300,"rating":3600,"suggestion":60,"tests":1800,"tool":300}}'
    )
    assert spec.spec_hash == "be228249b506d823e9e6a5d81ccc20e395b63ac121acd711e48eb418a1d94d42"


def test_hash_is_the_same_in_another_process() -> None:
    code = "from distill.spec import load_spec; print(load_spec().spec_hash)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60, cwd=ROOT, env=env
    )
    assert result.stdout.strip() == load_spec().spec_hash


def test_hash_changes_when_a_weight_changes(tmp_path: Path) -> None:
    data = default_data()
    data["weights"]["rejected"] = -0.3
    assert load_spec(write(tmp_path, data)).spec_hash != load_spec().spec_hash


def test_model_copy_does_not_carry_a_stale_hash() -> None:
    spec = load_spec()
    copied = spec.model_copy(update={"version": "other"})
    assert copied.spec_hash != spec.spec_hash


def test_bad_file_lists_every_problem(tmp_path: Path) -> None:
    data = default_data()
    data["weights"]["accepted"] = "high"
    del data["weights"]["silent"]
    data["weights"]["rejected"] = 0.25  # a lost minus sign
    data["windows_s"]["edit"] = -5
    data["weight_typo"] = 1
    path = write(tmp_path, data)
    with pytest.raises(InvalidRewardSpec) as caught:
        load_spec(path)
    problems = caught.value.problems
    assert len(problems) == 5
    assert caught.value.path == str(path)
    message = str(caught.value)
    assert str(path) in message
    for where in ("weights.accepted", "weights.silent", "weights.rejected", "windows_s.edit", "weight_typo"):
        assert any(p.startswith(where + ":") for p in problems), where
        assert where in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("version: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
        ("", "mapping"),
        ("version: a\nversion: b\n", "version: appears twice"),
    ],
)
def test_unusable_text_is_invalid_reward_spec(text: str, fragment: str) -> None:
    with pytest.raises(InvalidRewardSpec, match=fragment) as caught:
        parse_spec(text, "inline.yaml")
    assert caught.value.path == "inline.yaml"


def test_missing_file_is_invalid_reward_spec(tmp_path: Path) -> None:
    with pytest.raises(InvalidRewardSpec, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("clip", [2.0, -2.0], "must be below"),
        ("clip", [-2.0, 1.5], "clipping would hide the penalty"),
        ("surface_normalisation", {"ide.tab": {"scale": 1.0, "offset": 0.5}}, "on surface ide.tab"),
        ("surface_normalisation", {"ide.tab": {"scale": -1.0}}, "surface_normalisation.ide.tab.scale"),
    ],
)
def test_incoherent_specs_are_refused(tmp_path: Path, field: str, value: object, fragment: str) -> None:
    data = default_data()
    data[field] = value
    with pytest.raises(InvalidRewardSpec, match=fragment):
        load_spec(write(tmp_path, data))


def test_invalid_tool_call_can_never_be_neutral(tmp_path: Path) -> None:
    data = default_data()
    data["weights"]["invalid_tool_call"] = 0.0
    with pytest.raises(InvalidRewardSpec, match=r"weights\.invalid_tool_call"):
        load_spec(write(tmp_path, data))
