"""The regression suite: prompts with checks that every candidate's greedy completion must satisfy.

A suite is a typed, versioned YAML or JSON file (see ``serving/suites/default.yaml``): a name, a
version, the decode length, and cases, each a prompt with one or more checks:
``contains`` / ``not_contains`` (a substring), ``regex`` / ``not_regex`` (``re.search``),
``max_length`` / ``min_length`` (characters of the completion). Decoding is greedy, so a suite run is
deterministic for a given model. An optional ``diversity`` section says how the gate samples (not
greedy) to compare diversity and well-formedness (:class:`serving.diversity.DiversityProbe`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serving.diversity import DiversityProbe, RegexPattern
from serving.documents import read_document
from serving.errors import ServingError

DEFAULT_SUITE = Path(__file__).with_name("suites") / "default.yaml"
SUITE_SCHEMA_VERSION = 1


class InvalidSuite(ServingError):
    """The regression suite file is missing or invalid; the message lists every problem. Fix the file."""


class _Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Contains(_Check):
    kind: Literal["contains"]
    text: str = Field(min_length=1)

    def passes(self, completion: str) -> bool:
        return self.text in completion


class NotContains(_Check):
    kind: Literal["not_contains"]
    text: str = Field(min_length=1)

    def passes(self, completion: str) -> bool:
        return self.text not in completion


class Regex(_Check):
    kind: Literal["regex", "not_regex"]
    pattern: RegexPattern

    def passes(self, completion: str) -> bool:
        found = re.search(self.pattern, completion) is not None
        return found if self.kind == "regex" else not found


class Length(_Check):
    kind: Literal["max_length", "min_length"]
    value: int = Field(ge=0)

    def passes(self, completion: str) -> bool:
        return len(completion) <= self.value if self.kind == "max_length" else len(completion) >= self.value


Check = Annotated[Contains | NotContains | Regex | Length, Field(discriminator="kind")]


class Case(BaseModel):
    """One prompt and what its completion must satisfy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    prompt: str = Field(min_length=1)
    checks: list[Check] = Field(min_length=1)


class Suite(BaseModel):
    """A named, versioned set of cases."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(default=SUITE_SCHEMA_VERSION, ge=1, le=SUITE_SCHEMA_VERSION)
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    max_tokens: int = Field(default=32, ge=1, le=512, description="Greedy tokens decoded per case.")
    cases: list[Case] = Field(min_length=1)
    diversity: DiversityProbe = Field(
        default_factory=DiversityProbe,
        description="How the gate samples both policies to compare diversity and well-formedness.",
    )

    @field_validator("cases")
    @classmethod
    def _unique_ids(cls, cases: list[Case]) -> list[Case]:
        ids = [case.id for case in cases]
        if len(set(ids)) != len(ids):
            raise ValueError(f"case ids must be unique, got {sorted(i for i in set(ids) if ids.count(i) > 1)}")
        return cases


class CaseResult(BaseModel):
    """A case's completion and the checks it failed."""

    model_config = ConfigDict(frozen=True)

    id: str
    completion: str
    failed: list[str]

    @property
    def passed(self) -> bool:
        return not self.failed


class SuiteResult(BaseModel):
    """Every case's result and the pass rate."""

    model_config = ConfigDict(frozen=True)

    suite: str
    version: str
    cases: list[CaseResult]

    @property
    def pass_rate(self) -> float:
        return sum(case.passed for case in self.cases) / len(self.cases)


def load_suite(path: Path = DEFAULT_SUITE) -> Suite:
    """Read a suite from YAML or JSON."""
    try:
        data = read_document(path)
    except OSError as exc:
        raise InvalidSuite(f"cannot read regression suite {path}: {exc}") from exc
    except ValueError as exc:
        raise InvalidSuite(f"{path} is not a valid regression suite: {exc}") from exc
    try:
        return Suite.model_validate(data)
    except ValidationError as exc:
        raise InvalidSuite(f"{path} is not a valid regression suite: {exc}") from exc


def greedy_completion(model: Any, tokenizer: Any, prompt: str, max_tokens: int) -> str:
    """Decode ``max_tokens`` greedy tokens (stopping at eos) after ``prompt``, with a KV cache; the text."""
    import torch

    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id]
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    out: list[int] = []
    with torch.no_grad():
        step = torch.tensor([ids], dtype=torch.long, device=device)
        past = None
        for _ in range(max_tokens):
            result = model(input_ids=step, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(result.logits[0, -1].argmax())
            if token == eos:
                break
            out.append(token)
            step = torch.tensor([[token]], dtype=torch.long, device=device)
    return str(tokenizer.decode(out, skip_special_tokens=True))


def run_suite(suite: Suite, model: Any, tokenizer: Any) -> SuiteResult:
    """Run every case with greedy decoding and check its completion."""
    results = []
    for case in suite.cases:
        completion = greedy_completion(model, tokenizer, case.prompt, suite.max_tokens)
        failed = [check.model_dump_json() for check in case.checks if not check.passes(completion)]
        results.append(CaseResult(id=case.id, completion=completion, failed=failed))
    return SuiteResult(suite=suite.name, version=suite.version, cases=results)
