"""The reward spec: a typed, versioned, hashed document that maps feedback signals to a scalar reward.

A spec is a YAML file (the packaged default is ``distill/specs/default.yaml``) validated into
:class:`RewardSpec`. Every sample records the ``spec_version`` and ``spec_hash`` it was scored
with, so an auditor can tell which rules produced a reward; the hash covers every field, so two
files that differ in any value never share one.

How the fields are used is defined in :mod:`distill.reward`; in short:

- ``weights``: one weight per signal. A sample's ``components`` are keyed by these names.
- ``windows_s``: how long after the generation (by event time) each kind of signal may arrive;
  later ones are late and never change the reward. A generation's reward is final when its session
  ends, or else when the LONGEST window has passed (:attr:`Windows.longest`): any generation may
  still get any kind of signal, and the rule must not depend on which signals already arrived.
- ``surface_normalisation``: an optional affine map per surface, ``scale * raw + offset``, applied
  to the raw sum *before* clipping, so that ``clip`` stays the hard bound the learner relies on.
  Surfaces without an entry use the identity.
- ``clip``: the final reward always lies in ``[clip[0], clip[1]]``.
- ``guards``: limits of :mod:`distill.guards` (per-user and per-session caps).
- ``agent``: how agent trajectories are credited (:class:`AgentSpec`, used by :mod:`distill.trajectory`).
  Optional: a spec without it (every spec before agent trajectories) scores agent turns as single-turn
  generations, as it always did, and keeps its hash (the key is left out of the hashed JSON when absent).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Iterator, Mapping
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from distill.errors import InvalidRewardSpec
from ingest.payloads import Identifier

# PyYAML ships no type information and the dev extras do not install its stubs; loading it by name
# keeps ``mypy --strict`` clean with or without the stubs (an ignore comment would turn into an
# "unused ignore" error the day the stubs are installed).
yaml: Any = importlib.import_module("yaml")

DEFAULT_SPEC_RESOURCE = "default.yaml"
"""File name of the packaged default spec inside ``distill.specs``."""

WINDOW_KIND_BY_EVENT_TYPE: Mapping[str, str] = {
    "suggestion.accepted": "suggestion",
    "suggestion.rejected": "suggestion",
    "suggestion.dismissed": "suggestion",
    "edit.persisted": "edit",
    "edit.reverted": "edit",
    "followup": "followup",
    "rating": "rating",
    "tests.result": "tests",
    "tool.result": "tool",
}
"""Which field of :class:`Windows` covers each feedback event type."""


class SpecModel(BaseModel):
    """Base of the spec's models: closed, immutable, strict (a quoted number is a typo), finite floats."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Weights(SpecModel):
    """One weight per signal. Signs are constrained so that a lost minus sign cannot reward a rejection."""

    accepted: float = Field(ge=0, description="The suggestion's last outcome is 'accepted'.")
    rejected: float = Field(le=0, description="The suggestion's last outcome is 'rejected'.")
    dismissed: float = Field(le=0, description="The suggestion's last outcome is 'dismissed' (went away unused).")
    silent: float = Field(description="No user feedback event at all arrived within its window.")
    edit_persisted: float = Field(
        ge=0, description="The last edit measurement is 'persisted'; times fraction_remaining."
    )
    edit_reverted: float = Field(le=0, description="The last edit measurement is 'reverted'; applied in full.")
    followup_dissatisfied: float = Field(le=0, description="Any follow-up was dissatisfied; counted once.")
    followup_rephrase: float = Field(le=0, description="Any follow-up rephrased the request; counted once.")
    rating_up: float = Field(ge=0, description="The last rating is thumbs up.")
    rating_down: float = Field(le=0, description="The last rating is thumbs down.")
    tests_passed: float = Field(ge=0, description="Last test run; times passed / (passed + failed).")
    tests_failed: float = Field(le=0, description="Last test run; times failed / (passed + failed).")
    invalid_tool_call: float = Field(
        lt=0,
        description="Per invalid tool call. Never zero: a broken call must never be a free way out of a task.",
    )
    deferral: float = Field(le=0, description="The generation asked a question instead of doing the work.")


class Windows(SpecModel):
    """Seconds after the generation (event time) within which each kind of signal counts."""

    suggestion: int = Field(gt=0, description="suggestion.accepted / rejected / dismissed")
    edit: int = Field(gt=0, description="edit.persisted / edit.reverted")
    followup: int = Field(gt=0, description="followup")
    rating: int = Field(gt=0, description="rating")
    tests: int = Field(gt=0, description="tests.result")
    tool: int = Field(gt=0, description="tool.result")

    @property
    def longest(self) -> int:
        """The longest window: a generation's reward is final this long after it, unless its session ended first."""
        return max(self.suggestion, self.edit, self.followup, self.rating, self.tests, self.tool)

    def for_event_type(self, event_type: str) -> int | None:
        """The window of a feedback event type, or ``None`` for types that have none (session events)."""
        kind = WINDOW_KIND_BY_EVENT_TYPE.get(event_type)
        return None if kind is None else int(getattr(self, kind))


