"""Faust, tuned for the distiller: what its per-record machinery costs, cut where no guarantee depends on it.

Seven changes, all below the app's own logic (the agents, tables, changelogs and commits are Faust's):

- **Seeks that hold.** Records fetched and then dropped (on a rebalance, a stopped flow) are read again only
  if the consumer seeks back to the committed offsets. Faust's seek skipped partitions with nothing committed
  yet, left out some drops, and raced fetches handed over before it: each lost about one fetch per moved
  partition when workers joined or left (docs/reliability.md). ``_Consumer`` seeks every partition, after
  every drop, and drops what a fetch brought while a seek ran. Checked against one faust-streaming release
  (:data:`FAUST_VERSION`): the worker refuses to start on another.

- **Whole fetches.** The records of the topics a :class:`distill.fetches.Fetches` names leave each
  fetch before Faust's per-record delivery sees them, and go there whole, to be acknowledged by
  offset (``_Consumer``; see ``distill.fetches`` for what is kept of Faust's guarantees). The
  distiller's events take this path: on its throughput benchmark, its CPU per event fell from about
  114 µs to about 33 µs. The records of other topics take Faust's path, tuned as below.

- **Fetch wait.** Faust's aiokafka driver asks the broker to hold a fetch up to 1.5 s
  (``fetch_max_wait_ms=1500``, fixed) until new data arrives, and aiokafka keeps one fetch in flight
  per broker, leaving out partitions whose records the app has not taken yet. A partition drained
  just after a fetch went out (the scored samples, say) then waits for that fetch, which may hold
  only idle partitions (the ticks): records sat there for up to 1.5 s. Here the wait is a setting.
- **Monitor.** Faust's default sensor keeps statistics of every message, event, send and table access
  for its own web views, which the distiller does not serve (it has its own metrics). A quiet
  monitor keeps only what Faust itself reads (when each partition's stream last took an event).
- **Delivery.** Faust's fetcher hands each record to its streams with ``Service.wait_first``, racing
  the delivery against a rebalance (``suspend_flow``): four tasks and an ``asyncio.wait`` per record,
  about a tenth of the distiller's CPU. A delivery almost never waits (it decodes the record and puts
  it on a queue), so here its first step runs at once; only one that does wait takes the race, where
  it goes on from the step it reached (:func:`step_eagerly`). A record is delivered, or abandoned by a
  rebalance, exactly when it would have been.
- **Raw records.** The distiller's topics carry bytes it decodes itself, yet Faust passed each key and
  value through its serializer registry (four calls each, to return them unchanged): :data:`RAW`
  hands them over as they came.
- **Events.** Faust builds each record's event through ``app.create_event``, which looks the event
  class up in the app's settings registry (several calls) every time; here it is looked up once.

Not a cost but a guarantee: the producer is idempotent with ``acks=all`` (:class:`IdempotentProducer`). And
not a cost but a crash: Faust's livelock check, which only logs, skips a partition whose position is not set
yet (``_ConsumerThread.verify_event_path``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import types
from collections.abc import Coroutine, Generator, Mapping
from importlib.metadata import version
from time import monotonic
from typing import Any, ClassVar

import aiokafka
import faust
from faust.sensors import Monitor
from faust.transport.consumer import RecordMap
from faust.transport.drivers import aiokafka as driver
from faust.types import TP
from faust.types.tuples import ack_lock
from mode import Service
from mode.services import WaitArgT, WaitResults
from mode.utils.futures import notify
from mode.utils.times import Seconds

from distill.errors import UnsupportedEngine
from distill.fetches import Fetched, Fetches
from infra.producers import RELIABLE_OPTIONS

log = logging.getLogger(__name__)

FAUST_VERSION = "0.15.3"
"""The faust-streaming release whose consumer internals (read and committed offsets, the gap accounting, the
seek after a rebalance) the classes here were read against and tested with; :func:`install` refuses another."""


def step_eagerly(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run ``coro``'s first step now, outside any task: ``(True, its result)`` if that finished it, else
    ``(False, a coroutine that goes on from where it stopped)``, to be awaited or made a task.

    This is what Python 3.12's eager tasks do, without a task: a coroutine that does not wait costs no
    scheduling at all. An exception raised in the first step propagates from here.
    """
    try:
        waiting_on = coro.send(None)
    except StopIteration as finished:
        return True, finished.value
    return False, _resumed(coro, waiting_on)


