"""Fixtures shared by the serving tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.tiny_model import TinyModelSpec, save_tiny_model


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny models with different weights: policy versions 1 and 2."""
    root = tmp_path_factory.mktemp("models")
    return {
        "v1": save_tiny_model(root / "v1", TinyModelSpec(seed=1)),
        "v2": save_tiny_model(root / "v2", TinyModelSpec(seed=2)),
    }
