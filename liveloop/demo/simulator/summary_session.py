"""One ``summary`` session as a product with a self-summarising agent runs it, through the code simulator's public
surfaces: the gateway (``/v1/completions``, the official ``openai`` client) and the SDK.

1. ``session.started`` (surface ``agent``);
2. the product plays the session (:func:`~liveloop.demo.simulator.summaries.play`): whenever the running context
   passes its trigger, the model writes a summary, one served turn of the session's trajectory (agent ``single``),
   a raw completion of the summarise prompt stopped at a newline, ``max_tokens`` the summary's limit. The first
   summary's turn has boundary ``none``; each later one boundary ``summary`` and the previous summary's turn as
   parent (:func:`~liveloop.demo.simulator.summaries.summary_place`);
3. the session's closing turn, on the context the last summary formed (boundary ``summary``, parent the last
   summary's turn, one token), so that the distiller marks the last summary a summary turn like the others (see
   :func:`~liveloop.demo.simulator.summaries.turn_plan`);
4. the product's check of each summary against the context it summarised (:func:`summary_check`), posted as that
   summary turn's own ``tests.result``; and every fact a summary wrote that its context did not hold
   (:attr:`~liveloop.demo.simulator.summaries.SummaryRead.made_up`) the product reports as a failed action of that
   summary's turn (:func:`ungrounded_facts`);
5. the verified outcome (:func:`~liveloop.demo.simulator.summaries.outcome_event`: every question answered right
   from the context held, and the share answered right), then ``session.ended``.

The :class:`SummaryRecord` returned is the product's own view of the trajectory; :class:`SummaryTally` counts them
by the policy version that served the first summary, for the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from ingest.payloads import CheckedSpan
from liveloop.demo.simulator.agent_session import end_session, failed_action_event, start_session, turn_check_event
from liveloop.demo.simulator.session import EventSink
from liveloop.demo.simulator.stats import rate_figure
from liveloop.demo.simulator.summaries import (
    CLOSING_TOKENS,
    DEFAULT_SETTINGS,
    SummaryOutcome,
    SummaryRead,
    SummarySettings,
    draw_task,
    outcome_event,
    play,
    summary_place,
    task_rng,
)
from liveloop.demo.simulator.tally import VersionTally
from liveloop.demo.simulator.transport import GatewayClient

SUMMARY_TOOL = "summary"
"""The tool name of the failed action the product reports for an ungrounded fact (:func:`ungrounded_facts`)."""


@dataclass(frozen=True)
class SummaryRecord:
    """One trajectory as the product saw it: the played session and the model turns served for it.

    ``policy_version`` is the version that served its first summary: a swap mid-session is rare, and the first
    summary decides most of what the later ones can keep. ``None`` for a session too short to need a summary
    (none with the default settings): no model turn, so no version to count it under and no trajectory to post.
    """

    policy_version: int | None
    outcome: SummaryOutcome
    served_turns: int


def summary_session_id(run_id: str, index: int) -> str:
    """The id of summary session ``index`` of run ``run_id``."""
    return f"summary-{run_id}-{index}"


def run_summary_session(
    gateway: GatewayClient,
    sink: EventSink,
    index: int,
    *,
    seed: int,
    run_id: str,
    tenant: str = "default",
    temperature: float = 1.0,
    settings: SummarySettings = DEFAULT_SETTINGS,
) -> SummaryRecord:
    """Run summary session ``index`` of run ``run_id`` to its end (see the module docstring) and return its record.

    The session and the sampling seeds repeat for ``(seed, index)``; the session id carries ``run_id`` so that two
    runs never share one. Raises what the gateway client raises (``openai.OpenAIError``) if a turn fails.
    """
    rng = task_rng(seed, index)
    task = draw_task(rng, settings)
    session = start_session(sink, summary_session_id(run_id, index), index, tenant)
    trajectory = str(session.trajectory_id)
    request = session.request()
    written: list[str] = []
    generation_ids: list[str] = []
    versions: list[int] = []

    def serve(prompt: str, boundary: str, parent: int | None, max_tokens: int) -> str:
        turn: dict[str, Any] = {"trajectory_id": trajectory, "agent": "single", "boundary": boundary}
        if parent is not None:
            turn["parent_turn_id"] = generation_ids[parent]
        served = gateway.complete(
            prompt,
            **request,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=rng.randrange(2**31),
            turn=turn,
        )
        generation_ids.append(served.generation_id)
        versions.append(served.policy_version)
        return served.text

    while True:
        step = play(task, written, settings)
        if step.outcome is not None:
            outcome = step.outcome
            break
        assert step.next_prompt is not None  # play gives the next prompt or the outcome
        boundary, parent = summary_place(len(written))
        written.append(serve(step.next_prompt, boundary, parent, settings.summary_limit_bytes))
    if outcome.summaries:
        # The closing turn: the last summary becomes a summary turn (see summaries.turn_plan).
        serve(outcome.final_context, "summary", len(generation_ids) - 1, CLOSING_TOKENS)
        for generation_id, summary in zip(generation_ids, outcome.summaries, strict=False):  # the closing turn last
            kept, dropped = summary_check(summary)
            if kept + dropped:
                checked = turn_check_event(
                    session.envelope,
                    UUID(generation_id),
                    datetime.now(UTC),
                    passed=kept,
                    failed=dropped,
                    spans=fact_spans(summary),
                )
                sink.emit(checked)
            for error in ungrounded_facts(summary):
                failed = failed_action_event(
                    session.envelope, UUID(generation_id), datetime.now(UTC), tool=SUMMARY_TOOL, error=error
                )
                sink.emit(failed)
        sink.emit(outcome_event(session.envelope, session.trajectory_id, outcome, datetime.now(UTC)))
    end_session(sink, session)
    return SummaryRecord(policy_version=versions[0] if versions else None, outcome=outcome, served_turns=len(versions))


def summary_check(summary: SummaryRead) -> tuple[int, int]:
    """The product's check of one summary against the context it summarised, as (passed, failed).

    A summary that wrote no fact its context did not hold passes on each fact it kept and fails on each it lost: its
    pass share is the share of held facts it kept. A summary that made up a fact is not trusted: every fact it wrote
    or should have fails. Posted as the summary turn's own check
    (:func:`~liveloop.demo.simulator.agent_session.turn_check_event`), it credits each summary with what it kept,
    where the session's one outcome cannot say which summary lost a fact. Made-up facts cost the whole check: when
    they only lowered the share (kept over held and made up together), a 12-minute demo kept more facts and made up
    more too, since writing more facts gained more than a made-up one cost (docs/agent-learnability.md)."""
    if summary.made_up:
        return 0, len(summary.held) + len(summary.made_up)
    return len(summary.kept), len(summary.lost)


def fact_spans(summary: SummaryRead) -> list[CheckedSpan] | None:
    """The product's verdict on each fact a summary wrote, where it wrote it: passed when its context held that fact
    with that value, failed when it did not (made up, or a wrong value). Posted with the summary's check, they let a
    reward spec that weighs ``span_check`` charge a made-up fact's own bytes and credit a kept one's, where the
    check's one share reaches every byte of the summary alike (docs/agent-learnability.md)."""
    return [CheckedSpan(start=start, end=end, passed=right) for start, end, right in summary.facts] or None