async def _resumed(coro: Coroutine[Any, Any, Any], waiting_on: Any) -> Any:
    return await _go_on(coro, waiting_on)


@types.coroutine
def _go_on(coro: Coroutine[Any, Any, Any], waiting_on: Any) -> Generator[Any, Any, Any]:
    """Drive ``coro`` from a step that yielded ``waiting_on`` (what a task waits for: a future, or
    ``None`` to yield once), forwarding what the task sends or throws in (a cancellation, say)."""
    while True:
        try:
            sent = yield waiting_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                waiting_on = coro.throw(exc)
            except StopIteration as finished:
                return finished.value
        else:
            try:
                waiting_on = coro.send(sent)
            except StopIteration as finished:
                return finished.value


class QuietMonitor(Monitor):
    """Faust's monitor without per-record statistics; it still records when each stream took an event."""

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> dict[str, Any] | None:
        self.stream_inbound_time[tp] = monotonic()  # read by the driver's stalled-stream check
        return None

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_table_get(self, table: Any, key: Any) -> None:
        return None

    def on_table_set(self, table: Any, key: Any, value: Any) -> None:
        return None

    def on_table_del(self, table: Any, key: Any) -> None:
        return None

    def on_send_initiated(self, producer: Any, topic: str, message: Any, keysize: int, valsize: int) -> Any:
        return None

    def on_send_completed(self, producer: Any, state: Any, metadata: Any) -> None:
        return None


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    fetch_max_wait_ms: ClassVar[int] = 1500

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this when the consumer starts (it builds its fetcher then); the driver gives
        # no way to pass it.
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer

    def verify_event_path(self, now: float, tp: TP) -> None:
        """Faust's livelock check (it only logs), skipped for a partition whose position aiokafka has not set yet.

        Faust's check reads the position, which asserts it is set; between a rebalance's assignment and the
        position's reset it is not, and the failed assertion crashed the worker (seen once in
        tests/distill/test_scale_out.py, on a loaded machine). Such a partition has nothing to judge yet.
        """
        subscription = self._ensure_consumer()._fetcher._subscriptions.subscription
        assignment = subscription.assignment if subscription is not None else None
        state = assignment.state_value(aiokafka.TopicPartition(tp.topic, tp.partition)) if assignment else None
        if state is None or not state.has_valid_position:
            return None
        return super().verify_event_path(now, tp)


class EagerDelivery(Service):
    """``Service.wait_first`` with a coroutine given first (the fetcher's delivery of a record) run
    eagerly: if its first step finishes it, the others are not waited for (see the module docstring)."""

    async def wait_first(self, *coros: WaitArgT, timeout: Seconds = None) -> WaitResults:  # type: ignore[assignment]  # as mode declares it
        """As Faust's own race, which starts the delivery's task first: a delivery that finishes in its first
        step finished there too, whatever else was set, and the result says so."""
        first = coros[0] if coros else None
        if not inspect.iscoroutine(first):
            return await super().wait_first(*coros, timeout=timeout)
        others = coros[1:]
        try:
            finished, outcome = step_eagerly(first)
        except BaseException:
            _close(others)
            raise
        if not finished:
            return await super().wait_first(outcome, *others, timeout=timeout)
        _close(others)
        if self._stopped.is_set() or self._crashed.is_set():
            return WaitResults([], [], True)
        return WaitResults([first], [outcome], False)


