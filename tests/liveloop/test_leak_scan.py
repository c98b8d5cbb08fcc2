"""The leak scan's reading of the local state: every file as bytes, and RocksDB stores key by key; and of
PostgreSQL's ``dead_letters`` table, where a private session's malformed item was once kept by its id.

Its Kafka and PostgreSQL halves run in the demo (tests/liveloop/test_demo.py) and the fault drill
(tests/reliability/test_faults.py) against the real services.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from rocksdict import Options, Rdict

from infra.migrations import migrate
from infra.stack import Endpoints
from ingest.dead_letters import DeadLetter
from liveloop.demo.leak_scan import _postgres, planted_strings, scan_files

RUN = "ab12cd34"
PRIVATE = f"sim-{RUN}-123"


def _distiller_store(store: Path, sessions: range) -> None:
    """A RocksDB store shaped like the distiller's sessions table: key the session id, value its state,
    which holds the session's events as JSON strings (so their ids appear escaped)."""
    store.parent.mkdir(parents=True, exist_ok=True)
    db = Rdict(str(store), options=Options(raw_mode=True))
    try:
        for n in sessions:
            session = f"sim-{RUN}-{n}"
            ended = json.dumps({"type": "session.ended", "session_id": session, "payload": {"reason": "done"}})
            db[session.encode()] = json.dumps({"private": False, "ended": ended, "seen": [f"default:{n}"]}).encode()
        db.flush()
        db.compact_range(None, None)  # into a compressed table file, as a long-running worker's state ends up
    finally:
        db.close()


def test_a_private_session_in_a_rocksdb_store_is_found_though_its_files_compress_it_away(tmp_path: Path) -> None:
    store = tmp_path / "distill" / "v1" / "tables" / "sessions-0.db"
    _distiller_store(store, range(200))
    needles, keys = planted_strings([], [PRIVATE])

    found = scan_files(tmp_path, needles, keys)

    # The table file's compressed blocks hide both the key and the escaped id from a byte search...
    assert not [place for place in found if place.startswith("files:")], found
    # ...so the store is read through RocksDB: the key and the id inside the stored event.
    assert found == {"rocksdb:distill/v1/tables/sessions-0.db": 2}


def test_a_store_without_the_private_session_is_clean(tmp_path: Path) -> None:
    _distiller_store(tmp_path / "distill" / "sessions-0.db", range(100))  # sessions 0-99: not 123, nor 12
    needles, keys = planted_strings(["ghp_" + "a1" * 18], [PRIVATE, f"sim-{RUN}-1234"])

    assert not any(scan_files(tmp_path, needles, keys).values())


def test_a_secret_in_a_file_is_named_by_its_path_and_the_skipped_folder_is_not_read(tmp_path: Path) -> None:
    secret = "AKIA" + "Q7" * 8
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "gateway.log").write_text(f"request failed: key {secret}\n", encoding="utf-8")
    (tmp_path / "postgres" / "base").mkdir(parents=True)
    (tmp_path / "postgres" / "base" / "16384").write_text(f"{secret} {PRIVATE}", encoding="utf-8")
    (tmp_path / "gateway-journal").mkdir()
    (tmp_path / "gateway-journal" / "0.seg").write_text(json.dumps({"session_id": PRIVATE}), encoding="utf-8")
    needles, keys = planted_strings([secret], [PRIVATE])

    found = scan_files(tmp_path, needles, keys, skip=tmp_path / "postgres")

    assert found == {"files:logs/gateway.log": 1, "files:gateway-journal/0.seg": 1}


def test_a_private_sessions_dead_letter_is_found_by_its_session_id_column(
    endpoints: Endpoints, fresh_database: str
) -> None:
    """A row's text form writes a plain id unquoted, so the quoted needle alone would miss the
    ``session_id`` column; the scan compares text columns whole with the private ids too."""
    migrate(fresh_database)
    item = json.dumps({"privacy_mode": True, "session_id": PRIVATE, "type": "nope"}).encode()
    withheld = DeadLetter.of(item, "unknown event type 'nope'", "ingest-api", session_id=PRIVATE)
    insert = "INSERT INTO dead_letters (source, reason, tenant, session_id, raw) VALUES (%s, %s, %s, %s, %s)"
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        # As the ingest API wrote it before privacy-mode letters lost the session id: payload withheld, id kept.
        conn.execute(insert, ("ingest-api", "unknown event type", "default", PRIVATE, b""))
        conn.execute(insert, (withheld.source, withheld.reason, withheld.tenant, withheld.session_id, withheld.raw()))
    needles, keys = planted_strings([], [PRIVATE, f"sim-{RUN}-12"])
    place = f"postgres:{fresh_database.rsplit('/', 1)[1]}.public.dead_letters"

    found = _postgres(endpoints.dsn(), [needle.decode() for needle in needles], keys)

    assert found[place] == 1  # the old row; the one the rule makes now holds nothing of the session
