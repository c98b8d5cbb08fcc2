"""Reading the gate's typed configuration files (policy, regression suite) from YAML or JSON."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any


def read_document(path: Path) -> Any:
    """The parsed content of a ``.yaml``/``.yml`` (safe loader) or JSON file; OSError/ValueError if unreadable."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        # Imported by name: PyYAML ships no type stubs, and only this reader needs it.
        yaml: Any = importlib.import_module("yaml")
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from exc
    return json.loads(text)
