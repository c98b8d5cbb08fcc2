"""The dashboard's session cookies and CSRF tokens: a forged, tampered or expired cookie is no session,
a token of one session is worthless in another, and each key has its role."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infra.credentials import ensure_credentials
from liveloop.dashboard.auth import SessionSigner, role_of_key, valid_name


def test_cookies_round_trip_and_refuse_tampering() -> None:
    signer = SessionSigner(b"k" * 32, max_age_s=60)
    session = signer.new("operator", "olga")
    cookie = signer.dump(session)
    assert signer.load(cookie) == session
    body, mac = cookie.split(".")
    assert signer.load(f"{body}.{'0' * len(mac)}") is None
    forged = SessionSigner(b"x" * 32, max_age_s=60).dump(session)  # signed with another secret
    assert signer.load(forged) is None
    for junk in (None, "", "no-dot", "a.b.c", "!!!.00"):
        assert signer.load(junk) is None


def test_an_expired_session_is_none() -> None:
    signer = SessionSigner(b"k" * 32, max_age_s=60)
    old = signer.new("viewer", "victor")
    stale = type(old)(old.role, old.name, old.session_id, time.time() - 61)
    assert signer.load(signer.dump(stale)) is None


def test_csrf_tokens_belong_to_one_session() -> None:
    signer = SessionSigner(b"k" * 32, max_age_s=60)
    one, other = signer.new("operator", "a"), signer.new("operator", "a")
    assert signer.csrf_ok(one, signer.csrf_token(one))
    assert not signer.csrf_ok(one, signer.csrf_token(other))
    assert not signer.csrf_ok(one, None)
    assert not signer.csrf_ok(one, "")


def test_keys_and_names(tmp_path: Path) -> None:
    creds = ensure_credentials(tmp_path / "credentials.json")
    assert creds.viewer_key is not None
    assert role_of_key(creds, creds.operator_key.get_secret_value()) == "operator"
    assert role_of_key(creds, creds.viewer_key.get_secret_value()) == "viewer"
    assert role_of_key(creds, "llok_wrong") is None
    assert role_of_key(creds, "") is None
    assert valid_name("olga")
    assert not valid_name("")
    assert not valid_name("a\x00b")
    assert not valid_name(" padded ")
    assert not valid_name("x" * 65)
    with pytest.raises(ValueError, match="32 bytes"):
        SessionSigner(b"short", max_age_s=60)