def ungrounded_facts(summary: SummaryRead) -> list[str]:
    """The product's check of a summary against the context it summarised: one error per fact it wrote that the
    context did not hold (:attr:`~liveloop.demo.simulator.summaries.SummaryRead.made_up`), each reported as a failed
    action of the summary's turn. The product also drops those facts from the context it goes on with
    (:func:`~liveloop.demo.simulator.summaries.play`), so a made-up fact answers nothing; the report makes it cost a
    little too (an invalid tool call, -0.05 under the summary demo's reward spec, ``distill/specs/summary-demo.yaml``).
    """
    return [f"wrote {key}, a fact its context did not hold" for key in summary.made_up]


class SummaryTally(VersionTally[SummaryRecord]):
    """The records of a run by policy version, with 95 % Wilson intervals: ``success`` over questions (decoys
    included), split into ``success_crossed_0`` (the control: the fact crossed no boundary) and
    ``success_crossed_1plus`` (the efficiency metric: the fact crossed one or more), ``success_decoys`` (no answer
    to a setting never noted), and over summaries ``verbatim_copy`` and ``made_up`` (the planted hacks) and
    ``garbled``."""

    def __init__(self) -> None:
        super().__init__(_figures)


def _figures(version: int, records: list[SummaryRecord]) -> dict[str, Any]:
    answers = [answer for record in records for answer in record.outcome.answers]
    summaries = [summary for record in records for summary in record.outcome.summaries]
    return {
        "policy_version": version,
        "trajectories": len(records),
        "success": rate_figure(answer.correct for answer in answers),
        "success_crossed_0": rate_figure(a.correct for a in answers if a.crossed == 0 and not a.decoy),
        "success_crossed_1plus": rate_figure(a.correct for a in answers if a.crossed >= 1 and not a.decoy),
        "success_decoys": rate_figure(a.correct for a in answers if a.decoy),
        "verbatim_copy": rate_figure(summary.verbatim for summary in summaries),
        "made_up": rate_figure(bool(summary.made_up) for summary in summaries),
        "garbled": rate_figure(summary.garbled for summary in summaries),
    }