class _Consumer(EagerDelivery, driver.Consumer):
    thread_class: ClassVar[type[driver.AIOKafkaConsumerThread]] = _ConsumerThread
    fetches: ClassVar[Fetches | None] = None
    _seeks = 0  # how many times perform_seek started or ended

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)

    async def _wait_next_records(self, timeout: float) -> tuple[RecordMap | None, set[TP] | None]:
        """Faust's fetch, less the records of :attr:`fetches`' topics, which go there whole
        (``distill.fetches``); ``getmany`` turns the rest into messages one by one as before."""
        seeks = self._seeks
        records, active = await super()._wait_next_records(timeout)
        if records and seeks != self._seeks:
            # A seek (after a rebalance's recovery, say) ran while this fetch was out, in the consumer's thread:
            # the records may have been handed over before it, from the positions it replaced. Taken now, the
            # first would jump ahead of the read offset the seek set, that jump would be booked as a gap
            # (``_add_gap``: acknowledged), and the records the seek meant to read again would then be skipped
            # as read already. Drop them and seek again, with no fetch out this time.
            for tp in [tp for tp in records if not self._is_changelog_tp(tp)]:
                records.pop(tp)  # type: ignore[attr-defined]  # the driver's own dict
            await self._seek_back()
            return records, active
        fetches = self.fetches
        if not records or fetches is None:
            return records, active
        # As getmany: the generation the fetch returned in, not the one it started in (the fetch may have
        # waited out a rebalance, and its records come from the positions that rebalance sought to).
        generation = self.app.consumer_generation_id
        taken: list[Fetched] = []
        dropped = False
        for tp in [tp for tp in records if tp.topic in fetches.topics]:
            fetched = records.pop(tp)  # type: ignore[attr-defined]  # the driver's own dict
            # What getmany and the fetcher would have delivered of them, and nothing else. The consumer's
            # position has passed a record left out here, so the partitions are sought back below.
            if not self.flow_active or generation != self.app.consumer_generation_id:
                dropped = True
                continue
            if not (active is None or tp in active or tp in self._buffered_partitions):
                dropped = True
                continue
            read = self._read_offset[tp]
            if read is not None and fetched[0].offset < read:
                fetched = [record for record in fetched if record.offset >= read]
                if not fetched:
                    continue
            offset = fetched[0].offset
            if read and offset - read > 1 and self.app.topics.acks_enabled_for(tp.topic):
                await self._add_gap(tp, read + 1, offset)  # as the fetcher records a gap in the offsets
            self._read_offset[tp] = fetched[-1].offset
            taken.append(Fetched(TP(tp.topic, tp.partition), fetched))
        if dropped:
            # Faust's getmany seeks back only if the flow is still stopped when it looks, and its own fetcher
            # drops records of a changed generation or a paused partition without any seek: the position then
            # stays past them, the next record's jump from the read offset counts them as a gap (acknowledged,
            # ``_add_gap``), and a commit passes over them. Seeking back here re-reads them whatever comes next.
            await self._seek_back()
        if taken:
            fetches.put(taken)
            await fetches.room()
        return records, active

    async def _seek_back(self) -> None:
        """Seek every partition back to its committed offset (records were dropped after they were fetched)."""
        try:
            await self.perform_seek()
        except Exception as exc:  # a rebalance under way: its end seeks every partition again
            log.warning("could not seek back after dropping fetched records (%r); the rebalance will", exc)

    async def perform_seek(self) -> None:
        """Faust's seek to the committed offsets, and to the beginning where nothing is committed yet; a fetch
        out meanwhile is dropped (:meth:`_wait_next_records`).

        aiokafka's ``seek_to_committed`` leaves a partition with no committed offset (or offset 0) where its
        position is. Faust seeks back to the committed offsets to read again what it fetched and then dropped
        (on a rebalance, a stop of the flow); on such a partition the position stayed past those records and
        they were never read: a worker joining before the group's first commit of a partition lost about one
        fetch of it. From no committed offset a member starts at the beginning (the distiller's
        ``auto_offset_reset`` is "earliest", checked by :func:`install`), so that is where to seek.
        """
        self._seeks += 1  # before and after: a fetch that started while the seek was out is stale too
        try:
            await self._seek_to_committed()
        finally:
            self._seeks += 1

    async def _seek_to_committed(self) -> None:
        await super().perform_seek()
        unread = [
            aiokafka.TopicPartition(tp.topic, tp.partition)
            for tp in self.assignment()
            if not self._is_changelog_tp(tp) and not self._committed_offset.get(tp)
        ]
        if unread:
            await self._thread.seek_to_beginning(*unread)

    def ack_fetched(self, fetched: list[Fetched]) -> None:
        """Acknowledge the records of a batch taken from :attr:`fetches`, as ``Consumer.ack`` does each
        message: Faust then commits them, in order, as it commits an agent's records."""
        monitor = self.app.monitor
        now = monotonic()
        with ack_lock:
            for part in fetched:
                tp = part.tp
                monitor.stream_inbound_time[tp] = now  # read by the driver's stalled-stream check
                if not self.app.topics.acks_enabled_for(tp.topic):
                    continue
                committed = self._committed_offset[tp]
                acked_index = self._acked_index[tp]
                offsets = [
                    record.offset
                    for record in part.records
                    if (committed is None or record.offset >= committed) and record.offset not in acked_index
                ]
                acked_index.update(offsets)
                self._acked[tp].extend(offsets)
                self._n_acked += len(offsets)
            notify(self._waiting_for_ack)

    async def wait_empty(self) -> None:
        """On a rebalance or a stop: the batch in flight finishes and what waits is dropped, then Faust waits
        for its agents and commits."""
        if self.fetches is not None:
            await self.fetches.settle()
        await super().wait_empty()


