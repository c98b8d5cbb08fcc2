"""Provision external services for a cluster deployment: ``python -m infra.provision``.

``liveloop up`` migrates the audit store and provisions the topics itself before it starts anything; a
cluster deployment (``deploy/kubernetes/``) runs the components as pods against a Kafka and a PostgreSQL
it does not manage, so this one-shot command does those two steps there (the Kubernetes Job
``liveloop-provision``). Both are idempotent: run it on every deployment. The addresses come from
``StackSettings`` (``LIVELOOP_INFRA_KAFKA_BOOTSTRAP``, ``LIVELOOP_INFRA_POSTGRES_DSN``), the topics from
``TopicsSettings`` (``LIVELOOP_TOPICS_*``). Exit codes: 0 done, 2 invalid or missing settings, 1 a
service refused or could not be reached (the Job retries).
"""

from __future__ import annotations

import logging
import sys

from pydantic import ValidationError

from infra.errors import InfraError
from infra.migrations import migrate
from infra.settings import StackSettings, TopicsSettings
from infra.topics import ensure_topics

log = logging.getLogger("liveloop.provision")


def provision(settings: StackSettings, topics: TopicsSettings) -> tuple[list[int], dict[str, str]]:
    """Migrate the audit store and make the loop's topics exist; return the migrations applied and the topic actions.

    Raises :class:`ValueError` when either external address is unset: there is nothing local to fall back to.
    """
    bootstrap, dsn = settings.kafka_bootstrap, settings.postgres_dsn
    if bootstrap is None or dsn is None:
        missing = [
            name
            for name, value in (("LIVELOOP_INFRA_KAFKA_BOOTSTRAP", bootstrap), ("LIVELOOP_INFRA_POSTGRES_DSN", dsn))
            if value is None
        ]
        raise ValueError(f"set {' and '.join(missing)}: provisioning works on external services only")
    applied = migrate(dsn.get_secret_value())
    actions = ensure_topics(bootstrap, topics.all())
    return applied, actions


def main() -> None:
    """Entry point of ``python -m infra.provision``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        applied, actions = provision(StackSettings(), TopicsSettings())
    except (ValidationError, ValueError) as exc:
        log.error("invalid settings: %s", exc)
        sys.exit(2)
    except InfraError as exc:
        log.error("%s", exc)
        sys.exit(1)
    log.info("migrations applied now: %s", applied or "none (up to date)")
    for topic, action in sorted(actions.items()):
        log.info("topic %s: %s", topic, action)


if __name__ == "__main__":
    main()
