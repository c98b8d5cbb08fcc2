"""The loop's own processes, as ``liveloop up`` starts them beside the services.

Each component is its stage's module run as a process, configured through that stage's settings
(environment variables) with the stack's endpoints filled in. Secrets (the database DSN) travel in
the environment, never on a command line. Paths are absolute, so components do not depend on the
directory they were started from.
"""

from __future__ import annotations

import json
import sys

from infra.stack import ComponentSpec, Stack


def loop_components(stack: Stack) -> list[ComponentSpec]:
    """The whole loop wired to ``stack``: ingest API, archiver, distiller, learner, gate, gateway and the ops
    dashboard (which watches the others); the ingest API and the gateway in as many replicas as
    ``ReplicasSettings`` says (``gateway-2``... on the next ports).

    Settings that are not endpoints (the learner's cadence, the gateway's port...) come from the
    environment of ``liveloop up`` as each stage's ``LIVELOOP_<STAGE>_*`` variables; the endpoints
    below take precedence.
    """
    from distill.settings import DistillSettings
    from ingest.settings import IngestSettings
    from learner.settings import LearnerSettings
    from liveloop.settings import ReplicasSettings
    from serving.settings import ServingSettings

    e = stack.endpoints
    topics = stack.topics
    state = stack.settings.state_dir.resolve()
    python = sys.executable
    api = IngestSettings(credentials_path=stack.settings.credentials_path.resolve())
    distill = DistillSettings(dsn=e.postgres_dsn)
    learner = LearnerSettings()
    serving = ServingSettings()
    replication = stack.replication
    replicas = ReplicasSettings()
    stages = [
        *[
            ComponentSpec(
                name=_replica_name("ingest-api", n),
                argv=[python, "-m", "ingest.api"],
                health_url=f"http://{api.host}:{api.port + n - 1}/healthz",
                env={
                    "LIVELOOP_INGEST_PORT": str(api.port + n - 1),
                    "LIVELOOP_INGEST_BOOTSTRAP": e.kafka_bootstrap,
                    "LIVELOOP_INGEST_EVENTS_TOPIC": topics.events.name,
                    "LIVELOOP_INGEST_DLQ_TOPIC": topics.events_dlq.name,
                    "LIVELOOP_INGEST_CREDENTIALS_PATH": str(api.credentials_path),
                    # Validation and redaction in a worker process beside the event loop: 7.5k -> 21k events/s
                    # on 2 cores.
                    "LIVELOOP_INGEST_CPU_WORKERS": "1",
                },
            )
            for n in range(1, replicas.ingest_api + 1)
        ],
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
            # Feedback that joined no generation, and generations with none: a backend wired wrongly shows here.
            status_url=f"http://{distill.web_host}:{distill.web_port}/status",
            env={
                "LIVELOOP_DISTILL_BOOTSTRAP": e.kafka_bootstrap,
                "LIVELOOP_DISTILL_DSN": e.dsn(),
                "LIVELOOP_DISTILL_EVENTS_TOPIC": topics.events.name,
                "LIVELOOP_DISTILL_SAMPLES_TOPIC": topics.samples.name,
                "LIVELOOP_DISTILL_DLQ_TOPIC": topics.events_dlq.name,
                "LIVELOOP_DISTILL_PARTITIONS": str(topics.events.partitions),
                # Its own topics (changelogs...) replicated as the loop's, so that a broker's loss stops nothing.
                "LIVELOOP_DISTILL_REPLICATION_FACTOR": str(replication.factor),
                "LIVELOOP_DISTILL_MIN_INSYNC_REPLICAS": str(replication.min_insync),
                "LIVELOOP_DISTILL_DATA_DIR": str(state / "distill"),
            },
            lag_group=distill.app_id,
            lag_topics=(topics.events.name,),
        ),
        ComponentSpec(
            name="learner",
            argv=[python, "-m", "learner.service"],
            health_url=f"http://{learner.status_host}:{learner.status_port}/healthz",
            status_url=f"http://{learner.status_host}:{learner.status_port}/status",
            env={
                "LIVELOOP_LEARNER_BOOTSTRAP": e.kafka_bootstrap,
                "LIVELOOP_LEARNER_DSN": e.dsn(),
                "LIVELOOP_LEARNER_MLFLOW_URI": e.mlflow_url,
                "LIVELOOP_LEARNER_SAMPLES_TOPIC": topics.samples.name,
                "LIVELOOP_LEARNER_CHECKPOINTS_TOPIC": topics.checkpoints.name,
                "LIVELOOP_LEARNER_DATA_DIR": str(state / "learner"),
            },
            lag_group=learner.consumer_group,
            lag_topics=(topics.samples.name,),
            # A rendezvous inherited from the caller (a test process, a torchrun job) would make the learner
            # join that process group's port instead of making its own.
            clear_env=("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ),
        ComponentSpec(
            name="gate",
            argv=[python, "-m", "serving.gate_service"],
            env={
                "LIVELOOP_GATE_BOOTSTRAP": e.kafka_bootstrap,
                "LIVELOOP_GATE_DSN": e.dsn(),
                "LIVELOOP_GATE_MLFLOW_URL": e.mlflow_url,
                "LIVELOOP_GATE_CHECKPOINTS_TOPIC": topics.checkpoints.name,
                "LIVELOOP_GATE_PROMOTIONS_TOPIC": topics.promotions.name,
                "LIVELOOP_GATE_WORK_DIR": str(state / "gate"),
            },
            lag_group="liveloop-gate",
            lag_topics=(topics.checkpoints.name,),
        ),
        *[
            ComponentSpec(
                name=_replica_name("gateway", n),
                argv=[python, "-m", "serving.gateway"],
                health_url=f"http://{serving.host}:{serving.port + n - 1}/healthz",
                env={
                    "LIVELOOP_SERVING_PORT": str(serving.port + n - 1),
                    "LIVELOOP_SERVING_BOOTSTRAP": e.kafka_bootstrap,
                    "LIVELOOP_SERVING_EVENTS_TOPIC": topics.events.name,
                    "LIVELOOP_SERVING_PROMOTIONS_TOPIC": topics.promotions.name,
                    "LIVELOOP_SERVING_CHECKPOINTS_TOPIC": topics.checkpoints.name,
                    "LIVELOOP_SERVING_MLFLOW_URL": e.mlflow_url,
                    "LIVELOOP_SERVING_CREDENTIALS_PATH": str(stack.settings.credentials_path.resolve()),
                    # Each replica its own journal (one writer per journal) and its own downloaded checkpoints.
                    "LIVELOOP_SERVING_SDK_JOURNAL_DIR": str(state / f"{_replica_name('gateway', n)}-journal"),
                    "LIVELOOP_SERVING_SWAP_WORK_DIR": str(state / f"{_replica_name('gateway', n)}-swap"),
                },
            )
            for n in range(1, replicas.gateway + 1)
        ],
    ]
    return [*stages, _dashboard(stack, stages)]


def _replica_name(component: str, n: int) -> str:
    """Replica ``n`` (from 1) of ``component``: the first keeps the component's own name (its state, its logs)."""
    return component if n == 1 else f"{component}-{n}"


def _dashboard(stack: Stack, stages: list[ComponentSpec]) -> ComponentSpec:
    """The ops dashboard, told where each stage answers so that its overview shows them as ``status`` does."""
    from liveloop.dashboard.settings import DashboardSettings

    e = stack.endpoints
    dashboard = DashboardSettings()
    probes = [
        {
            "name": spec.name,
            "health_url": spec.health_url,
            "status_url": spec.status_url,
            "lag_group": spec.lag_group,
            "lag_topics": list(spec.lag_topics),
            "keeper_state": str(stack.keeper_state_path(spec.name).resolve()) if spec.restart else None,
        }
        for spec in stages
    ]
    return ComponentSpec(
        name="dashboard",
        argv=[sys.executable, "-m", "liveloop.dashboard"],
        health_url=f"http://{dashboard.host}:{dashboard.port}/healthz",
        env={
            "LIVELOOP_DASHBOARD_DSN": e.dsn(),
            "LIVELOOP_DASHBOARD_MLFLOW_URL": e.mlflow_url,
            "LIVELOOP_DASHBOARD_BOOTSTRAP": e.kafka_bootstrap,
            "LIVELOOP_DASHBOARD_PROMOTIONS_TOPIC": stack.topics.promotions.name,
            "LIVELOOP_DASHBOARD_CREDENTIALS_PATH": str(stack.settings.credentials_path.resolve()),
            "LIVELOOP_DASHBOARD_COMPONENTS": json.dumps(probes),
        },
    )
