"""The SDK's on-disk journal: a write-ahead log of events not yet acknowledged by Kafka.

Every emitted event is appended here first (one ``write`` per event, so it survives a crash of the
process the moment ``emit`` returns), and the sender reads it back in order. A cursor marks the first
record Kafka has not acknowledged yet; it is persisted atomically, and segments wholly before it are
deleted. After a restart the client resends from the persisted cursor: delivery is at-least-once,
and consumers drop repeats by ``event_id``.

Layout of the journal folder: ``<first record's segment number>.seg`` files of framed records, a
``cursor`` file and a ``lock`` file (one client per journal). A record is
``value length (u32) | crc32 of key+value (u32) | key length (u16) | key | value``; a torn record at
the end of the last segment (a crash in the middle of a write) is cut off when the journal opens.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import NamedTuple

from ingest.errors import BackPressure, JournalError

_HEADER = struct.Struct(">IIH")
_READ_BYTES = 1 << 20  # per read of a segment: a few thousand events, not the whole segment
_SUFFIX = ".seg"


class Position(NamedTuple):
    """A place in the journal: the segment number and a byte offset inside it. Ordered."""

    segment: int
    offset: int


class Record(NamedTuple):
    start: Position
    end: Position
    key: bytes
    value: bytes


class Chunk(NamedTuple):
    """Consecutive records of one segment, as parallel lists: no object per record but its bytes.

    The sender reads every event through here; one tuple per record (and two positions) made the
    garbage collector's work grow with the events in flight.
    """

    segment: int
    keys: list[bytes]
    values: list[bytes]
    ends: list[int]
    """Offset just past each record, in ``segment``."""


def _segment_name(number: int) -> str:
    return f"{number:012d}{_SUFFIX}"


class Journal:
    """An append-only, crash-safe log of (key, value) records with a persisted read cursor."""

    def __init__(self, directory: Path, segment_bytes: int = 64 << 20, max_bytes: int = 1 << 30) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise JournalError(f"journal {directory} is in use by another client; give each its own folder") from exc
        self._mutex = threading.Lock()
        self.appended = threading.Condition(self._mutex)
        self._idle_readers = 0
        segments = self._segments()
        self._cursor = self._load_cursor(segments)
        if not segments:
            segments = [self._cursor.segment]
            (directory / _segment_name(self._cursor.segment)).touch()
        last = segments[-1]
        self._end = Position(last, self._repair(last))
        self._write_fd = os.open(directory / _segment_name(last), os.O_WRONLY | os.O_APPEND)
        self._closed_bytes = sum((directory / _segment_name(n)).stat().st_size for n in segments[:-1])

    # -- state -----------------------------------------------------------------------------------

    def _segments(self) -> list[int]:
        return sorted(int(p.name[: -len(_SUFFIX)]) for p in self.directory.glob(f"*{_SUFFIX}"))

    def _load_cursor(self, segments: list[int]) -> Position:
        try:
            data = json.loads((self.directory / "cursor").read_text(encoding="utf-8"))
            return Position(int(data["segment"]), int(data["offset"]))
        except FileNotFoundError:
            return Position(segments[0] if segments else 0, 0)
        except (ValueError, KeyError, TypeError) as exc:
            raise JournalError(f"{self.directory / 'cursor'} is corrupt: {exc}") from exc

    def _repair(self, segment: int) -> int:
        """Scan the last segment and cut off a torn record at its end; return the valid length."""
        path = self.directory / _segment_name(segment)
        data = path.read_bytes()
        offset = 0
        while offset + _HEADER.size <= len(data):
            value_len, crc, key_len = _HEADER.unpack_from(data, offset)
            end = offset + _HEADER.size + key_len + value_len
            if end > len(data) or zlib.crc32(data[offset + _HEADER.size : end]) != crc:
                break
            offset = end
        if offset != len(data):
            os.truncate(path, offset)
        return offset

    # Reading one attribute is atomic and Positions are immutable: no lock, so that the sender never
    # waits for an emitting thread that holds the lock across its write.
    @property
    def cursor(self) -> Position:
        """The first record not yet acknowledged."""
        return self._cursor

    @property
    def end(self) -> Position:
        """Just past the last record appended."""
        return self._end

    def pending(self) -> bool:
        """True while some appended record is not acknowledged."""
        with self._mutex:
            return self._cursor < self._end

    def wait_acknowledged(self, target: Position, timeout: float | None) -> bool:
        """Block until the cursor reaches ``target``; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.appended:
            while self._cursor < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self.appended.wait(timeout=1.0 if remaining is None else min(remaining, 1.0))
        return True

    def wait_appended(self, position: Position, timeout: float) -> None:
        """Block until something is appended past ``position``, or ``timeout`` passes."""
        with self.appended:
            if self._end <= position:
                self._idle_readers += 1
                try:
                    self.appended.wait(timeout=timeout)
                finally:
                    self._idle_readers -= 1

    def wake(self) -> None:
        """Wake every waiter (used when the client stops)."""
        with self.appended:
            self.appended.notify_all()

    def size_bytes(self) -> int:
        """Bytes on disk, acknowledged records of the current segments included."""
        with self._mutex:
            return self._closed_bytes + self._end.offset

    # -- writing ---------------------------------------------------------------------------------

    def append(self, key: bytes, value: bytes) -> Position:
        """Append one record (a single write, so a crash never leaves half of it behind a whole one)."""
        body = key + value
        frame = _HEADER.pack(len(value), zlib.crc32(body), len(key)) + body
        with self.appended:
            if self._closed_bytes + self._end.offset + len(frame) > self.max_bytes:
                raise BackPressure(
                    f"journal {self.directory} holds {self.max_bytes} bytes not yet sent; Kafka has been "
                    "unreachable for long: retry later, or raise the journal's max_bytes"
                )
            if self._end.offset >= self.segment_bytes:
                self._roll()
            os.write(self._write_fd, frame)
            self._end = Position(self._end.segment, self._end.offset + len(frame))
            if self._idle_readers:  # only a reader waiting in wait_appended needs waking
                self.appended.notify_all()
            return self._end

    def _roll(self) -> None:
        os.close(self._write_fd)
        self._closed_bytes += self._end.offset
        number = self._end.segment + 1
        self._write_fd = os.open(self.directory / _segment_name(number), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._end = Position(number, 0)

    def sync(self) -> None:
        """fsync the active segment (what the OS has not yet written survives a power cut after this)."""
        os.fsync(self._write_fd)

    # -- reading and acknowledging ---------------------------------------------------------------

    def read(self, start: Position, max_records: int = 2000) -> list[Record]:
        """Records from ``start`` (a record boundary) on, at most ``max_records``, never past the end."""
        records: list[Record] = []
        position = start
        while len(records) < max_records:
            chunk = self.read_chunk(position, max_records - len(records))
            if not chunk.ends:
                break
            offset = position.offset if position.segment == chunk.segment else 0
            for key, value, end in zip(chunk.keys, chunk.values, chunk.ends, strict=True):
                records.append(Record(Position(chunk.segment, offset), Position(chunk.segment, end), key, value))
                offset = end
            position = Position(chunk.segment, chunk.ends[-1])
        return records

    def read_chunk(self, start: Position, max_records: int = 2000) -> Chunk:
        """Records from ``start`` (a record boundary) on, in one segment, at most ``max_records``.

        Empty when nothing was appended past ``start``; moves on to the next segment when ``start``
        is the end of its own.
        """
        end = self.end
        segment, position, want = start.segment, start.offset, _READ_BYTES
        chunk = Chunk(segment, [], [], [])
        while start < end:
            path = self.directory / _segment_name(segment)
            limit = end.offset if segment == end.segment else path.stat().st_size
            if position >= limit:
                segment, position = self._next_segment(segment), 0
                start = Position(segment, 0)
                chunk = Chunk(segment, [], [], [])
                continue
            with open(path, "rb") as fh:
                fh.seek(position)
                data = fh.read(min(limit - position, want))
            offset, size = 0, len(data)
            keys, values, ends = chunk.keys, chunk.values, chunk.ends
            while len(ends) < max_records and offset + _HEADER.size <= size:
                value_len, _, key_len = _HEADER.unpack_from(data, offset)
                key_end = offset + _HEADER.size + key_len
                body_end = key_end + value_len
                if body_end > size:
                    break  # the rest of this record is in the next read
                keys.append(data[offset + _HEADER.size : key_end])
                values.append(data[key_end:body_end])
                ends.append(position + body_end)
                offset = body_end
            if offset == 0 and size >= _HEADER.size and len(ends) < max_records:
                want = body_end  # the first record is larger than one read: read it whole
                continue
            break
        return chunk

    def _next_segment(self, segment: int) -> int:
        later = [n for n in self._segments() if n > segment]
        return later[0] if later else segment + 1

    def acknowledge(self, position: Position, persist: bool = True) -> None:
        """Everything before ``position`` is delivered: move the cursor and drop wholly delivered segments."""
        with self.appended:
            if position <= self._cursor:
                return
            self._cursor = position
            self.appended.notify_all()
        if persist:
            self.persist_cursor()

    def persist_cursor(self) -> None:
        """Write the cursor atomically, then delete the segments it has left behind."""
        cursor = self.cursor
        tmp = self.directory / "cursor.tmp"
        tmp.write_text(json.dumps({"segment": cursor.segment, "offset": cursor.offset}), encoding="utf-8")
        os.replace(tmp, self.directory / "cursor")
        for number in self._segments():
            if number >= cursor.segment:
                break
            path = self.directory / _segment_name(number)
            size = path.stat().st_size
            path.unlink()
            with self._mutex:
                self._closed_bytes -= size

    def close(self) -> None:
        """Persist the cursor and release the journal (undelivered records stay for the next client)."""
        self.persist_cursor()
        os.fsync(self._write_fd)
        os.close(self._write_fd)
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
