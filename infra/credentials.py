"""The dev credential file, ``<state_dir>/credentials.json`` (mode 0600), made on the first ``up``.

It holds the API keys the stages check (ingest keys per tenant, the gateway key, the operator key,
the dashboard's read-only viewer key) and the password of the local PostgreSQL superuser. Every
secret is a ``SecretStr`` so that it never shows in a repr, a log line or a traceback.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from infra.errors import CredentialsError

DEFAULT_TENANT = "default"


def _new_key(prefix: str) -> SecretStr:
    # A recognisable prefix tells a leaked key's kind at a glance (and lets scanners find it).
    return SecretStr(f"{prefix}_{secrets.token_urlsafe(32)}")


class DevCredentials(BaseModel):
    """Keys of a local stack. Production deployments provide the same keys through their secret store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ingest_keys: dict[str, SecretStr] = Field(description="Tenant -> ingest API key.")
    gateway_key: SecretStr
    operator_key: SecretStr
    viewer_key: SecretStr | None = Field(
        default=None,
        description="Read-only key of the ops dashboard (None in a file written before it existed: "
        "only the operator key signs in there).",
    )
    postgres_user: str = "liveloop"
    postgres_password: SecretStr

    @classmethod
    def generate(cls) -> DevCredentials:
        """Fresh random keys for a new local stack."""
        return cls(
            ingest_keys={DEFAULT_TENANT: _new_key("llik")},
            gateway_key=_new_key("llgk"),
            operator_key=_new_key("llok"),
            viewer_key=_new_key("llvk"),
            postgres_password=SecretStr(secrets.token_urlsafe(24)),
        )

    def to_json(self) -> str:
        """The file's content, secrets revealed (it is written with mode 0600)."""
        data = {
            "ingest_keys": {t: k.get_secret_value() for t, k in self.ingest_keys.items()},
            "gateway_key": self.gateway_key.get_secret_value(),
            "operator_key": self.operator_key.get_secret_value(),
            "postgres_user": self.postgres_user,
            **({"viewer_key": self.viewer_key.get_secret_value()} if self.viewer_key is not None else {}),
            "postgres_password": self.postgres_password.get_secret_value(),
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def load_credentials(path: Path) -> DevCredentials:
    """Read the credential file, refusing one that other users could read."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError as exc:
        raise CredentialsError(f"{path} does not exist; run `liveloop up` to create it") from exc
    if mode & 0o077:
        raise CredentialsError(f"{path} has mode {mode:o}; run `chmod 600 {path}`")
    try:
        return DevCredentials.model_validate_json(path.read_text(encoding="utf-8"))
    except (ValidationError, OSError) as exc:
        raise CredentialsError(f"{path} is not a valid credential file: {exc}") from exc


def ensure_credentials(path: Path) -> DevCredentials:
    """Load the credential file, creating it with fresh keys (mode 0600) if there is none."""
    if path.exists():
        return load_credentials(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    creds = DevCredentials.generate()
    # O_EXCL + mode at creation: the keys are never readable by others, not even for an instant.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(creds.to_json())
    return creds


def existing_credentials(path: Path) -> DevCredentials:
    """The credential file's keys; when there is none, throw-away keys kept in memory only.

    A folder without a credential file has no stack that could hold keys (``up`` writes the file before
    anything starts), so keys that match nothing let ``status`` and ``down`` look without writing one.
    """
    if path.exists():
        return load_credentials(path)
    return DevCredentials.generate()
