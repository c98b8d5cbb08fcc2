"""A minimal real Faust app for the table-recovery test: count messages per key in a changelogged table.

Run it as a worker process (``tests/infra/test_faust_table.py`` does)::

    COUNTER_BROKER=127.0.0.1:9092 COUNTER_TOPIC=input COUNTER_APP_ID=counter-1 \\
    COUNTER_SNAPSHOT=/tmp/snapshot.json COUNTER_WEB_PORT=6067 COUNTER_DATADIR=/tmp/faust-data \\
    python -m tests.infra.faust_counter_app worker --loglevel=warning

An agent on ``COUNTER_TOPIC`` adds one to ``counts[key]`` per message; a timer writes the table's
contents as a JSON object (key -> count) to ``COUNTER_SNAPSHOT`` every half second, atomically
(temporary file, then ``os.replace``), so a reader never sees a half-written file.

The table lives in Faust's in-memory store: nothing survives a restart on disk, so a restarted
worker holds the right counts only if it rebuilt the table from the changelog topic in Kafka. That
makes the app a sharp probe of the broker's offsets (end offsets, committed offsets) and of Faust's
recovery on this stack.

The input topic must exist (the broker does not auto-create topics); Faust creates its own internal
topics (the table's changelog, the assignor's leader topic) through the admin API.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import faust


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{name} is not set: the counter app reads its configuration from the environment")
    return value


BROKER = _env("COUNTER_BROKER")
TOPIC = _env("COUNTER_TOPIC")
APP_ID = _env("COUNTER_APP_ID")
SNAPSHOT = Path(_env("COUNTER_SNAPSHOT"))
WEB_PORT = int(_env("COUNTER_WEB_PORT"))
# Faust keeps a data folder even for the memory store; keep it out of the working directory.
DATADIR = Path(_env("COUNTER_DATADIR"))
SNAPSHOT_INTERVAL_S = 0.5

app = faust.App(
    APP_ID,
    broker=f"kafka://{BROKER}",
    store="memory://",
    topic_partitions=3,
    topic_replication_factor=1,
    datadir=str(DATADIR),
    web_host="127.0.0.1",
    web_bind="127.0.0.1",
    web_port=WEB_PORT,
)

source = app.topic(TOPIC, key_type=str, value_type=str, key_serializer="raw", value_serializer="raw")

# Faust picks the changelog's codec from the types (JSON for str keys and int values).
counts = app.Table("counts", default=int, key_type=str, value_type=int)


@app.agent(source)
async def count(stream: faust.StreamT[str]) -> None:
    """One per message, under the message's key (the table is partitioned like the input topic)."""
    async for event in stream.events():
        counts[event.key] += 1


@app.timer(interval=SNAPSHOT_INTERVAL_S)  # type: ignore[untyped-decorator]  # Faust returns a bare Callable
async def write_snapshot() -> None:
    """Publish the table's current contents for the test to read."""
    snapshot = {str(key): int(value) for key, value in counts.items()}
    tmp = SNAPSHOT.with_name(SNAPSHOT.name + ".tmp")
    tmp.write_text(json.dumps(snapshot, sort_keys=True), encoding="utf-8")
    os.replace(tmp, SNAPSHOT)


if __name__ == "__main__":
    app.main()
