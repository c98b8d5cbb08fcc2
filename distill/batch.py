"""Table access for a batch of stream events: each key read once, written once, on its own partition.

The distiller's stages take their input in batches (``distill.fetches``, ``stream.noack_take``),
because a Faust table write is a changelog record: per event, a session of four events would write
its whole state four times. A :class:`TableBatch` holds the values a batch touches in memory, reads
each from the table on first use and writes each back once when the batch is done.

It writes past the table's own per-key path (``table[key] = value``): that path hands each changelog
record to Faust's send buffer with a future and a callback, and the callback writes the record's offset
to RocksDB, one write per record. Measured on the throughput benchmark, this cost the distiller about
a fifth of its CPU. Here the value goes to the table's store and its changelog record to the producer
directly, and the store records the offset once per partition and batch: the offset of the batch's
last record there, once the broker has acknowledged it. Faust flushes the producer before it commits
any offset, as it does for its own changelog records, and a restart reads the changelog from the
recorded offset on, as before.

Faust decides a table key's partition (its changelog partition, and which local RocksDB it lives
in) from the event being processed (``faust.current_event()``); inside a batch that is not the
event a key came with, and ``distill.fetches`` makes no events at all, so every read and write here
runs under a stand-in for an event of the key's partition (the partition is all a store reads of
it), which keeps a key's state on its events' partition as per-event processing did.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from faust import streams
from faust.types import TP

V = TypeVar("V")

# Faust keeps the event being processed in this context variable (set by its stream iterator, read by
# ``faust.current_event()`` and by the tables); there is no public setter.
_CURRENT_EVENT: Any = streams._current_event


@dataclass
class _Entry(Generic[V]):
    value: V | None  # None: deleted
    partition: int  # that of the events that brought the key
    stored: bool  # whether the table holds the key (before this batch, or written in it)


@dataclass(frozen=True)
class _Message:
    partition: int


class _OnPartition:
    """What Faust's stores read of the current event: its message's partition."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, partition: int) -> None:
        self.message = _Message(partition)


@functools.cache  # one per partition, held for good: the context variable holds a weak reference
def _on_partition(partition: int) -> _OnPartition:
    return _OnPartition(partition)


class TableBatch(Generic[V]):
    """The values of ``table`` (raw bytes) touched by one batch, decoded by ``load`` and encoded by ``dump``.

    ``load(None)`` is the value of a key the table does not hold.
    """

    def __init__(self, table: Any, load: Callable[[bytes | None], V], dump: Callable[[V], bytes]) -> None:
        self._table = table
        self._load = load
        self._dump = dump
        self._entries: dict[bytes, _Entry[V]] = {}

    def get(self, key: bytes, partition: int) -> V:
        """The key's current value: read from the table's ``partition`` the first time the batch asks."""
        entry = self._entries.get(key)
        if entry is None:
            token = _CURRENT_EVENT.set(weakref.ref(_on_partition(partition)))
            try:
                # The store, not the table: the table's own lookup asks the store whether it holds the key
                # and then reads it, two RocksDB reads where one does.
                raw = self._table.data.get(key)
            finally:
                _CURRENT_EVENT.reset(token)
            value = self._load(raw)
            self._entries[key] = _Entry(value, partition, raw is not None)
            return value
        if entry.value is None:  # deleted earlier in this batch: the table will not hold it
            entry.value = self._load(None)
        return entry.value

    def delete(self, key: bytes) -> None:
        """Remove the key (read with :meth:`get` before) when the batch is written."""
        self._entries[key].value = None

    async def write(self) -> int:
        """Write every touched key back to the table, once each; return how many records that made.

        Each value goes to the store and its changelog record to the producer, without waiting for the
        acknowledgement (see the module docstring).
        """
        written = 0
        store = self._table.data
        topic = self._table.changelog_topic.get_topic_name()
        producer = self._table.app.producer
        last: dict[int, asyncio.Future[Any]] = {}
        for key, entry in self._entries.items():
            if entry.value is None and not entry.stored:
                continue
            partition = entry.partition
            value = None if entry.value is None else self._dump(entry.value)
            token = _CURRENT_EVENT.set(weakref.ref(_on_partition(partition)))  # the store reads the partition
            try:
                if value is not None:
                    store[key] = value
                else:
                    del store[key]
            finally:
                _CURRENT_EVENT.reset(token)
            last[partition] = await producer.send(topic, key, value, partition=partition, timestamp=None, headers=None)
            written += 1
        for partition, sent in last.items():
            sent.add_done_callback(functools.partial(_persisted, store, TP(topic, partition)))
        self._entries.clear()
        return written


def _persisted(store: Any, tp: TP, sent: asyncio.Future[Any]) -> None:
    """Remember the offset of a changelog record the broker acknowledged (what Faust does for each)."""
    if not sent.cancelled() and sent.exception() is None:
        store.set_persisted_offset(tp, sent.result().offset)
