"""Promote, roll back, reject: every move of the ``champion`` alias, recorded where an auditor looks.

One decision is, in this order: a row in the PostgreSQL ``promotions`` table and the alias move in
MLflow inside one transaction (the row is only committed once the alias moved; a failed move leaves
no row), then MLflow tags on the model versions, then a :class:`PromotionEvent` on the promotions
topic (key = model name). The tags (a view of the decision for the registry's UI: two per version,
one request each) come before the event, on which serving swaps: written after it, the registry's
work for them came beside the swap's requests. The event is published even if tagging failed, and
either failure is raised. An advisory lock per model serialises concurrent deciders (the gate, two
operators), so ``from_version`` is always the champion the decision really replaced.

Rollback goes to the previous champion *from the history*, not to "the version before in number":
the history is replayed as a stack (``promote`` pushes ``to_version``, ``rollback`` pops), so after
1 -> 2 -> 3, rollback, rollback, the champion is 1, and promoting 4 after a rollback to 2 makes the
next rollback go to 2 again. A rejected version is never a rollback target.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from mlflow.exceptions import MlflowException

from infra.producers import reliable_producer
from infra.registry import CANDIDATE, CHAMPION, AliasNotSet, Registry, RegistryError
from serving.errors import ServingError
from serving.promotions_contract import Action, PromotionEvent, SwapFailedEvent, message_to_json


class PromotionError(ServingError):
    """A promote/rollback/reject was refused or failed; the message says why and what to do instead."""


# Tags set on the MLflow model version so that the registry UI shows each version's fate. Two tags, not
# one per field: the REST API sets one tag per request, and each request costs the MLflow server about
# 13 ms of CPU. Five tags on each of two versions were 130 ms of the server's CPU just as serving
# swapped (in the local stack they share the machine), slowing the requests in flight.
TAG_STATUS = "liveloop.status"
"""The version's fate (champion, retired, rolled-back, rejected): a tag of its own, so a search can filter on it."""
TAG_DECIDED = "liveloop.decided"
"""JSON: who decided (``by``), when (``at``, ISO 8601), why (``reason``), and the promotions row (``promotion_id``)."""


def recorded_decision(tags: Mapping[str, str]) -> dict[str, Any]:
    """The last decision about a model version, from its tags: ``status`` with ``by``, ``at``, ``reason`` and
    ``promotion_id`` (empty if liveloop never decided about it)."""
    if TAG_STATUS not in tags:
        return {}
    return {"status": tags[TAG_STATUS], **json.loads(tags.get(TAG_DECIDED, "{}"))}


@dataclass(frozen=True)
class HistoryRow:
    """One row of the promotions table."""

    id: int
    action: str
    from_version: int | None
    to_version: int | None
    actor: str
    reason: str


def champion_stack(rows: list[HistoryRow]) -> list[int]:
    """The champions in the order they became champion, with rolled-back ones removed (last = current)."""
    stack: list[int] = []
    rejected: set[int] = set()
    for row in rows:
        if row.action == "promote" and row.to_version is not None:
            if not stack and row.from_version is not None:
                stack.append(row.from_version)  # the champion before history started (e.g. set by hand)
            stack.append(row.to_version)
        elif row.action == "rollback" and stack:
            stack.pop()
            if row.to_version is not None and (not stack or stack[-1] != row.to_version):
                stack.append(row.to_version)  # keeps the replay honest if the stack disagrees with the row
        elif row.action == "reject" and row.to_version is not None:
            rejected.add(row.to_version)
    # A version rejected after it had been champion is not a place to roll back to.
    return [v for i, v in enumerate(stack) if v not in rejected or i == len(stack) - 1]


def _lock_key(model_name: str) -> int:
    # A signed 64-bit key derived from the name: one advisory lock per model.
    return int.from_bytes(hashlib.sha256(f"liveloop-promotions:{model_name}".encode()).digest()[:8], "big", signed=True)


