"""Helpers for gateway tests and benchmarks: the app under uvicorn on a real port, events read back."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from kafka import KafkaConsumer, TopicPartition


@contextmanager
def serve_in_thread(app: FastAPI, port: int) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on 127.0.0.1:``port``; yield its base URL; stop it afterwards."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def read_events(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The first ``count`` records of the (single-partition) topic, decoded as JSON; fails if fewer arrive."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        records: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(json.loads(record.value) for record in batch)
        assert len(records) >= count, f"only {len(records)} of {count} events arrived on {topic}"
        return records
    finally:
        consumer.close()
