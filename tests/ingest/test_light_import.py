"""The SDK is light: a product backend that imports it does not pull in any stage's heavy dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "faust", "mlflow", "deepspeed", "fastapi", "transformers", "aiokafka", "psycopg", "uvicorn")


def test_importing_the_sdk_imports_nothing_heavy() -> None:
    code = (
        "import json, sys\n"
        "from ingest import Client, parse_event\n"
        "from ingest.settings import SdkSettings, IngestSettings, ArchiverSettings\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(result.stdout) == []
