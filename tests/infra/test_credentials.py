"""The dev credential file: made once with mode 0600, stable afterwards, refused when readable by others."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from infra.credentials import DEFAULT_TENANT, ensure_credentials, load_credentials
from infra.errors import CredentialsError


def test_made_once_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "state" / "credentials.json"
    first = ensure_credentials(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_credentials(path) == first
    assert first.viewer_key is not None
    keys = {first.ingest_keys[DEFAULT_TENANT], first.gateway_key, first.operator_key, first.viewer_key}
    assert len({k.get_secret_value() for k in keys}) == 4
    # Secrets never show in a repr (and so in a log line or a traceback).
    assert first.gateway_key.get_secret_value() not in repr(first)


def test_a_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    ensure_credentials(path)
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="chmod 600"):
        load_credentials(path)


def test_a_file_from_before_the_viewer_key_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    old = json.loads(ensure_credentials(path).to_json())
    del old["viewer_key"]
    path.write_text(json.dumps(old))
    assert load_credentials(path).viewer_key is None
