"""Following the champion: the learner's line always descends from the model serving promoted.

When the gate rejects a candidate, training on from it would pile more updates on weights that already
failed (in one run, three candidates in a row drifted 0.43 -> 1.61 -> 2.52 nats from the champion while the
champion stayed put). Like TFX, which warm-starts each training from the latest *blessed* model, the learner
**rebases**: it loads the champion's weights, starts a fresh optimizer (Adam's moments of another line mean
nothing here), takes the champion as its KL reference, and trains the rounds of the current cycle again on
top of it, read back from their journaled offset ranges: what it learned since its last checkpoint is kept
as *samples*, not weights. Samples that trained the rejected checkpoint stay with it: a sample trains one
checkpoint at most, so they are not trained again (and the audit store's one-checkpoint-per-sample holds).

When: at round boundaries, with the champion alias read at most every ``champion_poll_s`` seconds, and
before every checkpoint (read fresh). A candidate still under evaluation is no reason to rebase (the learner
keeps training on it, optimistically); the learner rebases when the champion is not on its line (an operator
promoted or rolled back to another version) or when a checkpoint on its line after the champion was rejected
or rolled back (the ``liveloop.status`` tag serving's promotion sets on a version it decided about).

The rebase is journaled (:class:`learner.rounds.RebaseEntry`) before it acts, so a crash anywhere replays it.
Without a registry (publishing off) there is no champion: the learner follows its own line, as before.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from learner.manifest import MANIFEST_FILE, read_manifest, verify_checkpoint
from learner.settings import LearnerSettings
from learner.state import TEMP_PREFIX, DataDir, StateError

log = logging.getLogger(__name__)

STATUS_TAG = "liveloop.status"
"""The tag serving's promotion sets on a version it decided about (serving.promotion.TAG_STATUS; the learner,
one floor below serving, reads the registry rather than importing it)."""
LEFT_STATUSES = frozenset({"rejected", "rolled-back"})
"""Versions the learner does not build on: refused by the gate, or taken out of production by a rollback."""
CHAMPIONS_FOLDER = "champions"
"""Under ``data_dir``: champions the learner did not write, downloaded from the registry and verified."""


@dataclass(frozen=True)
class Champion:
    """The version the ``champion`` alias points at, and its checkpoint id."""

    version: int
    checkpoint_id: str


class ChampionWatch:
    """Reads the registry's champion (cached for ``champion_poll_s``) and decides when the learner rebases."""

    def __init__(self, settings: LearnerSettings, data: DataDir) -> None:
        self.settings = settings
        self.data = data
        self.champions = data.root / CHAMPIONS_FOLDER
        self.current: Champion | None = None
        self._read_at = float("-inf")
        self._rejected: set[int] = set()  # left for good: a rejected version is never promoted, not asked again

    def champion(self, fresh: bool) -> Champion | None:
        """The champion, read again when ``fresh`` or the cached one is older than ``champion_poll_s``; None
        without a registry or before the first champion. A registry that cannot be read keeps the last answer."""
        if not self.settings.publishes:
            return None
        if not fresh and time.monotonic() - self._read_at < self.settings.champion_poll_s:
            return self.current
        from infra.registry import CHAMPION, AliasNotSet, Registry, RegistryError

        registry = Registry(self.settings.mlflow_uri or "")
        try:
            found = registry.version_by_alias(self.settings.model_name, CHAMPION)
        except AliasNotSet:
            self.current = None
        except RegistryError as exc:
            log.warning("the champion could not be read (%s); following the learner's own line meanwhile", exc)
            return self.current
        else:
            version = int(found.version)
            checkpoint_id = found.tags.get("liveloop.checkpoint_id") or self._id_for(version)
            self.current = Champion(version=version, checkpoint_id=checkpoint_id)
        self._read_at = time.monotonic()
        return self.current

    def _id_for(self, version: int) -> str:
        from learner.checkpoint import checkpoint_id_for

        return checkpoint_id_for(self.settings.model_name, version)

    def rebase_target(self, head: str, fresh: bool) -> Champion | None:
        """The champion to rebase onto, or None to train on from ``head`` (the checkpoint the weights descend from)."""
        champion = self.champion(fresh)
        if champion is None:
            return None
        # Read back from the head only as far as the champion (a long lineage is not read at every round).
        segment: list[tuple[str, int]] = []
        for checkpoint_id, version in self.line(head):
            if checkpoint_id == champion.checkpoint_id:
                break
            segment.append((checkpoint_id, version))
        else:
            log.info("the champion %s is not on the learner's line (head %s): rebasing", champion.checkpoint_id, head)
            return champion
        for checkpoint_id, version in segment:
            if self._is_rejected(version):
                log.info("%s was rejected or rolled back: rebasing onto %s", checkpoint_id, champion.checkpoint_id)
                return champion
        return None

    def _is_rejected(self, version: int) -> bool:
        if version in self._rejected:
            return True
        from infra.registry import Registry, RegistryError

        try:
            tags = Registry(self.settings.mlflow_uri or "").version_tags(self.settings.model_name, version)
        except RegistryError as exc:
            log.warning("could not read whether version %d was rejected (%s); assuming not", version, exc)
            return False
        if tags.get(STATUS_TAG) in LEFT_STATUSES:
            self._rejected.add(version)
            return True
        return False

    def line(self, head: str) -> Iterator[tuple[str, int]]:
        """(checkpoint id, version) of ``head`` and its ancestors, newest first, as far as local manifests go."""
        visited: set[str] = set()
        checkpoint_id: str | None = head
        while checkpoint_id is not None and checkpoint_id not in visited:
            folder = self.local(checkpoint_id)
            if folder is None:
                return
            visited.add(checkpoint_id)
            manifest = read_manifest(folder)
            yield checkpoint_id, manifest.policy_version
            checkpoint_id = manifest.parent_id

    def local(self, checkpoint_id: str) -> Path | None:
        """The local folder of ``checkpoint_id``: written by this learner, or a champion downloaded before."""
        for folder in (self.data.checkpoint(checkpoint_id), self.champions / checkpoint_id):
            if (folder / MANIFEST_FILE).is_file():
                return folder
        return None

    def folder_of(self, checkpoint_id: str, version: int) -> Path:
        """The weights of checkpoint ``checkpoint_id`` (version ``version``): local, or downloaded from the
        registry and verified against its manifest (then kept under ``champions/``)."""
        folder = self.local(checkpoint_id)
        if folder is not None:
            return folder
        if not self.settings.publishes:
            raise StateError(f"checkpoint {checkpoint_id} is not in {self.data.checkpoints} and there is no registry")
        from infra.registry import Registry

        self.champions.mkdir(parents=True, exist_ok=True)
        temporary = self.champions / f"{TEMP_PREFIX}{checkpoint_id}"
        if temporary.exists():
            shutil.rmtree(temporary)
        downloaded = Registry(self.settings.mlflow_uri or "").download(self.settings.model_name, version, temporary)
        manifest = verify_checkpoint(downloaded)
        if manifest.checkpoint_id != checkpoint_id:
            raise StateError(
                f"{self.settings.model_name} version {version} holds {manifest.checkpoint_id}, not {checkpoint_id}"
            )
        final = self.champions / checkpoint_id
        downloaded.rename(final)
        shutil.rmtree(temporary, ignore_errors=True)
        return final
