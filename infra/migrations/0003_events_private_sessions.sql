-- Every audit read (replay, audit, export) leaves out the sessions with a privacy-mode event
-- (ingest.archive_reads.PRIVATE_SESSIONS). Without an index that costs a scan of every archived event's body
-- per query; the archiver never stores such events, so this partial index is empty in practice and free to keep.
CREATE INDEX events_private_sessions ON events (session_id) WHERE (body->>'privacy_mode')::boolean IS TRUE;
