"""How the simulator reaches the loop: the gateway through the official ``openai`` client, malformed events
through the ingest HTTP API (the SDK validates before sending, so a malformed event can only arrive over HTTP).

The gateway headers name the session, user, tenant and surface of the generation event the gateway emits, and
mark it privacy mode (``X-Liveloop-Privacy-Mode: true``; see :mod:`serving.emission`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from liveloop.demo.simulator.errors import GatewayUnavailable
from serving.turns import HEADERS as TURN_HEADERS


@dataclass(frozen=True)
class Served:
    """One completion as the gateway answered it."""

    text: str
    generation_id: str
    policy_version: int


class GatewayClient:
    """Completions from the gateway, with the liveloop headers and the ``liveloop`` object read back."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=2, timeout=timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until ``/readyz`` (beside ``/v1``) says a version is loaded; :class:`GatewayUnavailable` if not."""
        root = self.base_url.removesuffix("/v1")
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            try:
                response = httpx.get(f"{root}/readyz", timeout=5.0)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise GatewayUnavailable(
                    f"gateway at {root} not ready after {timeout_s:.0f} s ({last}); start it (liveloop up) or "
                    "raise LIVELOOP_SIMULATOR_READY_TIMEOUT_S"
                )
            time.sleep(0.5)

    def complete(
        self,
        prompt: str,
        *,
        session_id: str,
        user_id: str,
        tenant: str,
        surface: str,
        privacy: bool,
        max_tokens: int,
        temperature: float,
        seed: int,
        turn: Mapping[str, str] | None = None,
        task_kind: str | None = None,
    ) -> Served:
        """One completion of ``prompt`` (one line: generation stops at a newline); ``turn`` places it in an agent
        trajectory (:data:`serving.turns.HEADERS`' fields: ``trajectory_id``, ``agent``, ``frozen``, ...);
        ``task_kind`` is the product's label of the task (``X-Liveloop-Task-Kind``; None: the gateway's default)."""
        headers = {
            "X-Liveloop-Session": session_id,
            "X-Liveloop-User": user_id,
            "X-Liveloop-Tenant": tenant,
            "X-Liveloop-Surface": surface,
        }
        headers |= {TURN_HEADERS[name]: value for name, value in (turn or {}).items()}
        if task_kind is not None:
            headers["X-Liveloop-Task-Kind"] = task_kind
        if privacy:
            headers["X-Liveloop-Privacy-Mode"] = "true"
        raw = self.client.completions.with_raw_response.create(
            model=self.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=["\n"],
            seed=seed,
            extra_headers=headers,
        )
        completion = raw.parse()
        body: dict[str, Any] = raw.http_response.json()
        liveloop = body["liveloop"]
        return Served(completion.choices[0].text, str(liveloop["generation_id"]), int(liveloop["policy_version"]))

    def close(self) -> None:
        self.client.close()


class IngestPoster:
    """Posts raw bodies to the ingest HTTP API (``POST /v1/events``) with a tenant's key."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 30.0) -> None:
        self.url = base_url.rstrip("/") + "/v1/events"
        self.client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"})

    def post_malformed(self, body: Any) -> bool:
        """Send one malformed event; True when the API rejected it (so it went to the DLQ)."""
        content = body if isinstance(body, str) else json.dumps(body)
        response = self.client.post(self.url, content=content, headers={"Content-Type": "application/json"})
        return response.status_code in (400, 422)

    def close(self) -> None:
        self.client.close()
