"""The hot-swap controller: keeps an engine serving whatever the ``champion`` alias points at.

The alias in MLflow is the source of truth; the promotions topic only says "look now". The
controller reconciles at start, on every decision event for its model, and every
``reconcile_interval_s``. A swap is: download the version's folder, check every sha256 of its
manifest and that every weight is finite, ``engine.load`` it beside the current one (the engine
warms it up), ``engine.switch`` (atomic). Requests already running finish on the version they
started with, because the engine resolves a request's version once, when it starts.

In the gateway the registry calls (the alias, the download) and the checks are made by a helper
process (:mod:`serving.registry_worker`), so their CPU does not hold the GIL the HTTP event loop needs.

A failure at any step keeps the current champion serving, emits a :class:`SwapFailedEvent` on the
promotions topic and counts ``liveloop_serving_swap_failures_total``; a version refused by a check
or by the engine is not tried again by this process (download failures are retried next time).

Unloading, decided here: after a switch the previous champion stays loaded (``keep_previous``,
default on: a tiny or LoRA model costs little, and a rollback is then a switch, no download); any
other version is unloaded once ``unload_grace_s`` has passed, so that a request routed to it just
before the switch (e.g. by the canary router) still finds it loaded; the engine's ``unload`` then
waits for requests still running on it.

Staging: the ``candidate`` alias (the learner's newest checkpoint, under evaluation) is downloaded,
checked and loaded beside the champion, not served, ahead of its promotion (``stage_candidate``,
default on), when the learner announces it on the checkpoints topic and at every reconcile. Its
promotion is then a switch: none of the download's work (the registry's, the hashing) nor the load's
(which stalls the engine's running requests for a few ms) comes beside the requests of the swap. The
cost is memory: one more version loaded while a candidate waits (the vLLM engine only notes a full-weights
folder until its switch). A newer candidate replaces the staged one, which is unloaded at once: no
request runs on it. A candidate refused by a check or by the engine is reported (role ``candidate``)
before anyone promotes it.

Canary: with ``canary_fraction > 0`` the controller instead loads the ``candidate`` (when it is
neither the champion nor refused) and hands its policy version to the :class:`CanaryRouter`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from kafka import KafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError

from infra.producers import reliable_producer
from infra.registry import CANDIDATE, CHAMPION, AliasNotSet, RegistryError
from learner.manifest import CheckpointAnnouncement, CheckpointManifest
from serving.canary import CanaryRouter
from serving.engine import Engine, InferenceEngineError
from serving.errors import ServingError
from serving.promotions_contract import (
    InvalidPromotionsMessage,
    PromotionEvent,
    SwapFailedEvent,
    message_to_json,
    parse_message,
)
from serving.registry_worker import RegistryWorker
from serving.sanity import CheckpointRefused, check_checkpoint
from serving.settings import ServingSettings

log = logging.getLogger(__name__)
Role = Literal["champion", "candidate"]


class VersionSource(Protocol):
    """What the controller reads from the registry: an :class:`infra.registry.Registry`, or in the gateway
    a :class:`serving.registry_worker.RegistryWorker`, which makes the same calls from a helper process."""

    def alias_version(self, name: str, alias: str) -> int: ...

    def download(self, name: str, version: int, destination: Path) -> Path: ...


@dataclass(frozen=True)
class Loaded:
    """A model version loaded in the engine, with the policy version the engine knows it by (the learner
    makes the two one number; :func:`version_label` names both where they differ)."""

    model_version: int
    policy_version: int
    folder: Path

    @property
    def label(self) -> str:
        """How logs name it: ``version N``."""
        return version_label(self.model_version, self.policy_version)


def version_label(model_version: int, policy_version: int) -> str:
    """``version N`` when the MLflow version and the policy version are one number, as the learner makes
    them; both, labelled, when a checkpoint registered by other means makes them differ."""
    if model_version == policy_version:
        return f"version {model_version}"
    return f"MLflow version {model_version} (policy version {policy_version})"


class SwapController:
    """Follows the promotions topic and the registry aliases; loads, switches and unloads engine versions."""

    def __init__(
        self,
        engine: Engine,
        settings: ServingSettings,
        *,
        registry: VersionSource,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        """Configured by the gateway's settings (model, Kafka, topics and the ``swap_*``/``canary_*`` fields)."""
        self.engine = engine
        self.registry = registry
        self.model_name = settings.model_name
        self.bootstrap = settings.bootstrap
        self.topic = settings.promotions_topic
        self.checkpoints_topic = settings.checkpoints_topic
        self.work_dir = settings.swap_work_dir
        self.reconcile_interval_s = settings.swap_reconcile_interval_s
        self.keep_previous = settings.swap_keep_previous
        self.unload_grace_s = settings.swap_unload_grace_s
        self.stage_candidate = settings.swap_stage_candidate
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        metrics = metrics if metrics is not None else CollectorRegistry()
        self.router = CanaryRouter(settings.canary_fraction, metrics)
        self.champion: Loaded | None = None
        self.previous: Loaded | None = None
        self.canary: Loaded | None = None
        self.staged: Loaded | None = None  # the candidate, loaded and not served (see Staging)
        self.refused: set[int] = set()
        self._retiring: dict[int, tuple[float, Loaded]] = {}  # policy version -> (since, what)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer: Any = None
        self.swaps = Counter("liveloop_serving_swaps", "Completed switches of the champion.", registry=metrics)
        self.failures = Counter(
            "liveloop_serving_swap_failures", "Versions refused or failed to load.", ["stage"], registry=metrics
        )
        self.serving_version = Gauge(
            "liveloop_serving_champion_policy_version", "The policy version new requests get.", registry=metrics
        )

    # -- reconciling -----------------------------------------------------------------------------

    def reconcile(self) -> bool:
        """Bring the engine in line with the aliases; True if the champion changed. Never raises for a bad version."""
        with self._lock:
            changed = self._reconcile_champion()
            if self.router.fraction > 0:
                self._reconcile_canary()
            elif self.stage_candidate and not changed:
                # Not right after a swap: the candidate is then mostly the new champion, and the read
                # would come beside the swap's first requests. The next announcement or pass stages.
                self._stage_candidate()
            self._unload_retired()
            return changed

    def _alias(self, alias: str) -> int | None:
        try:
            return self.registry.alias_version(self.model_name, alias)
        except AliasNotSet:
            return None

    def _reconcile_champion(self) -> bool:
        try:
            wanted = self._alias(CHAMPION)
        except RegistryError as exc:
            log.warning("cannot read %s@%s, serving on: %s", self.model_name, CHAMPION, exc)
            return False
        if wanted is None or wanted in self.refused:
            return False
        if self.champion is not None and self.champion.model_version == wanted:
            return False
        loaded = self._ensure_loaded(wanted, "champion")
        if loaded is None:
            return False
        self.engine.switch(loaded.policy_version)
        old, self.champion = self.champion, loaded
        self.serving_version.set(loaded.policy_version)
        self.swaps.inc()
        if self.previous is not None and self.previous.policy_version != loaded.policy_version:
            self._retire(self.previous)
        self.previous = old if self.keep_previous else None
        if old is not None and not self.keep_previous:
            self._retire(old)
        if self.canary is not None and self.canary.policy_version == loaded.policy_version:
            self.router.set_candidate(None)  # the candidate became champion: it is the default now
            self.canary = None
        log.info("%s: serving %s", self.model_name, loaded.label)
        return True

    def _reconcile_canary(self) -> None:
        try:
            wanted = self._alias(CANDIDATE)
        except RegistryError as exc:
            log.warning("cannot read %s@%s: %s", self.model_name, CANDIDATE, exc)
            return
        champion = self.champion.model_version if self.champion else None
        if wanted is None or wanted == champion or wanted in self.refused:
            if self.canary is not None:
                self.router.set_candidate(None)
                self._retire(self.canary)
                self.canary = None
            return
        if self.canary is not None and self.canary.model_version == wanted:
            return
        loaded = self._ensure_loaded(wanted, "candidate")
        if loaded is None:
            return
        old, self.canary = self.canary, loaded
        self.router.set_candidate(loaded.policy_version)
        if old is not None:
            self._retire(old)

    def _stage_candidate(self) -> None:
        """Download, check and load the ``candidate`` ahead of its promotion, so that its swap is a switch.

        The candidate waits for its evaluation for minutes; its promotion should not wait for a download
        and a load too, nor put their work beside the requests of the swap.
        """
        try:
            wanted = self._alias(CANDIDATE)
        except RegistryError as exc:
            log.warning("cannot read %s@%s: %s", self.model_name, CANDIDATE, exc)
            return
        if self.staged is not None and self.staged.model_version == wanted:
            return
        self._drop_staged()
        if wanted is None or wanted in self.refused or self._known(wanted) is not None:
            return
        self.staged = staged = self._ensure_loaded(wanted, "candidate")
        if staged is not None:
            log.info("%s: staged candidate %s", self.model_name, staged.label)

    def _drop_staged(self) -> None:
        """Unload the staged candidate now: outside a canary no request is routed to it."""
        staged, self.staged = self.staged, None
        if staged is None:
            return
        # Its policy version may be another role's too, if the registry holds one checkpoint twice (adopted).
        if staged.policy_version not in {v.policy_version for v in self._roles()}:
            with contextlib.suppress(InferenceEngineError, ServingError):
                self.engine.unload(staged.policy_version)
        shutil.rmtree(staged.folder, ignore_errors=True)

    def _new_folder(self, model_version: int) -> Path:
        return self.work_dir / f"{self.model_name}-v{model_version}-{uuid.uuid4().hex[:8]}"

    def _roles(self) -> list[Loaded]:
        """The versions held in a role now: champion, previous, canary, staged candidate."""
        return [v for v in (self.champion, self.previous, self.canary, self.staged) if v is not None]

    def _known(self, model_version: int) -> Loaded | None:
        for item in (*self._roles(), *(entry[1] for entry in self._retiring.values())):
            if item.model_version == model_version:
                return item
        return None

    def _ensure_loaded(self, model_version: int, role: Role) -> Loaded | None:
        known = self._known(model_version)
        if known is not None and known.policy_version in self.engine.loaded_versions:
            self._retiring.pop(known.policy_version, None)
            if known is self.staged:
                self.staged = None  # it serves in its role from here on
            return known
        folder = self._new_folder(model_version)
        loaded = None
        try:
            files, manifest = self._fetch(model_version, folder)
            self._check_identity(model_version, manifest)
        except (RegistryError, OSError) as exc:
            self._failed(model_version, role, "download", str(exc), refuse=False)
        except CheckpointRefused as exc:
            self._failed(model_version, role, "verify", str(exc), refuse=True)
        else:
            loaded = self._load(Loaded(model_version, manifest.policy_version, folder), files, role)
        if loaded is None:
            shutil.rmtree(folder, ignore_errors=True)
        return loaded

    def _load(self, version: Loaded, files: Path, role: Role) -> Loaded | None:
        """``version`` once the engine has loaded ``files`` as its policy version; None, reported, if it cannot."""
        if version.policy_version in self.engine.loaded_versions:
            return version  # loaded before this controller knew of it (e.g. by the engine's own start-up): adopt it
        try:
            self.engine.load(files, version.policy_version)
        except (InferenceEngineError, ServingError, OSError, ValueError, RuntimeError) as exc:
            self._failed(version.model_version, role, "load", str(exc), refuse=True)
            return None
        return version

    def _fetch(self, model_version: int, folder: Path) -> tuple[Path, CheckpointManifest]:
        """Download a version into ``folder`` and check it: in the registry helper when there is one (the
        checks hash and read every file, which would hold this process's GIL), else here."""
        if isinstance(self.registry, RegistryWorker):
            return self.registry.download_checked(self.model_name, model_version, folder)
        files = self.registry.download(self.model_name, model_version, folder)
        return files, check_checkpoint(files)

    def _check_identity(self, model_version: int, manifest: CheckpointManifest) -> None:
        """CheckpointRefused if the version holds another model's checkpoint, or a policy version served already."""
        if manifest.model_name != self.model_name:
            raise CheckpointRefused(
                f"version {model_version} holds a checkpoint of {manifest.model_name}, not {self.model_name}", "verify"
            )
        clash = [
            v for v in (self.champion, self.canary, self.staged) if v and v.policy_version == manifest.policy_version
        ]
        if clash:
            raise CheckpointRefused(
                f"{version_label(model_version, manifest.policy_version)} has the policy version of "
                f"{clash[0].label}, already served",
                "verify",
            )

    def _failed(
        self, model_version: int, role: Role, stage: Literal["download", "verify", "load"], error: str, *, refuse: bool
    ) -> None:
        log.error("%s version %d (%s) refused at %s: %s", self.model_name, model_version, role, stage, error)
        self.failures.labels(stage).inc()
        if refuse:
            self.refused.add(model_version)
        event = SwapFailedEvent(
            model_name=self.model_name,
            model_version=model_version,
            role=role,
            stage=stage,
            error=error[:4000],
            serving_model_version=self.champion.model_version if self.champion else None,
            serving_policy_version=self.champion.policy_version if self.champion else None,
            instance=self.instance,
        )
        try:
            self._send(event)
        except Exception as exc:  # the metric and the log still say it; never let reporting stop serving
            log.error("could not publish swap-failed for version %d: %s", model_version, exc)

    def _retire(self, item: Loaded) -> None:
        self._retiring[item.policy_version] = (time.monotonic(), item)

    def _unload_retired(self) -> None:
        keep = {v.policy_version for v in self._roles()}
        now = time.monotonic()
        for version, (since, item) in list(self._retiring.items()):
            if version in keep:
                del self._retiring[version]
            elif now - since >= self.unload_grace_s:
                del self._retiring[version]
                with contextlib.suppress(InferenceEngineError, ServingError):
                    self.engine.unload(version)
                shutil.rmtree(item.folder, ignore_errors=True)

    # -- following the topic ---------------------------------------------------------------------

    def start(self) -> None:
        """Reconcile once (so the engine serves the champion when this returns), then follow in a thread."""
        consumer = self._consumer()
        self.reconcile()
        self._thread = threading.Thread(target=self._follow, args=(consumer,), name="liveloop-swap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following, and the registry helper process if given one; what is loaded stays loaded."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.close(timeout=5)
        if isinstance(self.registry, RegistryWorker):
            self.registry.close()

    def _consumer(self) -> Any:
        # No consumer group: every serving instance reads every decision (and every announcement), from
        # the end (the aliases cover everything before). Positions are resolved now, so no event after
        # start is missed.
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False)
        partitions = consumer.partitions_for_topic(self.topic) or {0}
        assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        if self.checkpoints_topic and self.stage_candidate:
            announced = consumer.partitions_for_topic(self.checkpoints_topic)
            if announced:
                assigned += [TopicPartition(self.checkpoints_topic, p) for p in sorted(announced)]
            else:  # the broker creates no topic on its own: positions in it would never resolve
                log.warning("no topic %s: candidates are staged by the periodic pass only", self.checkpoints_topic)
        consumer.assign(assigned)
        consumer.seek_to_end()
        for tp in assigned:
            consumer.position(tp)
        return consumer

    def _follow(self, consumer: Any) -> None:
        last = time.monotonic()
        try:
            while not self._stop.is_set():
                batches = consumer.poll(timeout_ms=200)
                wake = False
                for records in batches.values():
                    for record in records:
                        wake |= self._relevant(record.topic, record.value)
                if wake or time.monotonic() - last >= self.reconcile_interval_s:
                    last = time.monotonic()
                    self._safely(self.reconcile)
                elif self._retiring:
                    self._safely(self._unload_due)
        finally:
            consumer.close()

    def _unload_due(self) -> None:
        with self._lock:
            self._unload_retired()

    def _safely(self, step: Any) -> None:
        try:
            step()
        except Exception:  # the controller must outlive any one bad reconcile; the next tick retries
            log.exception("reconcile of %s failed; serving on", self.model_name)

    def _relevant(self, topic: str, value: bytes) -> bool:
        """A decision about this model, or a new candidate of it (to stage): worth a reconcile now."""
        if topic != self.topic:
            try:
                return CheckpointAnnouncement.model_validate_json(value).model_name == self.model_name
            except ValidationError as exc:
                log.warning("skipping a checkpoint announcement: %s", exc)
                return False
        try:
            message = parse_message(value)
        except InvalidPromotionsMessage as exc:
            log.warning("skipping a promotions message: %s", exc)
            return False
        return isinstance(message, PromotionEvent) and message.model_name == self.model_name

    def _send(self, event: SwapFailedEvent) -> None:
        if self._producer is None:
            self._producer = reliable_producer(self.bootstrap)
        self._producer.send(self.topic, key=self.model_name.encode(), value=message_to_json(event)).get(timeout=30)


def controller_from_settings(
    engine: Engine, settings: ServingSettings, metrics: CollectorRegistry | None = None
) -> SwapController:
    """The swap controller of a gateway, configured by its :class:`ServingSettings` (call ``start()`` on it)."""
    return SwapController(engine, settings, registry=RegistryWorker(settings.mlflow_url), metrics=metrics)
