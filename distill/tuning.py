"""Faust, tuned for the distiller: what its per-record machinery costs, cut where no guarantee depends on it.

Two changes, both below the app (the agents, tables and commits are Faust's own):

- **Fetch wait.** Faust's aiokafka driver asks the broker to hold a fetch up to 1.5 s
  (``fetch_max_wait_ms=1500``, fixed) until new data arrives, and aiokafka keeps one fetch in flight
  per broker, leaving out partitions whose records the app has not taken yet. A partition drained
  just after a fetch went out (the scored samples, say) then waits for that fetch, which may hold
  only idle partitions (the ticks): records sat there for up to 1.5 s. Here the wait is a setting.
- **Monitor.** Faust's default sensor keeps statistics of every message, event, send and table access
  for its own web views, which the distiller does not serve (it has its own metrics). A quiet
  monitor keeps only what Faust itself reads (when each partition's stream last took an event).
"""

from __future__ import annotations

from time import monotonic
from typing import Any, ClassVar

import aiokafka
import faust
from faust.sensors import Monitor
from faust.transport.drivers import aiokafka as driver


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


class _Consumer(driver.Consumer):
    thread_class: ClassVar[type[driver.AIOKafkaConsumerThread]] = _ConsumerThread

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)


def install(app: faust.App, fetch_max_wait_s: float) -> None:
    """Tune ``app`` as the module docstring says; call it right after creating the app."""
    wait_ms = max(1, round(fetch_max_wait_s * 1000))
    thread = type("ConsumerThread", (_ConsumerThread,), {"fetch_max_wait_ms": wait_ms})
    consumer = type("Consumer", (_Consumer,), {"thread_class": thread})
    transport = type("Transport", (driver.Transport,), {"Consumer": consumer})
    app.transport = transport(app.conf.broker_consumer, app)
    app.monitor = QuietMonitor()
