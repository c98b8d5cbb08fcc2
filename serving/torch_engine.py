"""The torch engine: transformers models on CPU or GPU, requests batched by a background thread.

Versions: every loaded version is a :class:`Loaded` (model, tokenizer, folder). ``generate`` takes a
reference to the version's ``Loaded`` when it starts and every row of the request decodes with that
object, so a request finishes on the version it started with even if ``switch`` moves the default or
``unload`` drops the version meanwhile (the object lives as long as a request holds it). ``switch``
only replaces the default under a lock.

Batching: ``generate`` puts one request per prompt on a queue. The batcher thread, when idle, takes
what is there and keeps collecting while requests arrive less than ``batch_wait_ms`` apart (at most
``4 x batch_wait_ms``, at most ``max_batch`` rows), then decodes them as one padded batch with a KV
cache (:class:`serving.torch_decode.BatchRun`). While it decodes, requests that arrive for the same
version join the running batch between two steps (continuous batching), so the engine does not idle
while clients' next requests are on their way: together once they would fill the batch, or once the
oldest has waited ``batch_wait_ms`` (each join costs a prefill pass). Rows leave as soon as they finish. Requests
for another version wait for a batch of their own. A request may thus share a batch with other
callers' requests and other sampling parameters; a batch whose decoding fails decodes its rows again one
at a time, so only the row at fault fails its caller. Loading lives in :mod:`serving.torch_load`.

Loading a checkpoint that differs from the serving one in its weights alone makes a copy of the
serving model, and that Python work runs on the batcher thread, between two decode steps
(:mod:`serving.torch_load` says why): ``load`` queues it as a chore and waits for it.

Prompts are encoded with the tokenizer's special tokens (a BOS where the tokenizer adds one) minus a
trailing eos, which tokenizers such as ByT5 append and which would tell the model the text is over.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.engine import Generation, LoadFailed, QueuingEngine, SamplingParams, UnknownVersion, VersionedEngine
from serving.errors import InvalidRequest, NotReady
from serving.torch_decode import BatchRun, Decoded, decode_batch
from serving.torch_load import Loaded, load_version, pick_device, pick_dtype

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    loaded: Loaded
    prompt_ids: list[int]
    params: SamplingParams
    future: Future[Decoded]
    submitted: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Chore:
    """Work the batcher thread runs between two decode steps; ``future`` holds its result."""

    work: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)

    def run(self) -> None:
        try:
            self.future.set_result(self.work())
        except BaseException as exc:  # the caller gets whatever the work raised; the batcher lives on
            self.future.set_exception(exc)


class TorchEngine(QueuingEngine, VersionedEngine[Loaded]):
    """The default engine (see the module docstring). Call :meth:`close` to stop its batcher thread."""

    def __init__(
        self, device: str = "auto", dtype: str = "auto", max_batch: int = 8, batch_wait_ms: float = 5.0
    ) -> None:
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000.0
        super().__init__()
        self._load_lock = threading.Lock()  # one load at a time: loading takes memory and both CPU cores
        self._queue: queue.SimpleQueue[_Request | _Chore | None] = queue.SimpleQueue()
        self._closed = False
        self._pending = 0  # rows submitted and not answered yet
        self.largest_batch = 0  # most rows decoded together so far (observability, and tests)
        self.batches_run = 0  # batches decoded so far; rows_run / batches_run is the mean batch size
        self.rows_run = 0
        self._batcher = threading.Thread(target=self._run, name="liveloop-torch-batcher", daemon=True)
        self._batcher.start()

    # -- versions ---------------------------------------------------------------------------------

    def load(self, folder: Path, policy_version: int) -> None:
        """Load a full-weights folder, or a LoRA adapter folder on top of the default version's base."""
        if self._closed:
            raise NotReady("the engine is closed")
        with self._load_lock:
            with self._lock:
                serving = self._versions.get(self._default) if self._default is not None else None
            loaded = load_version(
                Path(folder),
                policy_version,
                self._base_for_adapter,
                self.device,
                self.dtype,
                like=serving,
                run=self._on_batcher,
            )
            with self._lock:
                self._versions[policy_version] = loaded
                if self._default is None:
                    self._default = policy_version
        log.info("loaded policy version %d from %s", policy_version, folder)

    def switch(self, policy_version: int) -> None:
        with self._lock:
            if policy_version not in self._versions:
                raise UnknownVersion(self._unknown(policy_version))
            self._default = policy_version

    def unload(self, policy_version: int) -> None:
        with self._lock:
            if policy_version not in self._versions:
                raise UnknownVersion(self._unknown(policy_version))
            if policy_version == self._default:
                raise InvalidRequest(
                    f"policy version {policy_version} is the default; switch to another version before unloading it"
                )
            # Requests running on it hold their own reference; the weights are freed when the last one ends.
            del self._versions[policy_version]

    @property
    def pending(self) -> int:
        """Rows (one per prompt) submitted and not answered yet."""
        with self._lock:
            return self._pending

    # -- generation -------------------------------------------------------------------------------

    def submit(
        self, prompts: list[str], params: SamplingParams, policy_version: int | None = None
    ) -> Future[list[Generation]]:
        """Queue one row per prompt; the future is answered when the last row finishes (a decoding failure
        is its exception)."""
        loaded = self._resolve(policy_version)
        encoded = [loaded.encode(prompt) for prompt in prompts]
        for prompt, ids in zip(prompts, encoded, strict=True):
            self._check_fits(loaded, prompt, ids, params)
        requests = [_Request(loaded, ids, params, Future()) for ids in encoded]
        answer: Future[list[Generation]] = Future()
        if not requests:
            answer.set_result([])
            return answer
        remaining = [len(requests)]

        def row_done(_: Future[Decoded]) -> None:
            # Rows finish on the batcher thread, one at a time: the last one builds the answer.
            remaining[0] -= 1
            if remaining[0]:
                return
            failed = next((r.future.exception() for r in requests if r.future.exception() is not None), None)
            if failed is not None:
                answer.set_exception(failed)
                return
            answer.set_result(
                [
                    Generation(
                        text=decoded.text,
                        prompt_token_ids=request.prompt_ids,
                        token_ids=decoded.token_ids,
                        logprobs=decoded.logprobs,
                        finish_reason=decoded.finish_reason,
                        policy_version=loaded.version,
                    )
                    for request in requests
                    for decoded in [request.future.result()]
                ]
            )

        for request in requests:
            request.future.add_done_callback(row_done)
            self._submit(request)
        return answer

    def _resolve(self, policy_version: int | None) -> Loaded:
        with self._lock:
            version = self._default if policy_version is None else policy_version
            if version is None:
                raise NotReady("no policy version is loaded yet; load a checkpoint first")
            loaded = self._versions.get(version)
            if loaded is None:
                raise UnknownVersion(self._unknown(version))
            return loaded

    @staticmethod
    def _check_fits(loaded: Loaded, prompt: str, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise InvalidRequest(f"prompt {prompt[:40]!r} encodes to no tokens; send a non-empty prompt")
        limit = loaded.max_positions
        if limit is not None and len(ids) + params.max_tokens > limit:
            raise InvalidRequest(
                f"prompt of {len(ids)} tokens plus max_tokens {params.max_tokens} exceeds the model's context of "
                f"{limit} tokens; shorten the prompt or lower max_tokens"
            )

    def _submit(self, request: _Request) -> None:
        if self._closed:
            raise NotReady("the engine is closed")
        with self._lock:
            self._pending += 1
        self._queue.put(request)

    def _on_batcher(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` on the batcher thread, between two decode steps, and return its result."""
        if self._closed:
            raise NotReady("the engine is closed")
        chore = _Chore(work)
        self._queue.put(chore)
        return chore.future.result()

    def close(self) -> None:
        """Stop the batcher (requests already queued are answered first) and drop every version."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._batcher.join(timeout=60)
            self._fail_chores_left()
        with self._lock:
            self._versions.clear()
            self._default = None

    def _fail_chores_left(self) -> None:
        """A chore queued as the engine closed is answered too: its caller would wait for ever."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Chore):
                item.future.set_exception(NotReady("the engine is closed"))

    # -- the batcher thread -----------------------------------------------------------------------

    def _run(self) -> None:
        run: BatchRun | None = None
        run_loaded: Loaded | None = None
        waiting: collections.deque[_Request] = collections.deque()
        closing = False
        while True:
            if run is None and not waiting:
                if closing:
                    return
                first = self._queue.get()
                if first is None:
                    return
                if isinstance(first, _Chore):
                    first.run()
                    continue
                batch, closing = self._collect(first)
                waiting.extend(batch)
            else:
                closing = self._drain(waiting) or closing
            if run is None:
                run_loaded = waiting[0].loaded
                run = BatchRun(run_loaded.model, run_loaded.tokenizer, self.device, run_loaded.eos_ids)
                self.batches_run += 1
            if run.can_join and run.size < self.max_batch and self._join_now(waiting, run_loaded, run.size):
                self._advance(run, self._take(waiting, run_loaded, self.max_batch - run.size))
            if run.size:
                self._advance(run, [])
            if not run.size:
                run = None

    def _drain(self, waiting: collections.deque[_Request]) -> bool:
        """Move what is queued now into ``waiting``; True when the engine is closing."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is None:
                return True
            if isinstance(item, _Chore):
                item.run()
            else:
                waiting.append(item)

    def _join_now(self, waiting: collections.deque[_Request], loaded: Loaded | None, size: int) -> bool:
        """Whether waiting requests join now: each join costs a prefill pass, so arrivals a few ms apart
        join together once they fill the batch or the oldest has waited batch_wait_ms."""
        candidates = [r for r in waiting if r.loaded is loaded]
        if not candidates:
            return False
        if size == 0 or len(candidates) >= self.max_batch - size:
            return True
        return time.monotonic() - candidates[0].submitted >= self.batch_wait_s

    @staticmethod
    def _take(waiting: collections.deque[_Request], loaded: Loaded | None, limit: int) -> list[_Request]:
        """Up to ``limit`` waiting requests on ``loaded``, in arrival order (others wait for their own batch)."""
        taken = [r for r in waiting if r.loaded is loaded][:limit]
        for request in taken:
            waiting.remove(request)
        return taken

    def _advance(self, run: BatchRun, joining: list[_Request]) -> None:
        """Add ``joining`` to the run, or (none joining) decode one step; answer the rows that finished."""
        try:
            if joining:
                finished = run.add(joining, [r.prompt_ids for r in joining], [r.params for r in joining])
                self.rows_run += len(joining)
                self.largest_batch = max(self.largest_batch, run.size + len(finished))
            else:
                finished = run.step()
        except Exception as exc:  # the batcher itself must live on, and answer every caller in the batch
            failed = list(run.keys) + joining
            run.keys, run.rows, run.next_tokens, run.cache = [], [], [], None
            if len(failed) == 1:
                log.exception("decoding a request failed")
                self._answered(1)
                failed[0].future.set_exception(exc)
                return
            # One row (a sampling parameter torch refuses, say) must not fail the other callers that
            # happened to share its batch: each row decodes again on its own, and only a row that fails
            # alone fails its caller. Rows decoding already start over (a seeded row samples the same tokens).
            log.warning("decoding a batch of %d failed (%r); decoding its rows one at a time", len(failed), exc)
            for request in failed:
                self._decode_alone(request)
            return
        self._answered(len(finished))
        for request, result in finished:
            request.future.set_result(result)

    def _decode_alone(self, request: _Request) -> None:
        """Decode ``request`` in a batch of its own, to the end, and answer it."""
        loaded = request.loaded
        try:
            (decoded,) = decode_batch(
                loaded.model, loaded.tokenizer, [request.prompt_ids], [request.params], self.device, loaded.eos_ids
            )
        except Exception as exc:
            log.exception("decoding a request failed")
            self._answered(1)
            request.future.set_exception(exc)
            return
        self._answered(1)
        request.future.set_result(decoded)

    def _collect(self, first: _Request) -> tuple[list[_Request], bool]:
        """The first request plus those that follow it closely, up to max_batch.

        The batch closes when no request arrived for batch_wait_ms, or 4 x batch_wait_ms after the
        first: clients answered by one batch send their next requests a few ms apart (an HTTP round
        trip each), and a batch decodes in about the same time whether it holds 3 rows or 8.
        """
        batch = [first]
        now = time.monotonic()
        cap = now + 4 * self.batch_wait_s
        deadline = min(cap, now + self.batch_wait_s)
        while len(batch) < self.max_batch:
            try:
                remaining = deadline - time.monotonic()
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            if isinstance(item, _Chore):
                item.run()
                continue
            batch.append(item)
            deadline = min(cap, time.monotonic() + self.batch_wait_s)
        return batch, False

    def _answered(self, rows: int) -> None:
        with self._lock:
            self._pending -= rows

    # -- loading ----------------------------------------------------------------------------------

    def _base_for_adapter(self) -> Path:
        """The full-weights folder under the default version, on which a LoRA adapter is loaded."""
        with self._lock:
            base = self._versions.get(self._default) if self._default is not None else None
        if base is None:
            raise LoadFailed("a LoRA adapter needs its base model loaded first; load the full-weights folder first")
        return base.base_folder
