"""Shared parts of the fuzz runs against the ingest API and the gateway (issue #8, "Bad input and hostile clients").

A run sends requests from several generators to an app served by uvicorn on a real socket: schemathesis
cases from the app's own OpenAPI document (positive and negative, with the right key, and some with no key
or a wrong one), and hypothesis-made hostile requests that schemathesis would not make (see
:func:`hostile_json` and :func:`wire_forms`). :class:`Tally` records every answer: a 5xx, an exception on the
way, an answer that breaks the app's OpenAPI document, or a 4xx without a reason a client can read is a
problem; the test asserts there were none, and writes the figures to the reliability report.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.reliability.profile import ReliabilityProfile
from tests.reliability.report import markdown_table, write_section

ReasonCheck = Callable[[int, bytes, Mapping[str, str]], str | None]
"""``(status, body, request headers) -> None`` when the answer is sound, else what is wrong with it (e.g. a 4xx
without a reason). It may also note what the answer implies (events accepted, dead letters to expect)."""

SCHEMA_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
_FUZZ = settings(
    deadline=None,
    database=None,  # nothing fails inside a run (problems are collected), so there is nothing to replay
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
_KEEP_PROBLEMS = 25


@dataclass
class Tally:
    """Every request a fuzz run sent: counts by generator and status, and the problems found."""

    check: ReasonCheck
    sent: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    by_generator: dict[str, Counter[int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def total(self) -> int:
        return sum(self.sent.values())

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)

    def record(self, generator: str, status: int, content: bytes, headers: Mapping[str, str], what: str) -> None:
        """Count one answer and check it: no 5xx, and a reason wherever the app's check wants one."""
        self.sent[generator] += 1
        self.statuses[status] += 1
        self.by_generator.setdefault(generator, Counter())[status] += 1
        problem = self.check(status, content, headers)
        if status >= 500:
            problem = f"answered {status}"
        if problem is not None:
            self.problem(f"{generator}: {problem}; request: {what}; answer: {content[:300]!r}")

    def failed(self, generator: str, what: str, error: BaseException) -> None:
        """A request that got no answer at all (the connection broke, it timed out): counted as sent, a problem."""
        self.sent[generator] += 1
        self.statuses[0] += 1
        self.by_generator.setdefault(generator, Counter())[0] += 1
        self.problem(f"{generator}: no answer ({type(error).__name__}: {error}); request: {what}")

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < _KEEP_PROBLEMS:
            self.problems.append(text[:1500])

    def write(self, profile: ReliabilityProfile, section: str, extra: dict[str, Any]) -> None:
        """The report section: requests sent, by status, by generator, 5xx count, duration, and ``extra``."""
        seconds = time.monotonic() - self.started
        data = {
            "requests": self.total,
            "target": profile.fuzz_requests,
            "by_status": {str(status): count for status, count in sorted(self.statuses.items())},
            "by_generator": {
                name: {"sent": self.sent[name], "by_status": {str(s): c for s, c in sorted(statuses.items())}}
                for name, statuses in sorted(self.by_generator.items())
            },
            "server_errors": self.server_errors,
            "problems": self.problem_count,
            "problem_samples": self.problems,
            "duration_s": round(seconds, 1),
            "requests_per_s": round(self.total / seconds, 1) if seconds else None,
            **extra,
        }
        rows = [
            (name, self.sent[name], ", ".join(f"{s}: {c}" for s, c in sorted(statuses.items())))
            for name, statuses in sorted(self.by_generator.items())
        ]
        summary = (
            f"{self.total} requests (target {profile.fuzz_requests}) in {seconds:.0f} s; "
            f"5xx: {self.server_errors}; problems: {self.problem_count}; "
            f"by status: {', '.join(f'{s}: {c}' for s, c in sorted(self.statuses.items()))}\n\n"
        )
        details = "".join(f"- {key}: {value}\n" for key, value in extra.items())
        write_section(
            profile, section, data, summary + markdown_table(["generator", "sent", "by status"], rows) + details
        )


