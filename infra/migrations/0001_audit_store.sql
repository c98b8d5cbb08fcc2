-- The audit store: what came in, what it was turned into, what trained what, and who decided what.
-- Designed for replay and audit: an event is stored raw (as received, after redaction); a sample
-- leads to the events it came from; a checkpoint leads to the samples it consumed (by id and by
-- topic offsets); every gate decision and every alias move is kept.

-- Raw events, written by the archiver, idempotent on event_id.
CREATE TABLE events (
    event_id        uuid        PRIMARY KEY,
    schema_version  integer     NOT NULL,
    type            text        NOT NULL,
    ts              timestamptz NOT NULL,
    session_id      text        NOT NULL,
    user_id         text        NOT NULL,
    tenant          text        NOT NULL,
    generation_id   uuid,                       -- the generation itself, or the one feedback refers to
    policy_version  integer,
    body            jsonb       NOT NULL,       -- the whole envelope, for bit-exact replay
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    archived_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_session_ts ON events (session_id, ts);
CREATE INDEX events_generation ON events (generation_id) WHERE generation_id IS NOT NULL;
CREATE INDEX events_ts ON events (ts);

-- Rejected input with the reason, from every stage that can reject.
CREATE TABLE dead_letters (
    id              bigserial   PRIMARY KEY,
    received_at     timestamptz NOT NULL DEFAULT now(),
    source          text        NOT NULL,       -- ingest-api, sdk, distill, ...
    reason          text        NOT NULL,
    tenant          text,
    session_id      text,
    raw             bytea       NOT NULL,       -- the rejected payload, redacted where it parsed
    kafka_partition integer,
    kafka_offset    bigint,
    UNIQUE (kafka_partition, kafka_offset)
);
CREATE INDEX dead_letters_received ON dead_letters (received_at);

-- Reward specs by content hash: a sample names the exact spec that scored it.
CREATE TABLE reward_specs (
    spec_hash   text        PRIMARY KEY,
    version     text        NOT NULL,
    body        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Reward samples, written by the distiller, idempotent on sample_id (deterministic).
CREATE TABLE samples (
    sample_id       text        PRIMARY KEY,
    generation_id   uuid        NOT NULL,
    session_id      text        NOT NULL,
    user_id         text        NOT NULL,
    tenant          text        NOT NULL,
    policy_version  integer     NOT NULL,
    reward          double precision NOT NULL,
    components      jsonb       NOT NULL,       -- the per-signal breakdown of the reward
    spec_hash       text        NOT NULL REFERENCES reward_specs (spec_hash),
    body            jsonb       NOT NULL,       -- the whole sample as published
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX samples_generation ON samples (generation_id);
CREATE INDEX samples_session ON samples (session_id);

-- Lineage: which events made which sample. No foreign key to events: the archiver and the
-- distiller run independently and a sample may be written before its events are archived.
CREATE TABLE sample_events (
    sample_id   text NOT NULL REFERENCES samples (sample_id) ON DELETE CASCADE,
    event_id    uuid NOT NULL,
    PRIMARY KEY (sample_id, event_id)
);
CREATE INDEX sample_events_event ON sample_events (event_id);

-- Feedback that arrived after its generation's sample was final: recorded, never applied.
CREATE TABLE late_feedback (
    event_id        uuid        PRIMARY KEY,
    generation_id   uuid        NOT NULL,
    sample_id       text,
    type            text        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- Checkpoints and the manifest that describes each one.
CREATE TABLE checkpoints (
    checkpoint_id   text        PRIMARY KEY,
    parent_id       text        REFERENCES checkpoints (checkpoint_id),
    policy_version  integer     NOT NULL UNIQUE,
    base_model      text        NOT NULL,
    sample_count    integer     NOT NULL CHECK (sample_count >= 0),
    manifest        jsonb       NOT NULL,
    model_name      text,                       -- MLflow registered model
    model_version   integer,                    -- MLflow model version
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The sample offsets a checkpoint consumed, per partition: contiguous and disjoint across checkpoints.
CREATE TABLE checkpoint_offsets (
    checkpoint_id   text    NOT NULL REFERENCES checkpoints (checkpoint_id) ON DELETE CASCADE,
    topic           text    NOT NULL,
    kafka_partition integer NOT NULL,
    first_offset    bigint  NOT NULL,
    last_offset     bigint  NOT NULL,           -- inclusive
    PRIMARY KEY (checkpoint_id, topic, kafka_partition),
    CHECK (first_offset <= last_offset)
);

-- The samples a checkpoint trained on, by id (a sample trains at most one checkpoint).
CREATE TABLE checkpoint_samples (
    checkpoint_id   text NOT NULL REFERENCES checkpoints (checkpoint_id) ON DELETE CASCADE,
    sample_id       text NOT NULL UNIQUE,
    PRIMARY KEY (checkpoint_id, sample_id)
);

-- Gate evaluations of a candidate against the champion.
CREATE TABLE evaluations (
    evaluation_id       uuid        PRIMARY KEY,
    checkpoint_id       text        NOT NULL REFERENCES checkpoints (checkpoint_id),
    champion_version    integer,
    mlflow_run_id       text,
    metrics             jsonb       NOT NULL,
    decision            text        NOT NULL CHECK (decision IN ('promote', 'reject', 'hold')),
    reasons             jsonb       NOT NULL,
    decided_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX evaluations_checkpoint ON evaluations (checkpoint_id);

-- Every move of the champion alias, and every operator decision: who, when, from what to what, why.
CREATE TABLE promotions (
    id              bigserial   PRIMARY KEY,
    model_name      text        NOT NULL,
    action          text        NOT NULL CHECK (action IN ('promote', 'rollback', 'reject')),
    from_version    integer,
    to_version      integer,
    actor           text        NOT NULL,
    reason          text        NOT NULL,
    evaluation_id   uuid        REFERENCES evaluations (evaluation_id),
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX promotions_model_at ON promotions (model_name, at);