class Promoter:
    """Makes and records decisions about a model's versions (gate, CLI and dashboard all use this).

    It keeps a Kafka producer for its announcements once it has made one: :meth:`close` it when done.
    """

    def __init__(self, *, registry: Registry, dsn: str, bootstrap: str, topic: str, model_name: str) -> None:
        self.registry = registry
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.topic = topic
        self.model_name = model_name
        # Kept between decisions: a producer's start (connections, metadata) took about 120 ms of the
        # announcement, which serving waits for, and CPU beside serving's; see close().
        self._producer: Any = None
        self._producer_lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------------

    def history(self) -> list[HistoryRow]:
        """Every recorded decision about this model, oldest first."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT id, action, from_version, to_version, actor, reason FROM promotions "
                "WHERE model_name = %s ORDER BY id",
                (self.model_name,),
            ).fetchall()
        return [HistoryRow(*row) for row in rows]

    def champion(self) -> int | None:
        """The champion alias now (MLflow is the source of truth), or None before the first one."""
        try:
            return int(self.registry.version_by_alias(self.model_name, CHAMPION).version)
        except AliasNotSet:
            return None

    # -- deciding --------------------------------------------------------------------------------

    def promote(
        self, version: int, *, actor: str, reason: str, evaluation_id: uuid.UUID | None = None
    ) -> PromotionEvent:
        """Make ``version`` the champion. Refused for a version that does not exist or was rejected."""
        self._require_version(version)
        with self._connect() as conn, conn.transaction():
            self._lock(conn)
            rejected = conn.execute(
                "SELECT 1 FROM promotions WHERE model_name = %s AND action = 'reject' AND to_version = %s",
                (self.model_name, version),
            ).fetchone()
            if rejected:
                raise PromotionError(
                    f"{self.model_name} version {version} was rejected; "
                    "register a new checkpoint instead of promoting it"
                )
            current = self.champion()
            if current == version:
                raise PromotionError(f"{self.model_name} version {version} is already the champion; nothing to promote")
            event = self._record(conn, "promote", current, version, actor, reason, evaluation_id)
            self._move(version)
        tags = [(version, "champion", reason)]
        if current is not None:
            tags.append((current, "retired", f"replaced by version {version}: {reason}"))
        self._announce(event, tags)
        return event

    def rollback(self, *, actor: str, reason: str) -> PromotionEvent:
        """Move ``champion`` back to the previous champion of the history, in one step."""
        with self._connect() as conn, conn.transaction():
            self._lock(conn)
            current = self.champion()
            stack = champion_stack(self._rows(conn))
            if current is not None and stack and stack[-1] != current:
                # The alias was moved outside liveloop: roll back to the newest recorded champion.
                target = stack[-1]
            elif len(stack) >= 2:
                target = stack[-2]
            else:
                raise PromotionError(
                    f"{self.model_name} has no previous champion in its promotion history "
                    f"(champion: {current}); promote a version instead"
                )
            event = self._record(conn, "rollback", current, target, actor, reason, None)
            self._move(target)
        tags = [(target, "champion", f"rollback: {reason}")]
        if current is not None:
            tags.append((current, "rolled-back", reason))
        self._announce(event, tags)
        return event

    def reject(
        self, version: int, *, actor: str, reason: str, evaluation_id: uuid.UUID | None = None
    ) -> PromotionEvent:
        """Refuse ``version`` for good: recorded, tagged, and the ``candidate`` alias leaves it (stops canaries)."""
        self._require_version(version)
        with self._connect() as conn, conn.transaction():
            self._lock(conn)
            current = self.champion()
            if current == version:
                raise PromotionError(
                    f"{self.model_name} version {version} is the champion; run `liveloop rollback` before rejecting it"
                )
            event = self._record(conn, "reject", current, version, actor, reason, evaluation_id)
        self._drop_candidate(version)
        self._announce(event, [(version, "rejected", reason)])
        return event

    def publish_swap_failed(self, event: SwapFailedEvent) -> None:
        """Put a swap-failed event on the promotions topic (used by the hot-swap controller)."""
        self._send(message_to_json(event))

    # -- internals -------------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.dsn, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise PromotionError(f"cannot reach PostgreSQL for the promotions history: {exc}") from exc

    def _lock(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.model_name),))

    def _rows(self, conn: psycopg.Connection[Any]) -> list[HistoryRow]:
        rows = conn.execute(
            "SELECT id, action, from_version, to_version, actor, reason FROM promotions "
            "WHERE model_name = %s ORDER BY id",
            (self.model_name,),
        ).fetchall()
        return [HistoryRow(*row) for row in rows]

    def _record(
        self,
        conn: psycopg.Connection[Any],
        action: Action,
        from_version: int | None,
        to_version: int | None,
        actor: str,
        reason: str,
        evaluation_id: uuid.UUID | None,
    ) -> PromotionEvent:
        try:
            row = conn.execute(
                "INSERT INTO promotions (model_name, action, from_version, to_version, actor, reason, evaluation_id) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id, at",
                (self.model_name, action, from_version, to_version, actor, reason, evaluation_id),
            ).fetchone()
        except psycopg.DataError as exc:  # e.g. a NUL character, which PostgreSQL text cannot hold
            raise PromotionError(
                f"the promotions history refused actor {actor!r} / reason {reason!r}: {exc}; "
                "remove control characters such as NUL from them"
            ) from exc
        assert row is not None  # INSERT ... RETURNING always returns the row
        return PromotionEvent(
            history_id=int(row[0]),
            model_name=self.model_name,
            action=action,
            from_version=from_version,
            to_version=to_version,
            actor=actor,
            reason=reason,
            evaluation_id=evaluation_id,
            at=row[1],
        )

    def _move(self, version: int) -> None:
        try:
            self.registry.set_alias(self.model_name, CHAMPION, version)
        except RegistryError as exc:
            raise PromotionError(
                f"moving {self.model_name}@{CHAMPION} to version {version} failed (nothing recorded): {exc}"
            ) from exc

    def _require_version(self, version: int) -> None:
        try:
            self.registry.require_version(self.model_name, version)
        except RegistryError as exc:
            raise PromotionError(
                f"{self.model_name} has no version {version}; list versions in the MLflow UI and pass one of them"
            ) from exc

    def _drop_candidate(self, version: int) -> None:
        try:
            if int(self.registry.version_by_alias(self.model_name, CANDIDATE).version) == version:
                self.registry.client.delete_registered_model_alias(self.model_name, CANDIDATE)
        except AliasNotSet:
            return
        except (RegistryError, MlflowException) as exc:
            raise PromotionError(
                f"removing {self.model_name}@{CANDIDATE} from version {version} failed: {exc}"
            ) from exc

    def _announce(self, event: PromotionEvent, statuses: list[tuple[int, str, str]]) -> None:
        """Tag each (version, status, reason), then publish the decision; it is published even if tagging
        failed (both are views of a decision already committed; the error still reaches the caller).

        Tags first: the registry's work for them then comes before serving's swap (which the event
        starts), not beside it, where on a small machine it would slow the requests of the swap.
        """
        try:
            for version, status, reason in statuses:
                self._tag(version, status, reason, event)
        finally:
            self._publish(event)

    def _tag(self, version: int, status: str, reason: str, event: PromotionEvent) -> None:
        decided = {
            "by": event.actor,
            "at": event.at.isoformat(),
            "reason": reason[:5000],
            "promotion_id": event.history_id,
        }
        tags = {TAG_STATUS: status, TAG_DECIDED: json.dumps(decided)}
        try:
            self.registry.set_version_tags(self.model_name, version, tags)
        except RegistryError as exc:
            # The decision is already committed and the alias moved; tags are a view of it, so report, do not undo.
            raise PromotionError(
                f"decision {event.history_id} is recorded but tagging {self.model_name} version {version} failed: {exc}"
            ) from exc

    def _publish(self, event: PromotionEvent) -> None:
        self._send(message_to_json(event))

    def _send(self, value: bytes) -> None:
        try:
            with self._producer_lock:
                if self._producer is None:
                    self._producer = reliable_producer(self.bootstrap)
                producer = self._producer
            producer.send(self.topic, key=self.model_name.encode(), value=value).get(timeout=30)
        except Exception as exc:
            self.close()  # the next decision starts afresh, whatever state this producer is in
            # Serving also reconciles with the alias periodically, so a lost event delays a swap, never loses it.
            raise PromotionError(f"publishing to {self.topic} at {self.bootstrap} failed: {exc}") from exc

    def close(self) -> None:
        """Close the producer kept for announcements (the next decision makes a new one)."""
        with self._producer_lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=5)
