"""The OpenAI-compatible gateway: completions and chat completions from the engine's policy versions.

Run it with ``python -m serving.gateway`` (settings from ``LIVELOOP_SERVING_*``). Endpoints:

- ``POST /v1/completions``, ``POST /v1/chat/completions``: OpenAI's request and response shapes,
  streamed (``"stream": true``, server-sent events ending with ``data: [DONE]``) or not; the official
  ``openai`` client works unchanged. Every response names its policy version twice: in the body's
  ``liveloop`` object (with the generation ids; see :mod:`serving.openai_responses`) and in the
  ``X-Liveloop-Policy-Version`` header. Every choice is emitted as a ``generation`` event to the
  events topic (see :mod:`serving.emission` for the headers that name session, user, tenant, surface).
  Every response names the session its generations were filed under, the request's
  ``X-Liveloop-Session`` or one the gateway made up: in the ``X-Liveloop-Session`` response header and
  in ``liveloop.session_id``. Feedback joins its generation only when sent under that session.
  Chat completions take OpenAI function ``tools`` and return ``tool_calls`` (:mod:`serving.tool_calls`);
  the ``X-Liveloop-Trajectory`` headers place a request's turns in an agent trajectory, under an
  optional context budget (:mod:`serving.turns`).
- ``GET /v1/models``: the served model.
- ``GET /healthz`` (the process answers), ``GET /readyz`` (a policy version is loaded), ``GET /metrics``.

Every ``/v1`` request needs ``Authorization: Bearer <gateway key>`` (:mod:`serving.gateway_auth`);
errors are OpenAI-style bodies: 400 invalid request, 401 bad key, 404 unknown model, 413 body over
``max_request_bytes``, 503 no version loaded yet, 500 engine failure.

Which version serves a request: ``router(session_id)`` when one is given (the canary), else the
engine's default. One request is served by one version, chosen once when it starts.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Protocol

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from infra.credentials import load_credentials
from serving.emission import EventSink, GenerationEmitter, RequestContext
from serving.engine import Engine, Generation, QueuingEngine, SamplingParams, UnknownVersion
from serving.errors import InvalidRequest, NotReady, ServingError
from serving.gateway_auth import GatewayKey
from serving.gateway_openapi import document_openapi
from serving.metrics import GatewayMetrics
from serving.openai_responses import Choice, Reply, chat_body, chat_chunks, completion_body, completion_chunks
from serving.openai_schema import ChatCompletionRequest, CompletionRequest, error_body, parse_body, render_chat
from serving.request_body import read_limited
from serving.settings import ServingSettings
from serving.turns import BUDGET_HEADER, BudgetCheck, read_answer, read_turn

log = logging.getLogger(__name__)

VERSION_HEADER = "X-Liveloop-Policy-Version"
SESSION_HEADER = "X-Liveloop-Session"
"""Read from the request (the caller's session) and always returned: the session the generations were filed under."""
Router = Callable[[str | None], int | None]
"""``(session_id or None) -> policy version to serve, or None for the engine's default``."""


class Service(Protocol):
    """Something that runs beside the app (the hot-swap controller): started after the app starts
    accepting its lifespan, stopped, in reverse order, when it shuts down. Both calls run in a thread."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class _Failure(ServingError):
    """An answer other than 200, carried out of the request's steps."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(body["error"]["message"])
        self.status, self.body, self.headers = status, body, headers


def create_app(
    settings: ServingSettings,
    engine: Engine,
    *,
    emitter: EventSink,
    router: Router | None = None,
    services: Sequence[Service] = (),
    gateway_key: SecretStr | None = None,
    metrics_registry: CollectorRegistry | None = None,
) -> FastAPI:
    """The gateway app over ``engine``. ``gateway_key`` defaults to the credential file's (read now, fails fast)."""
    key = GatewayKey(gateway_key or load_credentials(settings.credentials_path).gateway_key)
    metrics = GatewayMetrics(metrics_registry)
    events = GenerationEmitter(emitter, settings.model_name, metrics)
    # Engine.generate blocks; with an engine that does not queue requests itself (vLLM), each waiting
    # request holds one of these threads (not the event loop's).
    executor = ThreadPoolExecutor(settings.max_concurrent_requests, thread_name_prefix="liveloop-gateway")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        started: list[Service] = []
        try:
            for service in services:
                await asyncio.to_thread(service.start)
                started.append(service)
            yield
        finally:
            for service in reversed(started):
                await asyncio.to_thread(service.stop)
            executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="liveloop gateway", version="1", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.settings = engine, metrics, settings

    async def run(prompts: list[str], params: list[SamplingParams], version: int) -> list[Generation]:
        """Generate prompts[i] with params[i] on ``version``: one engine call per distinct params, concurrently."""
        loop = asyncio.get_running_loop()
        groups: dict[SamplingParams, list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault(p, []).append(i)
        if isinstance(engine, QueuingEngine):  # answered from the engine's own thread: no thread waits here
            calls = [
                asyncio.wrap_future(engine.submit([prompts[i] for i in idx], p, version)) for p, idx in groups.items()
            ]
        else:
            calls = [
                loop.run_in_executor(executor, engine.generate, [prompts[i] for i in idx], p, version)
                for p, idx in groups.items()
            ]
        out: list[Generation | None] = [None] * len(prompts)
        for idx, results in zip(groups.values(), await asyncio.gather(*calls), strict=True):
            for i, generation in zip(idx, results, strict=True):
                out[i] = generation
        return [g for g in out if g is not None]

    async def serve(prompts: list[str], params: list[SamplingParams], context: RequestContext) -> list[Generation]:
        routed = router(context.session_id) if router is not None else None
        version = routed if routed is not None else engine.default_version
        try:
            return await run(prompts, params, version)
        except UnknownVersion:
            # Unloaded between choosing and starting (a swap); the request goes to the new default.
            log.warning("policy version %d went away before a request started; serving the default", version)
            return await run(prompts, params, engine.default_version)

    async def complete(request: Request, chat: bool) -> Response:
        if not key.accepts(request.headers.get("authorization")):
            raise _Failure(
                401,
                error_body(
                    "missing or wrong API key; send 'Authorization: Bearer <gateway key>'",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
                {"WWW-Authenticate": "Bearer"},
            )
        started = time.perf_counter()
        raw = await read_limited(request, settings.max_request_bytes)
        if raw is None:
            message = (
                f"request body is over this gateway's limit of {settings.max_request_bytes} bytes "
                "(LIVELOOP_SERVING_MAX_REQUEST_BYTES); send a shorter prompt"
            )
            raise _Failure(413, error_body(message, "invalid_request_error", "request_too_large"))
        body: Any = parse_body(ChatCompletionRequest if chat else CompletionRequest, raw)
        if body.model != settings.model_name:
            message = f"model {body.model!r} is not served here; use {settings.model_name!r} (see GET /v1/models)"
            raise _Failure(404, error_body(message, "invalid_request_error", "model_not_found", "model"))
        context = RequestContext.from_headers(request.headers, body.user, settings)
        turn = read_turn(request.headers, body.liveloop)
        prompts = [render_chat(body.messages, body.tools)] if chat else body.prompts()
        max_tokens = (body.token_limit() if chat else body.max_tokens) or settings.default_max_tokens
        if max_tokens > settings.max_tokens_limit:
            raise InvalidRequest(
                f"max_tokens {max_tokens} is over this gateway's limit of {settings.max_tokens_limit}; ask for fewer",
                param="max_tokens",
            )
        if len(prompts) * body.n > settings.max_prompts:
            raise InvalidRequest(
                f"{len(prompts)} prompts x n={body.n} is over this gateway's limit of {settings.max_prompts} choices",
                param="n",
            )
        # Choice k = prompt k // n, sample k % n. With a seed, the n samples of a prompt use seed, seed+1, ...
        # so that they differ yet repeat.
        expanded = [p for p in prompts for _ in range(body.n)]
        params = [
            SamplingParams(
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                max_tokens=max_tokens,
                stop=body.stop_strings(),
                seed=None if body.seed is None else body.seed + k % body.n,
            )
            for k in range(len(expanded))
        ]
        generations = await serve(expanded, params, context)
        latency_ms = (time.perf_counter() - started) * 1000.0
        # The budget is judged on the served prompts' own token counts (a chat request has one prompt; of several
        # completion prompts, the longest).
        context_tokens = max(len(g.prompt_token_ids) for g in generations)
        check = BudgetCheck.of(settings, context_tokens) if turn is not None else None
        tools = body.tool_table() if chat else None
        choices = [
            Choice(g, uuid.uuid4(), read_answer(g.text, g.finish_reason, tools, check) if chat else None)
            for g in generations
        ]
        session = context.session_id or f"gateway-{choices[0].generation_id}"
        for prompt, choice in zip(expanded, choices, strict=True):
            g = choice.generation
            metrics.count_generation(g.policy_version, len(g.prompt_token_ids), len(g.token_ids))
            kind = context.task_kind or ("chat" if chat else "completion")
            recorded = choice.answer.recorded if choice.answer is not None else None
            budget = check.hard if check is not None else None
            place = turn.place(choice.generation_id, len(g.prompt_token_ids), budget) if turn is not None else None
            events.emit(context, session, choice.generation_id, prompt, g, kind, latency_ms, recorded, place)
        prompt_tokens = sum(len(c.generation.prompt_token_ids) for c in choices[:: body.n])
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{choices[0].generation_id.hex}"
        refused = [(i, call) for i, c in enumerate(choices) if c.answer is not None for call in c.answer.refused]
        reply = Reply(
            response_id,
            int(time.time()),
            settings.model_name,
            choices,
            prompt_tokens,
            session,
            turn.trajectory_id if turn is not None else None,
            check.body(refused) if check is not None else None,
        )
        # The session is handed back even when the caller named it: its feedback must be sent under it.
        # Header values go out as latin-1: the UTF-8 bytes of the id, as the caller sent them (emission._header).
        headers = {VERSION_HEADER: str(reply.policy_version), SESSION_HEADER: session.encode().decode("latin-1")}
        if check is not None:
            headers[BUDGET_HEADER] = check.state
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if chat:
            top = body.top_logprobs or 0
            if body.stream:
                chunks = chat_chunks(reply, body.logprobs, top, include_usage)
                return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
            return JSONResponse(chat_body(reply, body.logprobs, top), headers=headers)
        if body.stream:
            chunks = completion_chunks(reply, body.logprobs, include_usage)
            return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
        return JSONResponse(completion_body(reply, body.logprobs), headers=headers)

    async def answer(request: Request, endpoint: str, chat: bool) -> Response:
        started = time.perf_counter()
        metrics.in_flight.inc()
        try:
            response = await complete(request, chat)
        except _Failure as failure:
            response = JSONResponse(failure.body, status_code=failure.status, headers=failure.headers)
        except InvalidRequest as exc:
            response = JSONResponse(error_body(str(exc), "invalid_request_error", None, exc.param), status_code=400)
        except (NotReady, UnknownVersion) as exc:
            response = JSONResponse(error_body(str(exc), "service_unavailable", "not_ready"), status_code=503)
        except Exception as exc:  # an engine failure: the client gets a 500 with the reason, the log the traceback
            log.exception("serving %s failed", endpoint)
            response = JSONResponse(error_body(f"generation failed: {exc}", "server_error"), status_code=500)
        finally:
            metrics.in_flight.dec()
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """OpenAI completions (the body is parsed here, so errors get OpenAI's shape, not FastAPI's)."""
        return await answer(request, "completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        """OpenAI chat completions, rendered with the template of :mod:`serving.openai_schema`."""
        return await answer(request, "chat.completions", chat=True)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        """The served model, with the loaded policy versions."""
        if not key.accepts(request.headers.get("authorization")):
            body = error_body("missing or wrong API key", "invalid_request_error", "invalid_api_key")
            return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        versions = engine.loaded_versions
        default = engine.default_version if versions else None
        entry = {
            "id": settings.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "liveloop",
            "liveloop": {"loaded_versions": versions, "default_version": default},
        }
        return JSONResponse({"object": "list", "data": [entry]})

    @app.get("/healthz")
    async def healthz() -> Response:
        """Liveness: the process answers."""
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        """Readiness: a policy version is loaded."""
        versions = engine.loaded_versions
        if not versions:
            return JSONResponse({"ready": False, "detail": "no policy version loaded yet"}, status_code=503)
        return JSONResponse({"ready": True, "default_version": engine.default_version, "loaded_versions": versions})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text exposition of this app's registry."""
        return Response(metrics.render(), media_type=metrics.content_type)

    document_openapi(app, settings)
    return app


def build_engine(settings: ServingSettings, on_exit: Callable[[], None] | None = None) -> Engine:
    """The engine the settings choose; vLLM and torch are imported only where they run.

    ``on_exit`` is called if the torch engine's own process (``engine_process``) dies.
    """
    if settings.engine == "vllm":
        from serving.vllm_engine import VllmEngine

        return VllmEngine.from_settings(settings)
    if settings.engine_process:
        from serving.engine_process import EngineProcess

        return EngineProcess(
            settings.device,
            settings.dtype,
            settings.max_batch,
            settings.batch_wait_ms,
            settings.torch_threads,
            on_exit=on_exit,
        )
    import torch

    from serving.torch_engine import TorchEngine

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)  # process-wide: this process serves one engine
    return TorchEngine(settings.device, settings.dtype, settings.max_batch, settings.batch_wait_ms)


def main() -> None:
    """Run the gateway with uvicorn: one worker (the engine holds the model), warnings only, no access log."""
    from ingest.client import Client
    from ingest.settings import SdkSettings
    from serving.swap import controller_from_settings

    settings = ServingSettings()
    # Without its engine the gateway cannot serve: it stops (SIGTERM, a clean shutdown), and its keeper
    # starts it, and a new engine, again.
    engine = build_engine(settings, on_exit=lambda: os.kill(os.getpid(), signal.SIGTERM))
    if settings.model_folder is not None:
        engine.load(settings.model_folder, settings.model_version)
        engine.switch(settings.model_version)
    sdk_settings = SdkSettings(
        bootstrap=settings.bootstrap,
        topic=settings.events_topic,
        journal_dir=settings.sdk_journal_dir,
        client_id="liveloop-gateway",
    )
    sdk = Client(sdk_settings)
    # The swap controller follows the champion alias (and the canary) for as long as the app runs.
    registry = CollectorRegistry()
    controller = controller_from_settings(engine, settings, metrics=registry)
    try:
        app = create_app(
            settings, engine, emitter=sdk, router=controller.router, services=[controller], metrics_registry=registry
        )
        # Start-up's objects live as long as the process: frozen, the cycle collector never scans them
        # again (a full collection of them holds the event loop, and so every request, for tens of ms).
        gc.freeze()
        uvicorn.run(app, host=settings.host, port=settings.port, workers=1, log_level="warning", access_log=False)
    finally:
        sdk.close()
        engine.close()
        gc.unfreeze()  # what start-up made is reclaimed at exit, as extension modules expect


if __name__ == "__main__":
    main()
