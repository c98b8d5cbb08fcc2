"""The loop's own processes, as ``liveloop up`` starts them beside the services.

Each component is its stage's module run as a process, configured through that stage's settings
(environment variables) with the stack's endpoints filled in. Secrets (the database DSN) travel in
the environment, never on a command line. Paths are absolute, so components do not depend on the
directory they were started from.
"""

from __future__ import annotations

import sys

from infra.stack import ComponentSpec, Stack


def loop_components(stack: Stack) -> list[ComponentSpec]:
    """The ingest API, the archiver and the distiller, wired to ``stack``."""
    from distill.settings import DistillSettings
    from ingest.api import IngestSettings

    e = stack.endpoints
    topics = stack.topics
    state = stack.settings.state_dir.resolve()
    python = sys.executable
    api = IngestSettings(credentials_path=stack.settings.credentials_path.resolve())
    distill = DistillSettings(dsn=e.postgres_dsn)
    return [
        ComponentSpec(
            name="ingest-api",
            argv=[python, "-m", "ingest.api"],
            health_url=f"http://{api.host}:{api.port}/healthz",
            env={
                "LIVELOOP_INGEST_BOOTSTRAP": e.kafka_bootstrap,
                "LIVELOOP_INGEST_EVENTS_TOPIC": topics.events.name,
                "LIVELOOP_INGEST_DLQ_TOPIC": topics.events_dlq.name,
                "LIVELOOP_INGEST_CREDENTIALS_PATH": str(api.credentials_path),
            },
        ),
        ComponentSpec(
            name="archiver",
            argv=[python, "-m", "ingest.archiver"],
            env={
                "LIVELOOP_ARCHIVER_BOOTSTRAP": e.kafka_bootstrap,
                "LIVELOOP_ARCHIVER_DSN": e.dsn(),
                "LIVELOOP_ARCHIVER_EVENTS_TOPIC": topics.events.name,
                "LIVELOOP_ARCHIVER_DLQ_TOPIC": topics.events_dlq.name,
            },
            lag_group="liveloop-archiver",
            lag_topics=(topics.events.name, topics.events_dlq.name),
        ),
        ComponentSpec(
            name="distiller",
            argv=[python, "-m", "distill.app"],
            health_url=f"http://{distill.web_host}:{distill.web_port}/healthz",
            env={
                "LIVELOOP_DISTILL_BOOTSTRAP": e.kafka_bootstrap,
                "LIVELOOP_DISTILL_DSN": e.dsn(),
                "LIVELOOP_DISTILL_EVENTS_TOPIC": topics.events.name,
                "LIVELOOP_DISTILL_SAMPLES_TOPIC": topics.samples.name,
                "LIVELOOP_DISTILL_DLQ_TOPIC": topics.events_dlq.name,
                "LIVELOOP_DISTILL_PARTITIONS": str(topics.events.partitions),
                "LIVELOOP_DISTILL_DATA_DIR": str(state / "distill"),
            },
            lag_group=distill.app_id,
            lag_topics=(topics.events.name,),
        ),
    ]
