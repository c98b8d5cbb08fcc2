"""The accounting after a run under faults: what was accepted against what the loop recorded.

Every check reads what the loop wrote (PostgreSQL, the samples topic, the promotion history) and
compares it with what the traffic recorded as accepted; each returns its figures and its violations
(empty when it holds), so the report shows the numbers even when a check fails.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from kafka import KafkaConsumer, TopicPartition

from distill.samples import HeldOutRule, HeldOutSettings, parse_sample
from learner.settings import LearnerSettings
from tests.reliability.traffic import ServedRecord

SWAP_GRACE_S = 30.0
"""How long a replaced champion may still answer: requests in flight, the swap's load, a restarting gateway."""


@dataclass
class Check:
    """One accounting check: its figures and what broke it."""

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def _some(items: Any, limit: int = 5) -> str:
    items = sorted(str(item) for item in items)
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def events_exactly_once(dsn: str, accepted_ids: set[str], served: list[ServedRecord]) -> Check:
    """Every accepted event, and the generation event of every non-private completion, is archived once."""
    check = Check("accepted events archived exactly once")
    generations = {record.generation_id for record in served if not record.privacy}
    with psycopg.connect(dsn) as conn:
        found = {
            str(row[0])
            for row in conn.execute(
                "SELECT event_id FROM events WHERE event_id = ANY(%s::uuid[])", (list(accepted_ids),)
            )
        }
        per_generation = dict(
            conn.execute(
                "SELECT generation_id::text, count(*) FROM events WHERE type = 'generation' "
                "AND generation_id = ANY(%s::uuid[]) GROUP BY generation_id",
                (list(generations),),
            ).fetchall()
        )
    missing = accepted_ids - found
    missing_generations = generations - set(per_generation)
    doubled = {g for g, count in per_generation.items() if count != 1}
    check.figures = {
        "accepted_events": len(accepted_ids),
        "archived": len(found),
        "missing": len(missing),
        "served_generations": len(generations),
        "generation_events_missing": len(missing_generations),
        "generation_events_doubled": len(doubled),
    }
    if missing:
        check.violations.append(f"{len(missing)} accepted events are not in PostgreSQL: {_some(missing)}")
    if missing_generations:
        check.violations.append(
            f"{len(missing_generations)} served generations have no event: {_some(missing_generations)}"
        )
    if doubled:
        check.violations.append(f"{len(doubled)} generations were archived more than once: {_some(doubled)}")
    return check


def one_sample_per_generation(dsn: str) -> Check:
    """Every archived generation (all sessions ended, so all are final) has exactly one sample."""
    check = Check("one sample per finalised generation")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT e.generation_id::text, count(s.sample_id) FROM events e "
            "LEFT JOIN samples s ON s.generation_id = e.generation_id "
            "WHERE e.type = 'generation' GROUP BY e.generation_id"
        ).fetchall()
    without = {g for g, count in rows if count == 0}
    doubled = {g for g, count in rows if count > 1}
    check.figures = {"generations": len(rows), "without_sample": len(without), "with_two_or_more": len(doubled)}
    if without:
        # Where to look: were their sessions ended, and when did they arrive (compare with the faults' times)?
        with psycopg.connect(dsn) as conn:
            ended, first, last = conn.execute(
                "SELECT count(DISTINCT g.session_id) FILTER (WHERE e.event_id IS NOT NULL), min(g.archived_at), "
                "max(g.archived_at) FROM events g LEFT JOIN events e ON e.session_id = g.session_id "
                "AND e.type = 'session.ended' WHERE g.type = 'generation' AND g.generation_id = ANY(%s::uuid[])",
                (list(without),),
            ).fetchone() or (0, None, None)
        check.figures["without_sample_sessions_ended"] = ended
        check.figures["without_sample_archived"] = [str(first), str(last)]
    if without:
        check.violations.append(f"{len(without)} generations have no sample: {_some(without)}")
    if doubled:
        check.violations.append(f"{len(doubled)} generations have several samples: {_some(doubled)}")
    return check


