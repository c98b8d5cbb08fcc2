"""API keys of the HTTP ingest API: ``Authorization: Bearer <key>`` resolves to exactly one tenant.

Keys come from the credential file (:func:`infra.credentials.load_credentials`), one per tenant. The
tenant is decided by the key, never by the request body: an event claiming another tenant is
rejected (see :mod:`ingest.api_batch`), so one tenant's key can never write another tenant's events.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from pydantic import SecretStr


class ApiKeys:
    """The ingest keys of every tenant; :meth:`tenant_for` checks a request's ``Authorization`` header."""

    def __init__(self, keys: Mapping[str, SecretStr]) -> None:
        # Kept as bytes once, so a request costs one compare_digest per tenant and nothing else.
        self._keys = [(tenant, key.get_secret_value().encode("utf-8")) for tenant, key in keys.items()]
        self._keys = [(tenant, key) for tenant, key in self._keys if key]  # an empty key must match nothing

    def __len__(self) -> int:
        return len(self._keys)

    def tenant_for(self, authorization: str | None) -> str | None:
        """The tenant whose key the header carries, or ``None`` when it is missing, malformed or unknown."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        # Starlette decodes header bytes as latin-1, so this gives back exactly the bytes that were sent.
        given = token.encode("latin-1", errors="replace")
        found = None
        # Every key is compared, match or not, so the time taken does not tell which tenant matched.
        for tenant, key in self._keys:
            if hmac.compare_digest(given, key):
                found = tenant
        return found