class SurfaceNormalisation(SpecModel):
    """``scale * raw + offset`` for one surface, applied before clipping."""

    scale: float = Field(gt=0, description="Positive, so that normalisation never reverses a preference.")
    offset: float = 0.0


IDENTITY = SurfaceNormalisation(scale=1.0, offset=0.0)
"""The normalisation of a surface the spec does not list."""


class Guards(SpecModel):
    """Limits of the anti-domination guards in :mod:`distill.guards`."""

    max_samples_per_user_per_window: int = Field(gt=0, description="Most samples one user may add per window.")
    user_window_s: int = Field(gt=0, description="Length of the sliding per-user window, in seconds.")
    max_samples_per_session: int = Field(gt=0, description="Most samples one session may add, ever.")


class AgentWeights(SpecModel):
    """Weights of an agent trajectory's reward components (:mod:`distill.trajectory`).

    ``reward = clip(fsum(components))``, where the performance component is ``performance * r_perf`` and
    each guard's is its weight times its metric. The shaping terms ``r_parallel`` and ``r_finish`` are not
    among them: the learner adds them, annealed, so that the gate and promotion judge performance alone.
    """

    performance: float = Field(gt=0, description="Times the verified outcome's performance in [0, 1].")
    invalid_tool_call: float = Field(lt=0, description="Per invalid tool call of a trainable turn; never zero.")
    deferral: float = Field(le=0, description="Per trainable turn that asked a question instead of acting.")
    give_up: float = Field(le=0, description="Gave up after fewer than min_searches searches.")
    budget_overrun: float = Field(le=0, description="Per turn served over its budget and per refused tool call.")
    serial_collapse: float = Field(le=0, description="An orchestrator that spawned nothing yet took many steps.")
    fake_parallelism: float = Field(le=0, description="Times the share of sub-agents idle or unfinished.")
    timed_out: float = Field(le=0, description="No outcome came in time (performance then counts as 0).")
    turn_check: float = Field(
        default=0.0,
        ge=0,
        le=2,
        description="Times the pass share of a turn's own check (its last tests.result), added to that turn's "
        "reward alone; 0 (the default) credits every turn with the trajectory's reward only.",
    )
    span_check: float = Field(
        default=0.0,
        ge=0,
        le=2,
        description="Plus this on the tokens of each part of a turn its own check passed (the spans of its last "
        "tests.result), minus this on each it failed; token credit only: the turn's reward, which the gate judges, "
        "is unchanged. 0 (the default) gives every token of a turn the same credit.",
    )


class AgentParams(SpecModel):
    """Parameters of trajectory assembly and of the agent guards."""

    parallel_cap: int = Field(
        gt=0, le=256, description="r_parallel = min(spawned, cap) / cap: more sub-agents earn no more shaping."
    )
    min_searches: int = Field(ge=0, le=1000, description="Searches below which giving up is a hack.")
    serial_steps: int = Field(
        gt=0, le=10_000, description="Orchestrator turns at which one that spawned nothing has collapsed."
    )
    timeout_s: int = Field(
        gt=0, le=7 * 86_400, description="A trajectory without an outcome this long after its last turn times out."
    )


class AgentSpec(SpecModel):
    """How agent trajectories are credited: weights of the components and the assembly's parameters."""

    weights: AgentWeights
    params: AgentParams


def _list_to_tuple(value: object) -> object:
    # YAML has no tuples; strict mode would reject the list it gives.
    return tuple(value) if isinstance(value, list) else value


Clip = Annotated[tuple[float, float], BeforeValidator(_list_to_tuple)]