def checkpoints_contiguous(dsn: str, bootstrap: str, samples_topic: str, learner: LearnerSettings) -> Check:
    """No sample trained two checkpoints, none was skipped.

    The manifests' offset ranges must tile each partition of the samples topic from offset 0 with no
    gap and no overlap; and re-deriving the learner's intake over those offsets (privacy, held-out,
    duplicate, staleness, tokens) must give exactly the samples the checkpoints say they trained.
    """
    check = Check("checkpoints: contiguous, disjoint, nothing skipped")
    with psycopg.connect(dsn) as conn:
        checkpoints = conn.execute(
            "SELECT checkpoint_id, policy_version FROM checkpoints WHERE parent_id IS NOT NULL ORDER BY policy_version"
        ).fetchall()
        ranges = conn.execute(
            "SELECT c.policy_version, o.kafka_partition, o.first_offset, o.last_offset FROM checkpoint_offsets o "
            "JOIN checkpoints c USING (checkpoint_id) WHERE o.topic = %s ORDER BY o.kafka_partition, c.policy_version",
            (samples_topic,),
        ).fetchall()
        trained = dict(
            conn.execute(
                "SELECT s.sample_id, c.policy_version "
                "FROM checkpoint_samples s JOIN checkpoints c USING (checkpoint_id)"
            ).fetchall()
        )
    covered: dict[int, int] = {}  # partition -> next offset a checkpoint must start at
    owner: dict[tuple[int, int], int] = {}  # (partition, first offset) -> policy version that trained the range
    spans: list[tuple[int, int, int, int]] = []
    for policy, partition, first, last in ranges:
        expected = covered.get(partition, 0)
        if first != expected:
            kind = "overlaps" if first < expected else "leaves a gap before"
            check.violations.append(f"v{policy} partition {partition}: range {first}-{last} {kind} offset {expected}")
        covered[partition] = last + 1
        owner[(partition, first)] = policy
        spans.append((partition, first, last, policy))
    expected_trained, reasons = _rederive_intake(bootstrap, samples_topic, spans, learner)
    trained_ids = set(trained)
    never = expected_trained - trained_ids
    extra = trained_ids - expected_trained
    check.figures = {
        "checkpoints": len(checkpoints),
        "samples_trained": len(trained_ids),
        "offsets_covered": sum(covered.values()),
        "dropped_by_intake": dict(reasons),
        "trainable_not_trained": len(never),
        "trained_not_expected": len(extra),
    }
    if never:
        check.violations.append(
            f"{len(never)} trainable samples inside the manifests' ranges were skipped: {_some(never)}"
        )
    if extra:
        check.violations.append(f"{len(extra)} trained samples are not trainable records of the ranges: {_some(extra)}")
    return check