def _close(waitables: tuple[WaitArgT, ...]) -> None:
    """Close coroutines that will never be awaited (else Python warns of each)."""
    for waitable in waitables:
        if inspect.iscoroutine(waitable):
            waitable.close()


class RawSchema(faust.Schema):  # type: ignore[type-arg]  # keys and values are bytes
    """Keys and values as the bytes they are, read without Faust's serializer registry (see the module
    docstring); written through it as the ``raw`` codec, unchanged."""

    def __init__(self) -> None:
        super().__init__(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    def loads_key(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> Any:
        return message.key

    def loads_value(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> Any:
        return message.value


RAW = RawSchema()
"""The schema of every topic the distiller reads or writes: raw bytes both ways."""


class IdempotentProducer(driver.Producer):
    """Faust's producer, idempotent with ``acks=all`` always (Faust sets idempotence only inside transactions):
    a send retried after a broker died before answering is not written twice to the samples or DLQ topic."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), **RELIABLE_OPTIONS}


def install(app: faust.App, fetch_max_wait_s: float, fetches: Fetches | None = None) -> None:
    """Tune ``app`` as the module docstring says; call it right after creating the app, before its topics
    (each topic binds ``app.create_event`` when it is created). The records of ``fetches``' topics go
    there, whole (``distill.fetches``)."""
    check_engine(app)
    wait_ms = max(1, round(fetch_max_wait_s * 1000))
    thread = type("ConsumerThread", (_ConsumerThread,), {"fetch_max_wait_ms": wait_ms})
    consumer = type("Consumer", (_Consumer,), {"thread_class": thread, "fetches": fetches})
    transport = type("Transport", (driver.Transport,), {"Consumer": consumer, "Producer": IdempotentProducer})
    app.transport = transport(app.conf.broker_consumer, app)
    app.monitor = QuietMonitor()
    event_class: Any = app.conf.Event
    app.create_event = functools.partial(event_class, app)  # type: ignore[method-assign]


def check_engine(app: faust.App) -> None:
    """Refuse to run on what the consumer here was not checked against (:class:`UnsupportedEngine`): another
    faust-streaming release (its offset bookkeeping is what decides whether a rebalance loses records), or a
    consumer that starts a partition with nothing committed anywhere but its beginning (``perform_seek``)."""
    installed = version("faust-streaming")
    if installed != FAUST_VERSION:
        raise UnsupportedEngine(
            f"faust-streaming {installed} is installed; the distiller's consumer (distill.tuning) was checked against "
            f"{FAUST_VERSION} only: install faust-streaming=={FAUST_VERSION} (constraints.txt)"
        )
    reset = app.conf.consumer_auto_offset_reset
    if reset != "earliest":
        raise UnsupportedEngine(
            f"consumer_auto_offset_reset is {reset!r}: the distiller reads a partition with nothing committed from its "
            "beginning (distill.tuning), so it must be 'earliest'"
        )
