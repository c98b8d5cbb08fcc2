"""The long-running learner: ``python -m learner.service`` (one process per rank).

Rank 0 consumes the samples topic, runs intake, journals and plans rounds, writes and publishes
checkpoints, and serves ``/status``; it tells the other ranks what to do with
``torch.distributed.broadcast_object_list`` (a round's packed batches, save/load state, stop), so only
rank 0 talks to Kafka and every rank trains on the same batches (each its share of every batch).

The order that makes a crash anywhere harmless (see :mod:`learner.rounds`, :mod:`learner.state`):
journal a round, then train it; journal a checkpoint intent, then save the state (temp, rename), then the
published folder (temp, rename), then publish, then mark it published. A restart deletes temporaries and
orphan states, re-publishes an unpublished checkpoint, loads the newest state and replays the journal.
The line follows the champion (:mod:`learner.lineage`): a rebase is journaled before the weights change.
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

from distill.samples import HeldOutRule, HeldOutSettings
from learner.baseline import EmaBaseline
from learner.checkpoint import (
    CycleRecord,
    base_tokenizer,
    build_manifest,
    check_lineage_held_out,
    checkpoint_id_for,
    next_policy_version,
    pause_if,
    write_base_checkpoint,
    write_checkpoint_folder,
)
from learner.engine import LearnerEngine, base_model_label, init_distributed
from learner.errors import LearnerError
from learner.intake import Intake, recent_seen
from learner.lineage import ChampionWatch
from learner.manifest import BASE_POLICY_VERSION, ManifestError, OffsetRange
from learner.metrics import (
    CHECKPOINT_SECONDS,
    CHECKPOINTS,
    LAG,
    POLICY_VERSION,
    ROUNDS,
    SAMPLES_INVALID,
    SAMPLES_SINCE_CHECKPOINT,
    STEP,
    STEPS,
)
from learner.outbox import PublishOutbox
from learner.rounds import CheckpointEntry, RebaseEntry, RoundEntry, RoundJournal, plan_round, round_ranges
from learner.settings import LearnerSettings
from learner.source import Polled, SampleSource, read_ranges
from learner.state import (
    DataDir,
    StateError,
    TrainingState,
    commit_folder,
    fresh_state,
    read_state,
    write_state_file,
)
from learner.status import StatusBoard, StatusServer
from learner.trajectories import TrajectoryHold

log = logging.getLogger("learner")

HEARTBEAT_S = 10.0  # idle ranks wait in a broadcast; keep it well inside the process group's timeout
LAG_EVERY_S = 5.0
PUBLISH_RETRY_S = 30.0
BUFFER_ROUNDS = 8
"""Polled records (trainable or not) that make a round on their own, in rounds' worth of samples."""


