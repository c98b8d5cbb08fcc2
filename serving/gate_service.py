"""The evaluation gate as a service: ``python -m serving.gate_service``.

Follows the checkpoints topic in the consumer group ``group_id`` and evaluates each announced
candidate once (:class:`serving.gate.Gate`). Offsets are committed after each evaluation is recorded,
at least once: a crash mid-evaluation evaluates that candidate again, and a candidate that already has
a row in ``evaluations`` is skipped, so a re-delivered announcement is harmless. A transient failure
(MLflow or PostgreSQL away) leaves the announcement uncommitted; it is retried after ``retry_s``.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from kafka import KafkaConsumer, OffsetAndMetadata
from pydantic import ValidationError

from distill.samples import HeldOutRule, HeldOutSettings
from infra.registry import Registry
from learner.manifest import CheckpointAnnouncement
from serving.errors import ServingError
from serving.gate import Gate, GateError, GateResult
from serving.gate_policy import GatePolicy, load_policy
from serving.promotion import Promoter, PromotionError
from serving.regression import load_suite
from serving.settings import GateSettings

log = logging.getLogger(__name__)


class GateService:
    """Consumes announcements and runs the gate on each (see the module docstring)."""

    def __init__(
        self, settings: GateSettings, policy: GatePolicy | None = None, held_out: HeldOutRule | None = None
    ) -> None:
        self.settings = settings
        self.held_out = held_out if held_out is not None else HeldOutSettings().rule()
        self.policy = policy or (load_policy(settings.policy_path) if settings.policy_path else GatePolicy())
        self.suite = load_suite(settings.suite_path)
        self.registry = Registry(settings.mlflow_url)
        self.stopping = threading.Event()
        self.consumer: Any = KafkaConsumer(
            settings.checkpoints_topic,
            bootstrap_servers=settings.bootstrap,
            group_id=settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=1,  # an evaluation takes minutes: take one announcement at a time
            max_poll_interval_ms=3_600_000,
        )
        self._promoters: dict[str, Promoter] = {}

    def gate_for(self, model_name: str) -> Gate:
        """The gate of one registered model (announcements name their model)."""
        s = self.settings
        promoter = self._promoters.get(model_name)
        if promoter is None:  # one per model for the service's life: it keeps its Kafka producer
            promoter = self._promoters[model_name] = Promoter(
                registry=self.registry,
                dsn=s.dsn.get_secret_value(),
                bootstrap=s.bootstrap,
                topic=s.promotions_topic,
                model_name=model_name,
            )
        return Gate(
            registry=self.registry,
            dsn=s.dsn.get_secret_value(),
            promoter=promoter,
            policy=self.policy,
            suite=self.suite,
            held_out=self.held_out,
            max_held_out=s.max_held_out,
            work_dir=s.work_dir,
        )

    def run_once(self) -> list[GateResult]:
        """Poll once and evaluate what came; return the evaluations made now."""
        results: list[GateResult] = []
        for tp, records in self.consumer.poll(timeout_ms=self.settings.poll_timeout_ms).items():
            for record in records:
                try:
                    result = self._handle(record.value)
                except (GateError, PromotionError) as exc:
                    log.error(
                        "evaluation of offset %d failed, retrying in %.0fs: %s",
                        record.offset,
                        self.settings.retry_s,
                        exc,
                    )
                    self.consumer.seek(tp, record.offset)
                    self.stopping.wait(self.settings.retry_s)
                    return results
                if result is not None:
                    results.append(result)
                self.consumer.commit({tp: OffsetAndMetadata(record.offset + 1, "", -1)})
        return results

    def _handle(self, value: bytes) -> GateResult | None:
        try:
            announcement = CheckpointAnnouncement.model_validate_json(value)
        except ValidationError as exc:
            log.error("skipping an invalid announcement: %s", exc)
            return None
        gate = self.gate_for(announcement.model_name)
        if gate.already_evaluated(announcement.checkpoint_id):
            log.info("%s was evaluated before; skipping", announcement.checkpoint_id)
            return None
        result = gate.evaluate(announcement)
        log.info("%s: %s (%s)", announcement.checkpoint_id, result.decision, "; ".join(result.reasons))
        return result

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or :attr:`stopping` is set)."""
        try:
            while not self.stopping.is_set():
                self.run_once()
        finally:
            self.close()

    def close(self) -> None:
        """Close the consumer and the promoters' producers."""
        self.consumer.close()
        for promoter in self._promoters.values():
            promoter.close()


def main() -> int:
    """Entry point of ``python -m serving.gate_service``; exits 2 on invalid settings."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = GateSettings()  # type: ignore[call-arg]  # the DSN comes from the environment
        service = GateService(settings)
    except (ValidationError, ServingError) as exc:
        log.error("invalid gate settings (LIVELOOP_GATE_*, LIVELOOP_HELD_OUT_PERCENT), policy or suite:\n%s", exc)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: service.stopping.set())
    service.run_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
