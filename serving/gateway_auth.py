"""The gateway's Bearer key: ``Authorization: Bearer <gateway key>`` on every ``/v1`` request.

The key is ``DevCredentials.gateway_key`` from the credential file (:func:`infra.credentials.load_credentials`),
the same file the ingest API reads its keys from. The comparison takes constant time, so the time
an answer takes does not tell how much of a guessed key was right.
"""

from __future__ import annotations

import hmac

from pydantic import SecretStr


class GatewayKey:
    """Checks a request's ``Authorization`` header against the gateway key."""

    def __init__(self, key: SecretStr) -> None:
        self._key = key.get_secret_value().encode("utf-8")

    def accepts(self, authorization: str | None) -> bool:
        """True when the header is ``Bearer <the key>``; an empty configured key accepts nothing."""
        if not authorization or not self._key:
            return False
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return False
        # Starlette decodes header bytes as latin-1, so this gives back exactly the bytes that were sent.
        return hmac.compare_digest(token.encode("latin-1", errors="replace"), self._key)
