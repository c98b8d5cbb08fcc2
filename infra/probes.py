"""Cheap health probes shared by the services and components of the stack."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.error
import urllib.request
from typing import Any

from infra.errors import PrerequisiteMissing


def require_program(name: str, debian_package: str, purpose: str) -> str:
    """The program's path, or PrerequisiteMissing with the one line that says what to install."""
    # sbin is often missing from the PATH of a non-login shell, yet runuser lives there.
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        raise PrerequisiteMissing(f"{name} not found: {purpose}; install it with `apt-get install {debian_package}`")
    return path


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout_s: float = 3.0) -> bool:
    """True when a GET of ``url`` (http or https only) answers 2xx."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"health URL must be http(s), got {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (scheme checked above)
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, OSError):
        return False


def http_json(url: str, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """The JSON object a GET of ``url`` (http or https only) answers with, or None if it does not."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"status URL must be http(s), got {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (scheme checked above)
            body = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None
