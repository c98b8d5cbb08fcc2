"""Checkpoint manifests record the held-out rule their lineage skipped (distill.samples.HeldOutRule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from distill.samples import HeldOutRule
from learner.checkpoint import check_lineage_held_out, write_base_checkpoint
from learner.manifest import (
    MANIFEST_FILE,
    MANIFEST_SCHEMA_VERSION,
    CheckpointManifest,
    ManifestError,
    read_manifest,
    verify_checkpoint,
)
from learner.state import StateError


def test_the_base_manifest_records_the_rule_and_a_schema_1_manifest_still_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LIVELOOP_HELD_OUT_PERCENT", "30")
    base = write_base_checkpoint(tmp_path, "held-out-test")
    manifest = verify_checkpoint(base)
    assert (manifest.schema_version, manifest.held_out) == (MANIFEST_SCHEMA_VERSION, HeldOutRule(percent=30))
    assert write_base_checkpoint(tmp_path / "other", "held-out-test", held_out=HeldOutRule(percent=5)) != base
    assert read_manifest(tmp_path / "other" / "checkpoints" / "held-out-test-v00001").held_out == HeldOutRule(percent=5)

    # Written before the rule was recorded: still readable (hot-swap can load it), with no rule to match.
    old = json.loads((base / MANIFEST_FILE).read_text())
    old["schema_version"] = 1
    del old["held_out"]
    (base / MANIFEST_FILE).write_text(json.dumps(old))
    assert read_manifest(base).held_out is None
    # A current manifest must say which split its lineage skipped.
    with pytest.raises(ValidationError, match="records its held_out rule"):
        CheckpointManifest.model_validate({**old, "schema_version": 2})
    (base / MANIFEST_FILE).write_text(json.dumps({**old, "schema_version": 2}))
    with pytest.raises(ManifestError, match="held_out"):
        read_manifest(base)


def test_a_lineage_is_not_continued_under_another_split(tmp_path: Path) -> None:
    """Its weights hold what its ancestors trained on: after a change of share, part of the new split."""
    base = read_manifest(write_base_checkpoint(tmp_path, "held-out-test", held_out=HeldOutRule(percent=10)))
    trained = base.model_copy(
        update={"policy_version": 3, "checkpoint_id": "held-out-test-v00003", "parent_id": base.checkpoint_id}
    )
    check_lineage_held_out(base, HeldOutRule(percent=20))  # the base trained on nothing
    check_lineage_held_out(trained, HeldOutRule(percent=10))
    check_lineage_held_out(trained.model_copy(update={"held_out": None, "schema_version": 1}), HeldOutRule(percent=20))
    with pytest.raises(StateError, match=r"held-out-test-v00003 was trained with held-out split 10 % .* skips 20 %"):
        check_lineage_held_out(trained, HeldOutRule(percent=20))