def drive(strategy: st.SearchStrategy[Any], count: int, send: Callable[[Any], None]) -> int:
    """Draw ``count`` examples of ``strategy`` and ``send`` each; return how many were sent.

    Hypothesis may stop a run early when it runs out of distinct examples, so runs repeat until the
    count is reached (or a run sends nothing).
    """
    sent = 0
    while sent < count:
        before = sent

        @settings(_FUZZ, max_examples=count - sent)
        @given(example=strategy)
        def run(example: Any) -> None:
            nonlocal sent
            if sent < count:
                send(example)
                sent += 1

        run()
        if sent == before:
            break
    return sent


@dataclass
class SchemaFuzz:
    """Sends schemathesis cases of an app's OpenAPI document and records them in a tally."""

    base_url: str
    session: requests.Session
    tally: Tally
    key: str

    def cases(self, paths: Iterable[tuple[str, str]], mode: GenerationMode) -> st.SearchStrategy[Case]:
        """Cases of the operations ``(path, method)`` of the app's document, as served at ``/openapi.json``."""
        schema = schemathesis.openapi.from_url(f"{self.base_url}/openapi.json")
        return st.one_of([schema[path][method].as_strategy(generation_mode=mode) for path, method in paths])

    def send(self, case: Case, generator: str, authorization: str | None) -> None:
        """Send ``case`` with ``authorization`` (None: no Authorization header at all); check the answer."""
        headers = dict(case.headers or {})
        headers.pop("Authorization", None)
        case.headers = headers
        extra = {} if authorization is None else {"Authorization": authorization}
        what = f"{case.method} {case.path} headers={_short(case.headers)} body={_short(case.body)}"
        try:
            response = case.call(base_url=self.base_url, session=self.session, headers=extra, timeout=60)
        except requests.RequestException as exc:
            self.tally.failed(generator, what, exc)
            return
        if authorization == f"Bearer {self.key}" and "Authorization" not in response.request.headers:
            # Negative mode negates the security requirement too: schemathesis then sends no key at all.
            generator = "schemathesis negative, key removed"
            if response.status_code != 401:
                self.tally.problem(f"{generator}: answered {response.status_code}, not 401; request: {what}")
        self.tally.record(generator, response.status_code, response.content, response.request.headers, what)
        try:
            case.validate_response(response, checks=SCHEMA_CHECKS, headers=extra)
        except BaseExceptionGroup as exc:  # schemathesis' FailureGroup: the answer breaks the app's own document
            self.tally.problem(f"{generator}: the answer breaks the OpenAPI document: {str(exc)[:600]}")

    def run(self, paths: list[tuple[str, str]], mode: GenerationMode, count: int, generator: str) -> None:
        """``count`` cases in ``mode`` with the right key."""
        drive(self.cases(paths, mode), count, lambda case: self.send(case, generator, f"Bearer {self.key}"))

    def run_unauthenticated(self, paths: list[tuple[str, str]], count: int) -> None:
        """``count`` cases (both modes) with no key, a wrong key or another scheme: each must get 401."""
        wrong = ["", "Bearer", f"Bearer {self.key}x", f"Bearer  {self.key[:-1]}", f"Basic {self.key}", "Bearer \u00e9"]
        strategy = st.tuples(
            self.cases(paths, GenerationMode.POSITIVE) | self.cases(paths, GenerationMode.NEGATIVE),
            st.sampled_from([None, *wrong]),
        )

        def send(example: tuple[Case, str | None]) -> None:
            case, authorization = example
            before = self.tally.statuses[401]
            self.send(case, "schemathesis no/wrong key", authorization)
            if self.tally.statuses[401] == before:
                self.tally.problem(f"no/wrong key {authorization!r} was not answered 401: {case.path}")

        drive(strategy, count, send)