def _rederive_intake(
    bootstrap: str, topic: str, spans: list[tuple[int, int, int, int]], learner: LearnerSettings
) -> tuple[set[str], dict[str, int]]:
    """The sample ids the learner should have trained on in ``spans`` (partition, first, last, policy)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    trainable: set[str] = set()
    reasons: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    held_out = HeldOutSettings().rule()  # the deployment's one split, as the learner read it
    try:
        by_partition: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        for partition, first, last, policy in spans:
            by_partition[partition].append((first, last, policy))
        for partition, parts in sorted(by_partition.items()):
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            end = max(last for _, last, _ in parts)
            policy_at = {offset: policy for first, last, policy in parts for offset in range(first, last + 1)}
            for record in consumer:
                if record.offset > end:
                    break
                policy = policy_at.get(record.offset)
                if policy is None:
                    continue
                reason = _drop_reason(record.value, seen, policy - 1, learner, held_out)
                reasons[reason or "trained"] += 1
                if reason is None:
                    trainable.add(parse_sample(record.value).sample_id)
    finally:
        consumer.close()
    return trainable, reasons


def _drop_reason(
    value: bytes, seen: set[str], base_policy: int, learner: LearnerSettings, held_out: HeldOutRule
) -> str | None:
    try:
        sample = parse_sample(value)
    except ValueError:
        return "invalid"
    if sample.privacy_mode:
        return "private"
    if sample.sample_id in seen:
        return "duplicate"
    if held_out.holds_out_sample(sample):
        return "held_out"
    if base_policy - sample.policy_version > learner.max_staleness:
        return "stale"
    mask = sample.loss_mask or []
    if not (sample.prompt_token_ids and sample.completion_token_ids and sample.behaviour_logprobs and 1 in mask):
        return "no_tokens"
    seen.add(sample.sample_id)
    return None


def served_versions_were_champion_or_canary(dsn: str, served: list[ServedRecord]) -> Check:
    """Every completion named a policy version that was champion, or the canary (the ``candidate`` alias
    while it was neither promoted nor rejected), while it was asked or answered. A replaced version may
    still answer for :data:`SWAP_GRACE_S`; no version may answer before it was champion or candidate."""
    check = Check("served versions were champion or canary")
    with psycopg.connect(dsn) as conn:
        moves = conn.execute(
            "SELECT p.at, c.policy_version FROM promotions p JOIN checkpoints c ON c.model_version = p.to_version "
            "WHERE p.action IN ('promote', 'rollback') ORDER BY p.id"
        ).fetchall()
        candidates = conn.execute(
            "SELECT c.policy_version, c.created_at, (SELECT min(p.at) FROM promotions p WHERE p.action = 'reject' "
            "AND p.to_version = c.model_version) FROM checkpoints c WHERE c.parent_id IS NOT NULL "
            "ORDER BY c.policy_version"
        ).fetchall()
    champion: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for index, (at, policy) in enumerate(moves):
        end = moves[index + 1][0].timestamp() if index + 1 < len(moves) else float("inf")
        champion[int(policy)].append((at.timestamp(), end))
    canary: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for index, (policy, created, rejected) in enumerate(candidates):
        # The candidate alias moves to the next checkpoint when that one is registered.
        end = candidates[index + 1][1].timestamp() if index + 1 < len(candidates) else float("inf")
        canary[int(policy)].append(
            (created.timestamp(), min(end, rejected.timestamp()) if rejected is not None else end)
        )
    early, late = [], []
    worst_late = 0.0
    for record in served:
        spans = champion.get(record.policy_version, []) + canary.get(record.policy_version, [])
        begun = [(start, end) for start, end in spans if start <= record.answered_at + 1.0]
        matching = [end for _, end in begun if record.asked_at <= end + SWAP_GRACE_S]
        if matching:
            # How long after its (closest) span ended this completion was asked; 0 inside a span.
            worst_late = max(worst_late, min(max(0.0, record.asked_at - end) for end in matching))
        elif not begun:
            early.append(record)
        else:
            late.append(record)
    check.figures = {
        "completions": len(served),
        "by_version": dict(sorted(_count(r.policy_version for r in served).items())),
        "champion_changes": len(moves),
        "never_champion_or_canary_yet": len(early),
        "served_too_long_after_replacement": len(late),
        "longest_after_replacement_s": round(max(worst_late, 0.0), 2),
    }
    if early:
        check.violations.append(
            f"{len(early)} completions named a version before it was champion or canary: {early[:3]}"
        )
    if late:
        check.violations.append(f"{len(late)} completions named a version over {SWAP_GRACE_S} s after it was replaced")
    return check


def promoted_after(dsn: str, moment: datetime) -> Check:
    """The loop recovered: a checkpoint was promoted after the last fault."""
    check = Check("a checkpoint was promoted after the faults")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT to_version, at FROM promotions WHERE action = 'promote' AND at > %s ORDER BY at", (moment,)
        ).fetchall()
    check.figures = {"promotions_after_faults": len(rows), "versions": [int(r[0]) for r in rows]}
    if not rows:
        check.violations.append(f"nothing was promoted after {moment.isoformat()}")
    return check


def _count(values: Any) -> dict[Any, int]:
    counts: dict[Any, int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return dict(counts)
