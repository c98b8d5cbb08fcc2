"""Sign-in and sessions: a signed session cookie, a CSRF token per session, and the role of a key.

The cookie holds ``base64(json) "." hex(hmac-sha256)`` of the role, the name the person gave, a random
session id and the time it was issued; nothing is kept on the server, so the dashboard can restart
(with a configured secret) without signing anyone out. Every visitor gets a session, even before
signing in (role ``anonymous``), so that the sign-in form itself carries a CSRF token; signing in
issues a new session id, so a session id planted before sign-in is worthless after it.

The CSRF token is ``hmac(secret, "csrf|" + session id)``: a page of ours can put it in a form, a page
of another site cannot learn it, and the cookie is ``SameSite=Strict`` besides.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from infra.credentials import DevCredentials

Role = Literal["anonymous", "viewer", "operator"]
COOKIE_NAME = "liveloop_dashboard"
_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,64}$")


@dataclass(frozen=True)
class Session:
    """Who is looking: their role, the name they gave at sign-in (recorded as the actor), and the session id."""

    role: Role
    name: str
    session_id: str
    issued_at: float

    @property
    def signed_in(self) -> bool:
        """True for a viewer or an operator."""
        return self.role != "anonymous"

    @property
    def can_act(self) -> bool:
        """Only an operator may promote, roll back or reject."""
        return self.role == "operator"


def role_of_key(credentials: DevCredentials, given: str) -> Role | None:
    """``operator`` or ``viewer`` for the matching key of the credential file, None for any other key."""
    given_bytes = given.encode()
    # Both comparisons always run, in constant time, so the answer's timing says nothing about the key.
    operator = secrets.compare_digest(given_bytes, credentials.operator_key.get_secret_value().encode())
    viewer = credentials.viewer_key is not None and secrets.compare_digest(
        given_bytes, credentials.viewer_key.get_secret_value().encode()
    )
    if operator:
        return "operator"
    if viewer:
        return "viewer"
    return None


def valid_name(name: str) -> bool:
    """A name to record as the actor: 1 to 64 characters, no control characters."""
    return bool(_NAME.match(name)) and name.strip() == name


class SessionSigner:
    """Makes and checks session cookies and CSRF tokens with one secret."""

    def __init__(self, secret: bytes, max_age_s: int) -> None:
        if len(secret) < 32:
            raise ValueError("the session secret must have at least 32 bytes; generate one with secrets.token_hex(32)")
        self._secret = secret
        self.max_age_s = max_age_s

    def new(self, role: Role, name: str = "") -> Session:
        """A fresh session with a new random id."""
        return Session(role=role, name=name, session_id=secrets.token_urlsafe(18), issued_at=time.time())

    def dump(self, session: Session) -> str:
        """The cookie value of ``session``."""
        body = json.dumps({"r": session.role, "n": session.name, "s": session.session_id, "t": session.issued_at})
        encoded = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
        return f"{encoded}.{self._mac('session|' + encoded)}"

    def load(self, cookie: str | None) -> Session | None:
        """The session of a cookie, or None if it is missing, forged, malformed or older than ``max_age_s``."""
        if not cookie or cookie.count(".") != 1:
            return None
        encoded, mac = cookie.split(".")
        if not hmac.compare_digest(mac, self._mac("session|" + encoded)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
            session = Session(
                role=data["r"], name=str(data["n"]), session_id=str(data["s"]), issued_at=float(data["t"])
            )
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None
        if session.role not in ("anonymous", "viewer", "operator"):
            return None
        if not 0 <= time.time() - session.issued_at <= self.max_age_s:
            return None
        return session

    def csrf_token(self, session: Session) -> str:
        """The CSRF token every form of this session carries."""
        return self._mac("csrf|" + session.session_id)

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        """True when ``token`` is this session's CSRF token."""
        return token is not None and hmac.compare_digest(token, self.csrf_token(session))

    def _mac(self, message: str) -> str:
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()
