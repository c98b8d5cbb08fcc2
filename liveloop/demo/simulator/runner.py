"""The load loop: sessions start at a Poisson rate for a while, run on threads, and a summary comes out.

Repeatable for a seed: session ``i`` draws everything from :func:`~liveloop.demo.simulator.session.session_rng`
``(seed, i)`` and asks the gateway for completions with seeds from that RNG, and the start times come from
one RNG of the run. What still varies between runs is what depends on the loop itself: which policy version
serves a request (swaps happen when they happen) and, for ``fickle``, which period a request falls in.

Use :func:`simulate` for a whole run, or :class:`Simulation` to run in the background and read its live
:attr:`Simulation.recorder` (the demo's progress view) before :meth:`Simulation.finish`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from infra.credentials import load_credentials
from infra.errors import CredentialsError
from ingest.client import Client
from ingest.settings import SdkSettings
from liveloop.demo.simulator.prune_session import PruneTally, prune_session_id, run_prune_session
from liveloop.demo.simulator.session import EventSink, Wiring, run_session
from liveloop.demo.simulator.settings import SimulatorSettings
from liveloop.demo.simulator.summary import Recorder, SimulationSummary
from liveloop.demo.simulator.summary_session import SummaryTally, run_summary_session, summary_session_id
from liveloop.demo.simulator.swarm_session import SwarmTally, run_swarm_session, swarm_session_id
from liveloop.demo.simulator.transport import GatewayClient, IngestPoster

log = logging.getLogger(__name__)


class Simulation:
    """One run of the simulator. :meth:`start` returns at once; :meth:`finish` waits and gives the summary."""

    def __init__(self, settings: SimulatorSettings, sink: EventSink | None = None) -> None:
        self.settings = settings
        s = settings
        credentials = None
        try:
            credentials = load_credentials(s.credentials_path)
        except CredentialsError:
            if s.gateway_key is None:
                raise
        gateway_key = s.gateway_key or (credentials.gateway_key if credentials is not None else None)
        if gateway_key is None:  # unreachable: load_credentials raised above
            raise CredentialsError(f"no gateway key: set LIVELOOP_SIMULATOR_GATEWAY_KEY or {s.credentials_path}")
        self._owned_sink: Client | None = None
        if sink is None:
            # The SDK redacts secrets and drops privacy-mode events before anything is sent.
            sdk = SdkSettings(
                bootstrap=s.bootstrap, topic=s.events_topic, journal_dir=s.sdk_journal_dir, client_id="liveloop-sim"
            )
            client = Client(sdk)
            self._owned_sink, sink = client, client
        ingest = None
        ingest_key = credentials.ingest_keys.get(s.tenant) if credentials is not None else None
        if s.ingest_url is not None and ingest_key is not None:
            ingest = IngestPoster(s.ingest_url, ingest_key.get_secret_value())
        elif s.malformed_share > 0:
            log.warning("no ingest API or key for tenant %r: malformed events will be skipped", s.tenant)
        gateway = GatewayClient(s.gateway_url, gateway_key.get_secret_value(), s.model, s.request_timeout_s)
        self.recorder = Recorder(s.bucket_s)
        # The agent scenario's trajectories by policy version (empty for 'code').
        self.agents: SwarmTally | SummaryTally | PruneTally = (
            SummaryTally() if s.scenario == "summary" else PruneTally() if s.scenario == "prune" else SwarmTally()
        )
        self.wiring = Wiring(s, gateway, sink, ingest, self.recorder)
        self.started_at = datetime.now(UTC)
        self._thread = threading.Thread(target=self._arrivals, name="liveloop-sim-arrivals", daemon=True)
        self._pool = ThreadPoolExecutor(s.concurrency, thread_name_prefix="liveloop-sim")
        self._slots = threading.BoundedSemaphore(s.concurrency)
        self._futures: list[Future[None]] = []
        self._no_more = threading.Event()

    def start(self) -> None:
        """Wait for the gateway to be ready, then start sessions in the background."""
        self.wiring.gateway.wait_ready(self.settings.ready_timeout_s)
        self.wiring.started = time.monotonic()
        self.started_at = datetime.now(UTC)
        self._thread.start()

    def stop(self) -> None:
        """Start no more sessions, and hurry the running ones to their end (they still send session.ended)."""
        self._no_more.set()
        self.wiring.stopping.set()

    def snapshot(self) -> SimulationSummary:
        """The summary so far, while the run goes on (for a live progress view)."""
        return self._summary(self.wiring.elapsed())

    def _summary(self, duration_s: float) -> SimulationSummary:
        summary = self.recorder.summary(
            self.wiring.run_id, self.settings.seed, self.settings.mix(), self.started_at, duration_s
        )
        return summary.model_copy(update={"agents": self.agents.versions()})

    def _arrivals(self) -> None:
        s = self.settings
        rng = random.Random(f"liveloop-simulator-arrivals:{s.seed}")  # noqa: S311 - repeatable, not cryptography
        index, next_start = 0, 0.0
        while not self._no_more.is_set():
            if next_start >= s.minutes * 60 or (s.max_sessions is not None and index >= s.max_sessions):
                break
            if self._no_more.wait(max(0.0, next_start - self.wiring.elapsed())):
                break
            self._slots.acquire()
            self._futures.append(self._pool.submit(self._session, index))
            index += 1
            next_start += rng.expovariate(s.session_rate)
        self._no_more.set()

    def _session(self, index: int) -> None:
        try:
            if self.settings.scenario == "swarm":
                self._swarm_session(index)
            elif self.settings.scenario == "summary":
                self._summary_session(index)
            elif self.settings.scenario == "prune":
                self._prune_session(index)
            else:
                run_session(self.wiring, index)
        except Exception:  # one broken session must not end the run; it is logged and counted
            log.exception("simulated session %d failed", index)
            self.recorder.error()
        finally:
            self._slots.release()

    def _swarm_session(self, index: int) -> None:
        w, s = self.wiring, self.settings
        w.recorder.session("swarm", swarm_session_id(w.run_id, index), privacy=False)
        counted = _CountingSink(w)
        record = run_swarm_session(
            w.gateway, counted, index, seed=s.seed, run_id=w.run_id, tenant=s.tenant, temperature=s.temperature
        )
        assert isinstance(self.agents, SwarmTally)
        self.agents.add(record)
        w.recorder.agent_requests(1 + record.subagent_turns)  # the decision and one turn per sub-agent

    def _summary_session(self, index: int) -> None:
        w, s = self.wiring, self.settings
        w.recorder.session("summary", summary_session_id(w.run_id, index), privacy=False)
        record = run_summary_session(
            w.gateway, _CountingSink(w), index, seed=s.seed, run_id=w.run_id, tenant=s.tenant, temperature=s.temperature
        )
        assert isinstance(self.agents, SummaryTally)
        self.agents.add(record)
        w.recorder.agent_requests(record.served_turns)

    def _prune_session(self, index: int) -> None:
        w, s = self.wiring, self.settings
        w.recorder.session("prune", prune_session_id(w.run_id, index), privacy=False)
        record = run_prune_session(
            w.gateway, _CountingSink(w), index, seed=s.seed, run_id=w.run_id, tenant=s.tenant, temperature=s.temperature
        )
        assert isinstance(self.agents, PruneTally)
        self.agents.add(record)
        w.recorder.agent_requests(record.served_turns)

    def finish(self, flush_timeout_s: float = 60.0) -> SimulationSummary:
        """Wait for the arrivals to end and sessions to drain (``drain_s``), deliver the events, summarise."""
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join()
        deadline = time.monotonic() + self.settings.drain_s
        for future in list(self._futures):
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break  # the drain is over: the rest are hurried to their end below
        self.wiring.stopping.set()
        self._pool.shutdown(wait=True)
        duration = self.wiring.elapsed()
        if self._owned_sink is not None and not self._owned_sink.close(timeout=flush_timeout_s):
            log.warning("some simulator events were not delivered; they wait in %s", self.settings.sdk_journal_dir)
        self.wiring.gateway.close()
        if self.wiring.ingest is not None:
            self.wiring.ingest.close()
        summary = self._summary(duration)
        if self.settings.summary_path is not None:
            summary.write(self.settings.summary_path)
        return summary


class _CountingSink:
    """The run's sink, counting every event handed to it in the run's recorder (as code sessions do)."""

    def __init__(self, wiring: Wiring) -> None:
        self._wiring = wiring

    def emit(self, event: Any) -> bool:
        sent = self._wiring.sink.emit(event)
        self._wiring.recorder.event(event.type, sent)
        return sent


def simulate(settings: SimulatorSettings, sink: EventSink | None = None) -> SimulationSummary:
    """Run the simulator to the end (``minutes`` of arrivals, then the drain) and return its summary."""
    simulation = Simulation(settings, sink)
    try:
        simulation.start()
    except BaseException:
        simulation.stop()
        simulation.finish(flush_timeout_s=5.0)
        raise
    return simulation.finish()
