"""Cheap health probes shared by the services and components of the stack."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


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
