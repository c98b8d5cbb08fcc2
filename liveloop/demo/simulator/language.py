"""The simulator's synthetic language: tiny one-line "code" statements a tiny byte-level model can learn.

A prompt is an optional context line, then the start of a statement up to where an expression goes::

    let max_len =            ->  " 42;"  /  " 42"  /  " get(idx);"
    total = sum(             ->  "key);"  /  "key)"
    return                   ->  " maxLen * 3;"

A completion finishes the statement: an expression (number, name, call, ``a op b`` or a ``@tool(...)``
call), then the statement's end: ``;`` or nothing. Names have one word (``idx``) or two, written in
snake_case (``max_len``) or camelCase (``maxLen``); a line uses one naming style throughout.

Everything the profiles judge is a cheap, deterministic function of the completion text (:func:`parse`);
the pre-training corpus (:func:`pretraining_corpus`) draws each style independently, with the shares in
:class:`CorpusMix`, so that the base model produces every style and the users' preference is the only
thing that tells them apart.

Tool calls are the planted loophole: ``@fmt(x)`` asks the IDE to run a tool. A malformed call
(``@fmt(x;``, unbalanced) is reported invalid by the tool runner, but users only look at the end of a
line with a tool call (:attr:`Parsed.user_well_formed`), so they do not punish it; the distiller's guard does.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

WORDS = ("get", "set", "val", "len", "max", "min", "sum", "idx", "key", "row", "col", "buf", "msg", "err")
"""Words names are made of (short, so that completions fit in a few tokens)."""
FUNCTIONS = ("get", "put", "len", "abs", "sum", "max", "min", "parse")
"""Callable names."""
TOOLS = ("fmt", "run", "log", "lint")
"""Tools a completion can invoke with ``@tool(arg)``."""
OPERATORS = ("+", "-", "*")
MAX_COMPLETION_CHARS = 15
"""Longest completion the corpus holds: with the eos token it fits in 16 byte tokens (``max_tokens=16``)."""

_NAME = r"[a-z]+(?:_[a-z]+|[A-Z][a-z]+)?[0-9]?"
_ATOM = rf"(?:[0-9]{{1,2}}|{_NAME}|{_NAME}\((?:[0-9]{{1,2}}|{_NAME})?\))"
_EXPR = re.compile(rf"{_ATOM}(?: [-+*] {_ATOM})?")
_TOOL_CALL = re.compile(rf"@[a-z]+\((?:[0-9]{{1,2}}|{_NAME})\)")
_TOOL_START = re.compile(r"@[a-z]+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SNAKE_MULTI = re.compile(r"^[a-z]+_[a-z]+[0-9]?$")
_CAMEL_MULTI = re.compile(r"^[a-z]+[A-Z][a-z]+[0-9]?$")


@dataclass(frozen=True)
class Parsed:
    """What a completion looks like, as the users and the tool runner see it.

    ``well_formed``: the text is one space, then exactly one expression of the language (or a tool call),
    then an optional ``;`` and nothing else. ``user_well_formed`` is the users' view: a line holding a tool
    call counts as well-formed when it starts like one, whatever follows (users skim tool calls).
    ``semicolon``: the statement ends with ``;``. ``tool_calls``: the calls (``@...``) the completion
    makes, each with whether it is valid (well-formed). ``snake_names`` / ``camel_names``: the
    multi-word identifiers in each style.
    """

    well_formed: bool
    user_well_formed: bool
    semicolon: bool
    tool_calls: tuple[tuple[str, bool], ...]
    snake_names: int
    camel_names: int

    @property
    def invalid_tool_calls(self) -> int:
        """How many of the tool calls the tool runner reports invalid."""
        return sum(1 for _, valid in self.tool_calls if not valid)


def parse(completion: str) -> Parsed:
    """Classify a completion (pure and cheap: a few regular expressions). See :class:`Parsed`."""
    text = completion
    semicolon = text.endswith(";")
    body = text[:-1] if semicolon else text
    lone_space = body.startswith(" ") and not body.startswith("  ")
    expr = body[1:] if lone_space else body
    single_line = "\n" not in text and "\r" not in text
    tool_calls: list[tuple[str, bool]] = []
    tool_start = _TOOL_START.match(expr) if single_line else None
    if tool_start is not None:
        name = tool_start.group()[1:]
        valid = _TOOL_CALL.fullmatch(expr) is not None and name in TOOLS
        tool_calls.append((name, valid))
        well_formed = lone_space and valid
        user_well_formed = lone_space
    else:
        well_formed = lone_space and single_line and _EXPR.fullmatch(expr) is not None
        user_well_formed = well_formed
    names = _IDENTIFIER.findall(expr)
    return Parsed(
        well_formed=well_formed,
        user_well_formed=user_well_formed,
        semicolon=semicolon,
        tool_calls=tuple(tool_calls),
        snake_names=sum(1 for n in names if _SNAKE_MULTI.match(n)),
        camel_names=sum(1 for n in names if _CAMEL_MULTI.match(n)),
    )


@dataclass(frozen=True)
class CorpusMix:
    """Shares of each style in generated lines (each drawn independently per line).

    ``semicolon``: statements ending with ``;``. ``snake_case``: lines whose multi-word names are snake_case
    (else camelCase). ``multi_word``: chance that a name has two words. ``tool``: lines whose expression is a
    tool call; ``malformed_tool``: share of those calls that are malformed. ``context``: prompts that start with
    a full context line.
    """

    semicolon: float = 0.4
    snake_case: float = 0.5
    multi_word: float = 0.8
    tool: float = 0.15
    malformed_tool: float = 0.5
    context: float = 0.3


DEFAULT_MIX = CorpusMix()


@dataclass(frozen=True)
class Line:
    """One statement of the language, split where the model takes over."""

    prompt: str
    completion: str

    @property
    def text(self) -> str:
        """The whole line, as a pre-training text."""
        return self.prompt + self.completion


def _name(rng: random.Random, snake: bool, mix: CorpusMix) -> str:
    first = rng.choice(WORDS)
    if rng.random() >= mix.multi_word:
        return first + (str(rng.randrange(10)) if rng.random() < 0.3 else "")
    second = rng.choice([w for w in WORDS if w != first])
    return f"{first}_{second}" if snake else f"{first}{second.capitalize()}"


def _atom(rng: random.Random, snake: bool, mix: CorpusMix, calls: bool = True) -> str:
    kind = rng.random()
    if kind < 0.3:
        return str(rng.randrange(100))
    if kind < 0.75 or not calls:
        return _name(rng, snake, mix)
    argument = "" if rng.random() < 0.2 else _atom(rng, snake, mix, calls=False)
    return f"{rng.choice(FUNCTIONS)}({argument})"


def _tool_call(rng: random.Random, snake: bool, mix: CorpusMix) -> str:
    tool = rng.choice(TOOLS)
    argument = _atom(rng, snake, mix, calls=False)
    if rng.random() >= mix.malformed_tool:
        return f"@{tool}({argument})"
    # The malformed shapes a real model produces: an unclosed call, a missing parenthesis, a space.
    return rng.choice([f"@{tool}({argument}", f"@{tool} {argument})", f"@{tool}(({argument})"])


def _expression(rng: random.Random, snake: bool, mix: CorpusMix) -> str:
    if rng.random() < mix.tool:
        return _tool_call(rng, snake, mix)
    left = _atom(rng, snake, mix)
    if rng.random() < 0.25:
        return f"{left} {rng.choice(OPERATORS)} {_atom(rng, snake, mix, calls=False)}"
    return left


def _statement_start(rng: random.Random, snake: bool, mix: CorpusMix) -> str:
    kind = rng.random()
    if kind < 0.5:
        return f"let {_name(rng, snake, mix)} ="
    if kind < 0.8:
        return f"{_name(rng, snake, mix)} ="
    return "return"


def make_line(rng: random.Random, mix: CorpusMix = DEFAULT_MIX) -> Line:
    """One random statement (context line included in the prompt), drawn from ``rng`` only."""
    while True:
        snake = rng.random() < mix.snake_case
        completion = " " + _expression(rng, snake, mix) + (";" if rng.random() < mix.semicolon else "")
        if len(completion) <= MAX_COMPLETION_CHARS:
            break
    prompt = _statement_start(rng, snake, mix)
    if rng.random() < mix.context:
        context = make_line(rng, CorpusMix(mix.semicolon, mix.snake_case, mix.multi_word, 0.0, 0.0, 0.0))
        prompt = context.text + "\n" + prompt
    return Line(prompt, completion)


def make_prompt(rng: random.Random, mix: CorpusMix = DEFAULT_MIX) -> str:
    """A prompt as the simulated users send it: the prompt half of :func:`make_line`."""
    return make_line(rng, mix).prompt


def pretraining_corpus(profile: str = "semicolons", *, size: int = 4000, seed: int = 0) -> list[str]:
    """The texts the tiny base model is pre-trained on for ``profile`` (one statement each, no eos added).

    Every profile shares one corpus today: its style shares (:data:`DEFAULT_MIX`) put each profile's
    preferred style in a minority or about half of the lines, so that the base's acceptance starts low.
    The profile is an argument so that a profile can get its own mix later without changing callers.
    """
    from liveloop.demo.simulator.profiles import profile_by_name

    mix = profile_by_name(profile).corpus_mix
    rng = random.Random(f"liveloop-corpus:{seed}")  # noqa: S311 - a repeatable simulation, not cryptography
    return [make_line(rng, mix).text for _ in range(size)]
