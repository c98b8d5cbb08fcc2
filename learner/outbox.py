"""Checkpoints written but not yet published: published in order, retried, marked when done.

A checkpoint folder is complete once renamed into place; publishing (:func:`learner.publish.publish_checkpoint`,
idempotent) may still fail or be cut short by a crash. The marker ``<data_dir>/published/<id>`` (the
announcement, written after publishing returned) is what says it is done; at start every complete folder
without a marker is published again, oldest first (the audit store needs a parent before its child).
"""

from __future__ import annotations

import logging
import shutil
import time

from learner.errors import LearnerError
from learner.manifest import BASE_POLICY_VERSION, MANIFEST_FILE, read_manifest
from learner.metrics import PUBLISH_FAILURES
from learner.settings import LearnerSettings
from learner.state import TEMP_PREFIX, DataDir, read_state

log = logging.getLogger(__name__)


class PublishOutbox:
    """The ids of complete, unpublished checkpoints (the base model's excepted), oldest first."""

    def __init__(self, settings: LearnerSettings, data: DataDir) -> None:
        self.settings = settings
        self.data = data
        self.pending: list[str] = []
        self.last_try = 0.0

    def scan(self) -> None:
        """Find every complete checkpoint folder of our model that has no published marker."""
        found = []
        for folder in self.data.checkpoints.iterdir():
            if folder.name.startswith(TEMP_PREFIX) or not (folder / MANIFEST_FILE).is_file():
                continue
            if self.data.published_marker(folder.name).exists():
                continue
            manifest = read_manifest(folder)
            # The base is registered by init-base (register_base), never announced as a candidate.
            if manifest.policy_version > BASE_POLICY_VERSION and manifest.model_name == self.settings.model_name:
                found.append((manifest.policy_version, folder.name))
        self.pending = [name for _, name in sorted(found)] if self.settings.publishes else []

    def add(self, checkpoint_id: str) -> None:
        """A checkpoint was just renamed into place."""
        if self.settings.publishes:
            self.pending.append(checkpoint_id)

    def flush(self) -> None:
        """Publish pending checkpoints in order; stop at the first failure (kept for the next try)."""
        if not self.settings.publishes:
            return
        from learner.publish import publish_checkpoint

        self.last_try = time.monotonic()
        dsn = self.settings.dsn.get_secret_value() if self.settings.dsn else ""
        while self.pending:
            checkpoint_id = self.pending[0]
            try:
                announcement = publish_checkpoint(
                    self.data.checkpoint(checkpoint_id),
                    dsn=dsn,
                    mlflow_uri=self.settings.mlflow_uri or "",
                    bootstrap=self.settings.bootstrap,
                    checkpoints_topic=self.settings.checkpoints_topic,
                    samples_topic=self.settings.samples_topic,
                    sample_ids=read_state(self.data.state_of(checkpoint_id)).checkpoint_sample_ids,
                )
            except LearnerError as exc:
                PUBLISH_FAILURES.inc()
                log.error("publishing %s failed (retried later and at the next start): %s", checkpoint_id, exc)
                return
            marker = self.data.published_marker(checkpoint_id)
            temporary = marker.with_name(f".{marker.name}.tmp")
            temporary.write_text(announcement.model_dump_json(indent=1), encoding="utf-8")
            temporary.replace(marker)
            self.pending.pop(0)
            log.info(
                "published %s as %s version %d", checkpoint_id, announcement.model_name, announcement.model_version
            )

    def prune_states(self, newest_policy_version: int) -> None:
        """Delete training states older than the newest two, once their checkpoint is published (or
        publishing is off): a restart only ever resumes from the newest."""
        for folder in self.data.state.iterdir():
            if folder.name.startswith(TEMP_PREFIX) or folder.name in self.pending:
                continue
            if read_state(folder).policy_version < newest_policy_version - 1:
                shutil.rmtree(folder)