class Learner:
    """One rank of the learner. Rank 0 calls :meth:`run`, the others :meth:`follow`."""

    def __init__(self, settings: LearnerSettings, engine: LearnerEngine, held_out: HeldOutRule | None = None) -> None:
        self.settings = settings
        # The deployment's one held-out split (LIVELOOP_HELD_OUT_PERCENT), skipped by intake, named in manifests.
        self.held_out = held_out if held_out is not None else HeldOutSettings().rule()
        self.engine = engine
        self.rank, self.world_size = engine.rank, engine.world_size
        self.data = DataDir(settings.data_dir)
        self.board = StatusBoard()
        self.stopping = False
        self.base_label = base_model_label(settings.base_model)
        self.source: SampleSource | None = None
        self.server: StatusServer | None = None
        self.outbox = PublishOutbox(settings, self.data)
        self.watch = ChampionWatch(settings, self.data)
        self._last_told = time.monotonic()
        self._last_lag = 0.0
        self._lag: dict[int, int] = {}
        # Records polled but not yet in a round. Kept across a checkpoint (never dropped): their offsets
        # lie beyond the checkpoint's positions, so the next round's ranges cover them.
        self.buffer: list[Polled] = []
        self.buffer_ids: set[str] = set()
        self.buffer_estimate = 0
        self.buffer_last: dict[int, int] = {}

    # -- talking to the other ranks ------------------------------------------------------------

    def _tell(self, *command: Any) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.broadcast_object_list([command], src=0)
            self._last_told = time.monotonic()

    def follow(self) -> None:
        """Ranks above 0: do what rank 0 says until it says stop."""
        import torch.distributed as dist

        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            name, *args = box[0]
            if name == "stop":
                return
            if name == "round":
                batches, first_step = args
                for index, batch in enumerate(batches):
                    self.engine.train_step(batch, first_step + index)
            elif name == "save_state":
                self.engine.save_state(Path(args[0]))
            elif name == "load_state":
                self.engine.load_state(Path(args[0]))
            elif name == "refresh":
                self.engine.refresh_reference(Path(args[0]) if args[0] else None)
            elif name == "rebase":
                self.engine.rebase(Path(args[0]))

    def request_stop(self, signum: int, _frame: Any) -> None:
        """Signal handler: finish the current round, checkpoint what is pending, exit (only sets a flag:
        logging from a handler can deadlock on the logging lock)."""
        self.stopping = True

    # -- rank 0 ---------------------------------------------------------------------------------

    def run(self) -> None:
        """Recover, then consume, train and checkpoint until asked to stop."""
        self.server = StatusServer(self.board, self.settings.status_host, self.settings.status_port)
        self.server.start()
        try:
            self.board.update(state="recovering", status_port=self.server.port)
            self.recover()
            self.board.update(state="running", activity="waiting")  # activity: waiting, training, checkpointing
            while not self.stopping:
                polled = self.source_.poll(self.settings.poll_timeout_ms)
                self._take(polled)
                due = self._checkpoint_due()  # once: a checkpoint always takes the buffer in a round first
                # Records intake will drop (stale, held out...) do not count towards a round, yet they must not
                # pile up: a buffer of them alone also makes a round, which drops them and moves the positions on.
                # ...and when nothing more arrives, a buffer of nothing but such records goes too (a tail).
                flooded = len(self.buffer) >= BUFFER_ROUNDS * self.settings.round_samples or (
                    not polled and self.buffer_estimate == 0
                )
                if self.buffer and (due or flooded or self.buffer_estimate >= self.settings.round_samples):
                    self._round_live()
                if due and self.cycle.sample_ids:
                    self._checkpoint(None)
                self._housekeeping()
            self.board.update(state="stopping")
            log.info("stopping: a final checkpoint if samples are pending")
            if self.buffer:
                self._round_live()
            if self.cycle.sample_ids:
                self._checkpoint(None)
            self.board.update(state="stopped")
        except BaseException:
            self.board.update(state="failed")
            raise
        finally:
            self._tell("stop")
            if self.source is not None:
                self.source.close()
            self.server.stop()

    @property
    def source_(self) -> SampleSource:
        if self.source is None:
            raise LearnerError("the sample source is not open yet")
        return self.source

    def recover(self) -> None:
        """Start from the newest complete checkpoint; publish what is unpublished; replay the journal."""
        self.data.make()
        self.journal = RoundJournal(self.settings.data_dir)
        for path in self.data.remove_temporaries():
            log.warning("deleted the half-written %s", path)
        newest = self.data.newest_checkpoint(self.settings.model_name)
        if newest is None and self.settings.publishes:
            self._init_base()  # the audit store and the registry need the base (version 1) before version 2
            newest = self.data.newest_checkpoint(self.settings.model_name)
        if newest is not None:
            check_lineage_held_out(newest, self.held_out)
        if newest is None or newest.policy_version == BASE_POLICY_VERSION:
            base_id = (
                newest.checkpoint_id if newest else checkpoint_id_for(self.settings.model_name, BASE_POLICY_VERSION)
            )
            state = fresh_state(base_id, datetime.now(UTC))
            orphans = self.data.remove_orphan_states(BASE_POLICY_VERSION, None)
        else:
            folder = self.data.state_of(newest.checkpoint_id)
            if not folder.is_dir():
                raise StateError(
                    f"checkpoint {newest.checkpoint_id} has no training state in {folder}; restore it, or move the "
                    "checkpoint folder away to resume from the one before"
                )
            orphans = self.data.remove_orphan_states(newest.policy_version, newest.checkpoint_id)
            state = read_state(folder)
            self._tell("load_state", str(folder))
            self.engine.load_state(folder)
            self._refresh_reference(state.reference_id or state.checkpoint_id, state.checkpoint_id)
        for path in orphans:
            log.warning("deleted the orphan state %s (its checkpoint was never completed)", path)
        # Positions come from the checkpoint's manifest (the contract), never from committed group offsets.
        positions = dict(newest.positions.get(self.settings.samples_topic, {})) if newest else {}
        self._adopt(state, positions)
        self.outbox.scan()
        self._publish()
        self.source = SampleSource(self.settings.bootstrap, self.settings.samples_topic, self.settings.consumer_group)
        self.positions = self.source.start_positions(positions)
        journal_entries = self.journal.after(state.checkpoint_id)
        if journal_entries:
            log.info("replaying %d journal entries after %s", len(journal_entries), state.checkpoint_id)
        for index, entry in enumerate(journal_entries):
            if entry.parent != self.last.checkpoint_id:
                raise StateError(
                    f"{self.journal.path}: entry {entry} follows {entry.parent}, but the newest checkpoint is "
                    f"{self.last.checkpoint_id}; the journal does not belong to these checkpoints"
                )
            if isinstance(entry, RoundEntry):
                self._round(read_ranges(self.settings.bootstrap, entry.ranges), entry.ranges, replay=entry)
            elif isinstance(entry, RebaseEntry):
                self._rebase(entry, [e for e in journal_entries[:index] if isinstance(e, RoundEntry)])
            else:
                self._checkpoint(entry)
        self.source_.seek(self.positions)
        self._housekeeping(force_lag=True)

    @cached_property
    def tokenizer(self) -> Any | None:
        """The base model's tokenizer, loaded the first time a round has credited spans to map onto tokens."""
        return base_tokenizer(self.settings.base_model)

    def _init_base(self) -> None:
        """Write and register the base model as version 1 (what ``liveloop learner init-base`` does)."""
        from learner.publish import register_base

        source = None if self.settings.base_model == "tiny" else Path(self.settings.base_model)
        folder = write_base_checkpoint(self.settings.data_dir, self.settings.model_name, source, self.held_out)
        dsn = self.settings.dsn.get_secret_value() if self.settings.dsn else ""
        register_base(folder, mlflow_uri=self.settings.mlflow_uri or "", dsn=dsn)
        log.info("wrote and registered the base model %s", folder)

    def _adopt(self, state: TrainingState, positions: dict[int, int]) -> None:
        """Make ``state`` (a checkpoint's) the starting point of a new cycle."""
        self.last = state
        self.step, self.round = state.step, state.round
        self.positions = dict(positions)
        self.baseline = EmaBaseline(self.settings.baseline_decay)
        self.baseline.load_state_dict(state.baseline)
        self.seen_ids = list(state.seen_sample_ids)
        self.seen_versions = list(state.seen_policy_versions)
        self.seen_versions += [state.policy_version] * (len(self.seen_ids) - len(self.seen_versions))
        self.intake = Intake(state.policy_version, self.settings.max_staleness, self.seen_ids, self.held_out)
        self.hold = TrajectoryHold(self.settings.trajectory_wait_rounds, state.held_trajectories)
        self.cycle = CycleRecord()
        # The line: the checkpoint the weights descend from (the champion after a rebase), the KL reference
        # of this cycle, and the checkpoint a rebase left (None until one happens).
        self.head = state.checkpoint_id
        self.reference_id = state.reference_id or state.checkpoint_id
        self.rebased_from: str | None = None

    # -- rounds -------------------------------------------------------------------------------

    def _take(self, polled: list[Polled]) -> None:
        for record in polled:
            self.buffer.append(record)
            self.buffer_last[record.partition] = record.offset
            sample = record.sample
            # An estimate of what intake will accept (it admits for real at round time, in offset order).
            if (
                sample is not None
                and sample.sample_id not in self.buffer_ids
                and self.intake.reason_to_drop(sample) is None
            ):
                self.buffer_ids.add(sample.sample_id)
                self.buffer_estimate += 1

    def _round_live(self) -> None:
        self._follow_champion(fresh=False)
        ranges = round_ranges(self.settings.samples_topic, self.positions, self.buffer_last)
        records = sorted(self.buffer, key=lambda r: (r.partition, r.offset))
        self.buffer, self.buffer_ids, self.buffer_estimate, self.buffer_last = [], set(), 0, {}
        self._round(records, ranges, replay=None)
        # For lag reporting only (positions are never read back from the group): the round is journaled,
        # so its records are processed, whether intake kept any of them or not. Committed only at
        # checkpoints, a stream of samples intake drops (stale ones, say) never reached a checkpoint,
        # and the group's lag grew without end while the learner was caught up.
        self.source_.commit(self.positions)

    def _round(self, records: list[Polled], ranges: list[OffsetRange], replay: RoundEntry | None) -> None:
        """Journal (unless replaying) and train one round on ``records`` (sorted by partition, offset)."""
        self.board.update(activity="training")
        if replay is None:
            self.journal.append(RoundEntry(round=self.round + 1, parent=self.last.checkpoint_id, ranges=ranges))
        elif replay.round != self.round + 1:
            raise StateError(f"journal round {replay.round} cannot follow round {self.round}; the journal is damaged")
        self.round += 1
        accepted = []  # what trains in this round: admitted samples, agent ones once their trajectory is whole
        for record in records:
            if record.sample is None:
                SAMPLES_INVALID.inc()
                continue
            reason = self.intake.admit(record.sample)
            if reason is None:  # seen from now on, even while its trajectory waits (the checkpoint keeps it)
                self.seen_ids.append(record.sample.sample_id)
                self.seen_versions.append(record.sample.policy_version)
            if reason != "duplicate":
                accepted += self.hold.offer(record.sample, admitted=reason is None)
        accepted += self.hold.end_round()
        batches = plan_round(
            accepted,
            self.baseline,
            self.settings.token_budget,
            shaping=self.settings.shaping(),
            first_step=self.step,
            weighting=self.settings.loss_weighting,
            min_advantage=self.settings.min_advantage,
            tokenizer=self.tokenizer if any(s.agent is not None and s.agent.spans for s in accepted) else None,
        )
        batches = [batch for _ in range(self.settings.epochs) for batch in batches]  # pass after pass, each its steps
        self.cycle.add_ranges(ranges)
        for sample in accepted:
            self.cycle.sample_ids.append(sample.sample_id)
            self.cycle.rewards.append(sample.reward)  # unshaped: what the gate judges
            self.cycle.spec_hashes.add(sample.spec_hash)
        for r in ranges:
            self.positions[r.partition] = r.last_offset + 1
        self._tell("round", batches, self.step)
        for index, batch in enumerate(batches):
            metrics = self.engine.train_step(batch, self.step)
            self.step += 1
            STEPS.inc()
            self.cycle.add_metrics(
                {
                    "loss": metrics.loss,
                    "pg_loss": metrics.pg_loss,
                    "kl": metrics.kl,
                    "mean_weight": metrics.mean_weight,
                    "truncated_fraction": metrics.truncated_fraction,
                    "clipped_fraction": metrics.clipped_fraction,
                }
            )
            if index == 0:
                pause_if(self.settings, "mid_round")
        ROUNDS.inc()
        self.board.update(activity="waiting")
        log.info("round %d: %d records, %d accepted, %d steps", self.round, len(records), len(accepted), len(batches))

    # -- checkpoints --------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        pending = len(self.cycle.sample_ids) + self.buffer_estimate
        due_at = self.last.checkpointed_at + timedelta(seconds=self.settings.checkpoint_interval_s)
        return pending >= self.settings.min_samples and datetime.now(UTC) >= due_at

    def _checkpoint(self, replay: CheckpointEntry | None) -> None:
        started = time.monotonic()
        self.board.update(activity="checkpointing")
        if replay is None:
            self._follow_champion(fresh=True)  # a checkpoint of a rejected line would be a candidate to reject
            policy_version = self._next_version()
            checkpoint_id = checkpoint_id_for(self.settings.model_name, policy_version)
            champion = self.watch.current if self.settings.publishes else None
            if champion is not None and self.watch.local(champion.checkpoint_id) is None:
                champion = None  # off the line and not downloaded (a rebase that could not fetch it): no reference
            entry = CheckpointEntry(
                checkpoint_id=checkpoint_id,
                parent=self.last.checkpoint_id,
                after_round=self.round,
                policy_version=policy_version,
                # The next cycle's KL reference: the champion (on the line now), else this checkpoint itself.
                reference_id=champion.checkpoint_id if champion else checkpoint_id,
            )
            self.journal.append(entry)
        else:  # the number chosen before the crash (a journal written before entries named it: the parent's + 1)
            policy_version = replay.policy_version or self.last.policy_version + 1
            checkpoint_id = checkpoint_id_for(self.settings.model_name, policy_version)
            if replay.checkpoint_id != checkpoint_id:
                raise StateError(f"journal says checkpoint {replay.checkpoint_id}, expected {checkpoint_id}")
            entry = replay
        next_reference = entry.reference_id or checkpoint_id
        now = datetime.now(UTC)
        self.seen_ids, self.seen_versions = recent_seen(
            self.seen_ids, self.seen_versions, policy_version - self.settings.max_staleness
        )
        state = TrainingState(
            checkpoint_id=checkpoint_id,
            policy_version=policy_version,
            step=self.step,
            round=self.round,
            positions=self.positions,
            baseline=self.baseline.state_dict(),
            seen_sample_ids=self.seen_ids,
            seen_policy_versions=self.seen_versions,
            checkpoint_sample_ids=self.cycle.sample_ids,
            checkpointed_at=now,
            reference_id=next_reference,
            held_trajectories=self.hold.state(),
        )
        temporary = self.data.temp_state(checkpoint_id)
        if temporary.exists():
            shutil.rmtree(temporary)
        self._tell("save_state", str(temporary))
        self.engine.save_state(temporary)
        write_state_file(temporary, state)
        state_folder = self.data.state_of(checkpoint_id)
        commit_folder(temporary, state_folder)
        cycle = self.cycle
        line = {"parent_id": self.head, "reference_id": self.reference_id, "rebased_from": self.rebased_from}

        def manifest_for(files: dict[str, str]) -> Any:
            return build_manifest(
                settings=self.settings,
                base_label=self.base_label,
                checkpoint_id=checkpoint_id,
                policy_version=policy_version,
                step=self.step,
                cycle=cycle,
                positions=self.positions,
                files=files,
                held_out=self.held_out,
                **line,
            )

        write_checkpoint_folder(
            self.data,
            checkpoint_id,
            lambda folder: self.engine.save_pretrained(folder, state_folder),
            self.settings,
            manifest_for,
        )
        CHECKPOINTS.inc()
        CHECKPOINT_SECONDS.set(time.monotonic() - started)
        log.info("checkpoint %s: %d samples, step %d", checkpoint_id, len(cycle.sample_ids), self.step)
        self._adopt(state, self.positions)
        self.journal.compact(checkpoint_id)
        self._refresh_reference(next_reference, checkpoint_id)
        self.outbox.add(checkpoint_id)
        self._report()  # /status names the checkpoint (written, not yet published) before its published marker exists
        self._publish()
        self.board.update(activity="waiting")

    # -- following the champion (learner.lineage) ------------------------------------------------

    def _follow_champion(self, fresh: bool) -> None:
        """Rebase onto the champion when the learner's line was rejected or left; see :mod:`learner.lineage`."""
        champion = self.watch.rebase_target(self.head, fresh)
        if champion is None:
            return
        from infra.registry import RegistryError  # lazily, like every registry use here (MLflow is slow to import)

        rounds = [e for e in self.journal.after(self.last.checkpoint_id) if isinstance(e, RoundEntry)]
        try:
            self.watch.folder_of(champion.checkpoint_id, champion.version)  # download before journaling it
        except (RegistryError, ManifestError) as exc:
            log.warning("cannot rebase onto the champion %s yet (%s); trying again later", champion.checkpoint_id, exc)
            return
        entry = RebaseEntry(
            parent=self.last.checkpoint_id, left=self.head, onto=champion.checkpoint_id, onto_version=champion.version
        )
        self.journal.append(entry)
        self._rebase(entry, rounds)

    def _rebase(self, entry: RebaseEntry, rounds: list[RoundEntry]) -> None:
        """Load the champion ``entry.onto`` (fresh optimizer, it as the KL reference), then train the cycle's
        ``rounds`` again on top of it, from the newest checkpoint's baseline and seen samples."""
        self.board.update(activity="rebasing")
        folder = self.watch.folder_of(entry.onto, entry.onto_version)
        log.info("rebasing from %s onto the champion %s, then %d rounds again", entry.left, entry.onto, len(rounds))
        self._tell("rebase", str(folder))
        self.engine.rebase(folder)
        pause_if(self.settings, "mid_rebase")
        # The rounds move the positions on to where they are now; the buffer beyond them stays.
        self._adopt(self.last, self.positions)
        for replay in rounds:
            self._round(read_ranges(self.settings.bootstrap, replay.ranges), replay.ranges, replay=replay)
        self.head, self.reference_id, self.rebased_from = entry.onto, entry.onto, entry.left
        self._report()

    def _refresh_reference(self, reference_id: str, own_id: str) -> None:
        """Make ``reference_id`` the KL reference: the weights now when it is ``own_id``, else its folder."""
        folder = None if reference_id == own_id else self.watch.local(reference_id)
        if reference_id != own_id and folder is None:
            raise StateError(f"the KL reference {reference_id} has no folder in {self.data.root}; restore it")
        self._tell("refresh", str(folder) if folder else "")
        self.engine.refresh_reference(folder)

    def _next_version(self) -> int:
        """The next checkpoint's version: the number MLflow will give it (see ``next_policy_version``)."""
        newest = 0
        if self.settings.publishes:
            from infra.registry import Registry, RegistryError

            try:
                newest = Registry(self.settings.mlflow_uri or "").newest_version(self.settings.model_name)
            except RegistryError as exc:
                # Publishing checks the number again and refuses a mismatch, so going on is safe.
                log.warning("numbering from the last checkpoint: the registry could not be read (%s)", exc)
        return next_policy_version(self.last.policy_version, newest)

    def _publish(self) -> None:
        self.outbox.flush()
        self.outbox.prune_states(self.last.policy_version)

    # -- status -------------------------------------------------------------------------------

    def _housekeeping(self, force_lag: bool = False) -> None:
        now = time.monotonic()
        if self.world_size > 1 and now - self._last_told > HEARTBEAT_S:
            self._tell("noop")
        if self.outbox.pending and now - self.outbox.last_try > PUBLISH_RETRY_S:
            self._publish()
        if force_lag or now - self._last_lag > LAG_EVERY_S:
            self._last_lag = now
            self._lag = self.source_.lag(self.positions)
            for partition, lag in self._lag.items():
                LAG.labels(partition=str(partition)).set(lag)
        self._report()

    def _report(self) -> None:
        """Bring the metrics and ``/status`` up to date (the lag as last measured)."""
        pending = len(self.cycle.sample_ids) + self.buffer_estimate
        STEP.set(self.step)
        POLICY_VERSION.set(self.last.policy_version)
        SAMPLES_SINCE_CHECKPOINT.set(pending)
        due_at = self.last.checkpointed_at + timedelta(seconds=self.settings.checkpoint_interval_s)
        self.board.update(
            step=self.step,
            round=self.round,
            policy_version=self.last.policy_version,
            last_checkpoint_id=self.last.checkpoint_id,
            parent_id=self.head,
            reference_id=self.reference_id,
            rebased_from=self.rebased_from,
            samples_since_checkpoint=pending,
            next_checkpoint_at=due_at.isoformat(),
            lag={str(p): lag for p, lag in sorted(self._lag.items())},
            unpublished=list(self.outbox.pending),
            intake=dict(self.intake.counts),
            trajectories={**self.hold.counts, "held": len(self.hold), "held_samples": self.hold.held_samples()},
        )


def main() -> None:
    """Entry point of ``python -m learner.service``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # it logs every connection at INFO
    settings = LearnerSettings()
    held_out = HeldOutSettings().rule()  # validated before the slow start, like the learner's own settings
    rank, world_size = init_distributed(settings.world_size)
    engine = LearnerEngine(settings, rank, world_size)
    learner = Learner(settings, engine, held_out)
    signal.signal(signal.SIGTERM, learner.request_stop)
    signal.signal(signal.SIGINT, learner.request_stop)
    try:
        learner.run() if rank == 0 else learner.follow()
    except LearnerError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
