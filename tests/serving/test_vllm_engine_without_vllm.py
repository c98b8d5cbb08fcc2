"""What of the vLLM engine runs where vLLM is not installed (CPU machines, CI): building it imports no
vllm, its version table answers, and loading a model fails with a LoadFailed that says vLLM cannot start."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from serving.engine import LoadFailed, SamplingParams
from serving.errors import NotReady

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")


def test_the_engine_builds_without_vllm_and_refuses_to_load_a_model(folders: dict[str, Path]) -> None:
    from serving.vllm_engine import VllmEngine

    engine = VllmEngine()
    try:
        assert "vllm" not in sys.modules
        assert engine.loaded_versions == []
        with pytest.raises(NotReady, match="no policy version is loaded"):
            _ = engine.default_version
        with pytest.raises(NotReady):
            engine.generate(["x"], SamplingParams(max_tokens=1))
        with pytest.raises(LoadFailed, match=r"vLLM cannot start on .*vllm"):
            engine.load(folders["v1"], 1)
        assert engine.loaded_versions == []
    finally:
        engine.close()