class RewardSpec(SpecModel):
    """The whole reward spec. Build it with :func:`load_spec` or :func:`parse_spec`."""

    version: str = Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1F\x7F]+$")
    weights: Weights
    clip: Clip = Field(description="[lower, upper] bound of every final reward.")
    windows_s: Windows
    surface_normalisation: dict[Identifier, SurfaceNormalisation] = Field(default_factory=dict)
    guards: Guards
    agent: AgentSpec | None = Field(default=None, description="Agent trajectory credit; absent in older specs.")
    _spec_hash: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _coherent(self) -> RewardSpec:
        low, high = self.clip
        if not low < high:
            raise ValueError(f"clip: lower bound {low} must be below upper bound {high}")
        # Clipping could hide the invalid-tool-call penalty: if the best reward without it already lies
        # above the upper bound by more than the penalty, a broken call would cost nothing there.
        best = self.best_raw_reward()
        for surface, norm in self._normalisations():
            with_one_invalid = norm.scale * (best + self.weights.invalid_tool_call) + norm.offset
            if with_one_invalid >= high:
                raise ValueError(
                    f"on {surface} the best reward with one invalid tool call is {with_one_invalid}, "
                    f"not below clip's upper bound {high}, so clipping would hide the penalty; lower the "
                    "positive weights, raise the bound or make invalid_tool_call more negative"
                )
        if self.agent is not None:
            agent = self.agent.weights
            best_turn = agent.performance + agent.turn_check
            if best_turn + agent.invalid_tool_call >= high:
                raise ValueError(
                    f"agent: a perfect turn with one invalid tool call scores {agent.performance} + "
                    f"{agent.turn_check} + {agent.invalid_tool_call}, not below clip's upper bound {high}, so "
                    "clipping would hide the penalty; lower agent.weights.performance or turn_check, or make "
                    "agent.weights.invalid_tool_call more negative"
                )
        return self

    def _normalisations(self) -> Iterator[tuple[str, SurfaceNormalisation]]:
        yield "surfaces without a normalisation", IDENTITY
        for surface, norm in sorted(self.surface_normalisation.items()):
            yield f"surface {surface}", norm

    def best_raw_reward(self) -> float:
        """The largest raw sum any generation can reach without invalid tool calls (see :mod:`distill.reward`)."""
        w = self.weights
        # One outcome per exclusive group, or none; follow-ups and deferral can only lower it.
        groups = [
            max(0.0, w.accepted, w.rejected, w.dismissed),
            max(0.0, w.edit_persisted, w.edit_reverted),
            max(0.0, w.rating_up, w.rating_down),
            max(0.0, w.tests_passed, w.tests_failed),
        ]
        return max(w.silent, sum(groups))

    def normalisation_for(self, surface: str) -> SurfaceNormalisation:
        """The surface's normalisation, the identity where the spec lists none."""
        return self.surface_normalisation.get(surface, IDENTITY)

    def canonical_json(self) -> bytes:
        """The spec as canonical JSON: sorted keys, no whitespace, ASCII; what :attr:`spec_hash` hashes."""
        data = self.model_dump(mode="json")
        if data["agent"] is None:
            del data["agent"]  # specs from before agent trajectories keep their hashes (and so their sample ids)
        else:  # likewise agent specs from before per-turn and per-span checks
            for weight in ("turn_check", "span_check"):
                if data["agent"]["weights"][weight] == 0:
                    del data["agent"]["weights"][weight]
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()

    @property
    def spec_hash(self) -> str:
        """SHA-256 hex of :meth:`canonical_json`; the same on every run, platform and Python version.

        Computed once per object (the spec is frozen; the distiller asks once per sample).
        :meth:`model_copy` gives a copy that computes its own, since its fields may differ.
        """
        # Read from pydantic's dict of private attributes: ``self._spec_hash`` costs a caught AttributeError
        # on every read (several microseconds, paid once per sample).
        private = self.__pydantic_private__
        assert private is not None  # a model with private attributes always has the dict
        if private["_spec_hash"] is None:
            private["_spec_hash"] = hashlib.sha256(self.canonical_json()).hexdigest()
        return private["_spec_hash"]  # type: ignore[no-any-return]

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy (see pydantic's ``model_copy``) that does not carry this spec's hash over."""
        copied = super().model_copy(update=update, deep=deep)
        copied._spec_hash = None
        return copied


def load_spec(path: str | Path | None = None) -> RewardSpec:
    """Load a spec file, or the packaged default when ``path`` is ``None``.

    Raises :class:`InvalidRewardSpec` naming the file and listing every problem found.
    """
    if path is None:
        source = f"distill/specs/{DEFAULT_SPEC_RESOURCE}"
        text = resources.files("distill.specs").joinpath(DEFAULT_SPEC_RESOURCE).read_text(encoding="utf-8")
        return parse_spec(text, source)
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRewardSpec(source, [f"cannot read the file: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise InvalidRewardSpec(source, [f"the file is not UTF-8 (byte offset {exc.start})"]) from exc
    return parse_spec(text, source)


def parse_spec(text: str, source: str = "<string>") -> RewardSpec:
    """Validate a spec from YAML text; ``source`` names it in errors (replay passes archived spec text)."""
    try:
        duplicates = _duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidRewardSpec(source, [f"not valid YAML: {' '.join(str(exc).split())}"]) from exc
    if duplicates:
        # YAML silently keeps the last of two equal keys; in a spec that is almost always an editing slip.
        raise InvalidRewardSpec(source, duplicates)
    if not isinstance(data, dict):
        raise InvalidRewardSpec(
            source, [f"the file must hold a mapping of the spec's fields, got {type(data).__name__}"]
        )
    try:
        return RewardSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidRewardSpec(source, [_problem(error) for error in exc.errors()]) from exc


def _problem(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field (a typo?)"
    if error["type"] == "missing":
        return f"{where}: required field is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return message  # a check across fields; its message names them
    shown = repr(error["input"])
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    hint = " (quote it: YAML reads an unquoted date as a date)" if isinstance(error["input"], date) else ""
    return f"{where}: {message} (got {shown}){hint}"


def _duplicate_keys(node: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            where = f"{path}.{key}" if path else key
            if key in seen:
                found.append(f"{where}: appears twice (line {key_node.start_mark.line + 1}); keep one")
            seen.add(key)
            found += _duplicate_keys(value_node, where)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found += _duplicate_keys(item, f"{path}[{index}]")
    return found