def _short(value: object, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# ------------------------------------------------------------------------------------------ hostile input


def _big_numbers() -> st.SearchStrategy[Any]:
    return st.sampled_from([10**400, -(10**400), 2**63, 2**64, -(2**63) - 1, 1e308, -1e308, 5e-324, -0.0, 1e-400])


def hostile_json(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Arbitrary JSON values: NUL, lone surrogates and huge numbers included, nested up to ~40 levels."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | _big_numbers()
        | st.sampled_from([math.nan, math.inf, -math.inf])
        | st.text(max_size=40)
        | st.text(st.characters(codec=None, categories=["Cs", "Cc", "Co", "Zs"]), max_size=10)
        | st.sampled_from(["\x00", "\ud800", "\udfff", "\ufeff", "\U0010ffff", "' OR 1=1 --", "${jndi:ldap://x}"])
    )
    nested = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=max_leaves,
    )
    return nested | st.builds(_nest, scalars, st.integers(20, 45), st.booleans())


def _nest(leaf: Any, depth: int, objects: bool) -> Any:
    for _ in range(depth):
        leaf = {"a": leaf} if objects else [leaf]
    return leaf


def dumps(value: Any, ascii_only: bool = True) -> bytes:
    """JSON bytes of ``value``; unescaped lone surrogates become the invalid UTF-8 a sloppy client would send."""
    text = json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)
    return text.encode("utf-8", errors="surrogatepass")


CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    None,
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=fuzz",
    "application/json; charset=utf-16",
    "application/xml",
    "application/json; charset=\u00ff",
    ";;;",
    "*/*",
]


@dataclass(frozen=True)
class Hostile:
    """One hostile request: its kind (for the report), body, content type and whether it is sent chunked."""

    kind: str
    body: bytes
    content_type: str | None = "application/json"
    chunked: bool = False

    def describe(self) -> str:
        return f"{self.kind} content-type={self.content_type!r} chunked={self.chunked} body={_short(self.body)}"


def wire_forms(kind: str, bodies: st.SearchStrategy[bytes]) -> st.SearchStrategy[Hostile]:
    """Bodies as sent: mostly plain JSON requests, some truncated, with an invalid byte, a wrong content
    type, or sent chunked (no Content-Length)."""
    plain = st.builds(Hostile, st.just(kind), bodies)
    truncated = st.builds(lambda b, cut: Hostile(f"{kind}+truncated", b[: int(len(b) * cut)]), bodies, st.floats(0, 1))
    invalid_utf8 = st.builds(
        lambda b, at, bad: Hostile(f"{kind}+invalid-utf8", b[: int(len(b) * at)] + bad + b[int(len(b) * at) :]),
        bodies,
        st.floats(0, 1),
        st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x00", b"\xc0\xaf"]),
    )
    content_type = st.builds(
        lambda b, ct: Hostile(f"{kind}+content-type", b, ct), bodies, st.sampled_from(CONTENT_TYPES)
    )
    chunked = st.builds(lambda b: Hostile(f"{kind}+chunked", b, chunked=True), bodies)
    return st.one_of(plain, plain, truncated, invalid_utf8, content_type, chunked)


def post(session: requests.Session, url: str, request: Hostile, headers: dict[str, str]) -> requests.Response:
    """Send one hostile request."""
    sent = dict(headers)
    if request.content_type is not None:
        sent["Content-Type"] = request.content_type
    data: bytes | Iterator[bytes] = _chunks(request.body) if request.chunked else request.body
    return session.post(url, data=data, headers=sent, timeout=120)


def _chunks(body: bytes, size: int = 4096) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def split(total: int, shares: dict[str, float]) -> dict[str, int]:
    """``total`` requests split by ``shares`` (the last one takes the rounding)."""
    names = list(shares)
    counts = {name: math.floor(total * shares[name]) for name in names[:-1]}
    counts[names[-1]] = total - sum(counts.values())
    return counts
