"""The secret detectors used by :mod:`ingest.redaction`, and the heuristics that keep them quiet.

The false-positive policy these implement is described in :mod:`ingest.redaction`.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import string
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

MIN_RANDOM_TOKEN_CHARS = 32
MIN_RANDOM_ENTROPY_BITS = 4.0


@dataclass(frozen=True, slots=True)
class Rule:
    """One detector: where ``pattern`` matches (and ``accept`` agrees), a secret of ``kind`` stands."""

    kind: str
    pattern: re.Pattern[str]
    hints: tuple[str, ...] = ()  # the rule runs only if one of these occurs (a cheap substring test)
    fold: bool = False  # hints are matched against the lower-cased text
    groups: tuple[int | str, ...] = (0,)  # the first of these that matched is the secret
    accept: Callable[[re.Match[str]], bool] | None = None


# Templates and stand-ins: "${DB_PASSWORD}", "{{ .Values.token }}", "<your-token>", "[MASK]", "%s".
_TEMPLATE = re.compile(
    r"\$\{|\{\{|\$\(|%\(|%[sdr]|\{\w*\}|^<[^>]*>$|^\[[^\]]*\]$|^\$[A-Za-z_]|\[REDACTED:"
    r"|^(?:your|my)[-_ ]|[-_ ]here$|\.\.\.|xxx|^__\w+__$",
    re.IGNORECASE,
)
_STAND_INS = frozenset({"password", "passwd", "passphrase", "secret", "token", "apikey", "changeme", "username"})
_CONSTANT_NAME = re.compile(r"[A-Z][A-Z_]*")  # "YOUR_API_KEY": a placeholder, not a value
_LABEL = re.compile(r"[A-Z][a-z]*(?: [A-Za-z]+)*")  # "Password", "Enter password": UI text
_CODE_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_CODE_CHARS = frozenset("()[]{}<>$%")
_SYMBOLS = frozenset("-_+/=!@#$%^&*.~:;?|")
_NAME_SEPARATORS = re.compile(r"[-_. ]")
_PASSWORD_WORDS = ("password", "passwd", "pwd", "passphrase")
# Words joined by "-" or "_" ("no-token", "vocab_size", "Access-Control-Allow-Credentials") are names.
_SLUG = re.compile(r"[A-Za-z]{1,16}(?:[-_][A-Za-z]{1,16})+")
_KEY_NAME_WORDS = ("password", "passwd", "secret", "token", "credential", "key")
_PIECE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_SEPARATORS = re.compile(r"[/_=-]+")  # not "+": it joins base64, never names
_HEX = frozenset("0123456789abcdefABCDEF")
_RUN_CHARS = frozenset((string.ascii_letters + string.digits + "+/_-").encode())
_RUN, _PAD, _OTHER = ord("a"), ord("="), ord(" ")
_RUN_MASK = bytes(_RUN if byte in _RUN_CHARS else _PAD if byte == _PAD else _OTHER for byte in range(256))
_RUN_SEED = bytes([_RUN]) * MIN_RANDOM_TOKEN_CHARS
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{16}")
_DIGEST_PREFIXES = ("sha1-", "sha256-", "sha384-", "sha512-")  # subresource integrity, lock files
_SSH_KEY_TYPE = re.compile(r"(?:ssh-(?:rsa|dss|ed25519)|ecdsa-sha2-nistp\d+|sk-ssh-ed25519@openssh\.com) \Z")


def _entropy(text: str) -> float:
    size = len(text)
    return -sum(n / size * math.log2(n / size) for n in Counter(text).values())


def _mixed(text: str) -> bool:
    return any(c.islower() for c in text) and any(c.isupper() for c in text) and any(c.isdigit() for c in text)


def _word_like(text: str) -> bool:
    # Identifiers split into pieces averaging 4+ characters ("Connection", "Manager"); random strings
    # switch case and class every couple of characters.
    pieces = _PIECE.findall(text)
    return not pieces or sum(map(len, pieces)) / len(pieces) >= 3.0


def looks_random(token: str) -> bool:
    """Whether a run of base64-ish characters looks like random key material rather than a name."""
    core = max(_SEPARATORS.split(token), key=len)
    if len(core) < 16 or set(core) <= _HEX or not _mixed(core):
        return False
    return _entropy(token.rstrip("=")) >= MIN_RANDOM_ENTROPY_BITS and not _word_like(core)


def _public_material(text: str, start: int, token: str) -> bool:
    # Random-looking but public by construction: inline data, digests, certificates, public keys.
    if text[max(0, start - 7) : start] == "base64," or token.startswith(_DIGEST_PREFIXES):
        return True
    if _SSH_KEY_TYPE.search(text, max(0, start - 24), start):
        return True
    begin = text.rfind("-----BEGIN ", max(0, start - 16_384), start)
    return begin != -1 and "PRIVATE" not in text[begin : begin + 40] and text.find("-----END", begin, start) == -1


def has_token_run(text: str) -> bool:
    """Whether ``text`` holds a run of 32+ base64-ish characters: the start of every high-entropy span."""
    return text.encode("ascii", "replace").translate(_RUN_MASK).find(_RUN_SEED) != -1


def random_token_spans(text: str) -> Iterator[tuple[int, int]]:
    """Spans of the runs of 32+ base64-ish characters in ``text`` that look like random key material.

    A run is a maximal stretch of ``[A-Za-z0-9+/_-]`` with up to two ``=`` of padding.
    """
    # Runs are found on a one-byte-per-character mask with bytes.find, several times faster than a
    # regex scan; this is the one detector that must look at every character of every text.
    mask = text.encode("ascii", "replace").translate(_RUN_MASK)
    size = len(mask)
    start = mask.find(_RUN_SEED)
    while start != -1:
        end = min((stop for stop in (mask.find(b" ", start), mask.find(b"=", start)) if stop != -1), default=size)
        stop = end
        while stop < size and stop - end < 2 and mask[stop] == _PAD:
            stop += 1
        if stop == size or mask[stop] == _OTHER:
            token = text[start:stop]
            if looks_random(token) and not _public_material(text, start, token):
                yield start, stop
        start = mask.find(_RUN_SEED, stop)


def _not_placeholder(value: str) -> bool:
    return (
        len(set(value)) >= 4
        and value.lower() not in _STAND_INS
        and not _TEMPLATE.search(value)
        and not _CONSTANT_NAME.fullmatch(value)
    )


def _credential_like(value: str) -> bool:
    has_upper, has_lower = any(c.isupper() for c in value), any(c.islower() for c in value)
    return any(c.isdigit() for c in value) or (has_upper and has_lower) or not _SYMBOLS.isdisjoint(value)


def secret_value(value: re.Match[str], key: str) -> bool:
    """Whether the value assigned to secret-sounding ``key`` is a real value, not code or a template."""
    name = _NAME_SEPARATORS.sub("", key).lower()
    password = name.endswith(_PASSWORD_WORDS)
    if "public" in name or (value.group("compare") and not password):
        return False  # public_key is public by name; token == "keyword" is a lexer, not a login
    quoted = value.group("quoted")
    if quoted is not None:
        candidate = quoted
        code = "." in quoted and _CODE_PATH.fullmatch(quoted) is not None  # `torch.LongTensor` in a docstring
        # Outside passwords (passphrases), a value with spaces is prose or code: `(batch, atoms)`.
        plausible = len(quoted) >= 6 and not _LABEL.fullmatch(quoted) and not code and (password or " " not in quoted)
    else:
        candidate = value.group("bare").rstrip(":;,.)")
        # A bare name is usually a variable (``password = new_password``, ``secret = s3_client``);
        # digits in a name without underscores betray a literal (``password: hunter22``).
        # Environment files (upper-case keys) hold literals, so there only a dotted path is code.
        is_code = _CODE_PATH.fullmatch(candidate) is not None and (
            "." in candidate
            or (not key.isupper() and ("_" in candidate or not any(c.isdigit() for c in candidate)))
            or any(word in candidate.lower() for word in _KEY_NAME_WORDS if word in name)  # oauth2_credentials
        )
        plausible = (
            len(candidate) >= 8
            and any(c.isalpha() for c in candidate)
            and _CODE_CHARS.isdisjoint(candidate)
            and "//" not in candidate  # a URL; passwords inside URLs have their own detector
            and not is_code
        )
    if not plausible or not _not_placeholder(candidate) or _NAME_SEPARATORS.sub("", candidate).lower() in name:
        return False  # CREDENTIALS = "credentials" names a field, it is not one
    # "token" and "key" also mean lexer tokens and dict keys: there, demand something key-like.
    return password or (len(candidate) >= 8 and _credential_like(candidate) and not _SLUG.fullmatch(candidate))


def _key_material(match: re.Match[str]) -> bool:
    # A PEM header quoted in code ("-----BEGIN RSA PRIVATE KEY-----" as a marker) holds no key.
    return _BASE64_RUN.search(match.group()) is not None


def _basic_credentials(match: re.Match[str]) -> bool:
    # HTTP Basic credentials are base64 of "user:password"; checking that keeps prose ("basic
    # internationalization") from matching.
    try:
        decoded = base64.b64decode(match.group("secret"), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


def _opaque_token(match: re.Match[str]) -> bool:
    value = match.group("secret")
    return _not_placeholder(value) and not (value.isalpha() and value.islower())


def _mixed_token(match: re.Match[str]) -> bool:
    return _mixed(match.group())


def _letters_token(match: re.Match[str]) -> bool:
    return not _word_like(match.group()[3:])


def _prefixed(prefix: str, body: str, boundary: str = "A-Za-z0-9_-") -> re.Pattern[str]:
    # The literal comes first so that the regex engine can jump to it with a fast substring search;
    # the look-behind then checks that the prefix does not sit inside a longer word.
    return re.compile(f"{re.escape(prefix)}(?<![{boundary}].{{{len(prefix)}}}){body}")


_B64_END = r"(?![A-Za-z0-9_-])"

# Order matters: specific shapes first, so that a key gets its precise kind and later, generic rules
# see a placeholder (which they never match) instead of the key.
SHAPE_RULES: tuple[Rule, ...] = (
    Rule(
        "private_key",
        re.compile(
            r"-----BEGIN (?P<label>[A-Z0-9 ]*?)PRIVATE KEY(?: BLOCK)?-----"
            r"(?:.*?-----END (?P=label)PRIVATE KEY(?: BLOCK)?-----|(?:(?:\s|\\[nr])*[A-Za-z0-9+/=]{16,})*)",
            re.DOTALL,
        ),
        ("PRIVATE KEY",),
        accept=_key_material,
    ),
    Rule("jwt", _prefixed("eyJ", r"[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), ("eyJ",)),
    Rule(
        "url_password",
        re.compile(r"://[^\s:/?#@'\"<>\[\]]{0,256}:(?P<secret>[^\s/?#@'\"<>]{1,256})@"),
        ("://",),
        groups=("secret",),
        accept=lambda match: _not_placeholder(match.group("secret")),
    ),
    Rule(
        "aws_access_key",
        re.compile(r"A(?:KIA|SIA|BIA|CCA)(?<![A-Za-z0-9]....)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        ("AKIA", "ASIA", "ABIA", "ACCA"),
    ),
    Rule("gcp_api_key", _prefixed("AIza", r"[0-9A-Za-z_-]{35}" + _B64_END), ("AIza",)),
    Rule(
        "github_token",
        re.compile(r"gh[pousr]_(?<![A-Za-z0-9_]....)[A-Za-z0-9]{36,255}(?![A-Za-z0-9_])"),
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    Rule("github_token", _prefixed("github_pat_", r"[A-Za-z0-9_]{22,255}", "A-Za-z0-9_"), ("github_pat_",)),
    Rule("gitlab_token", _prefixed("glpat-", r"[A-Za-z0-9_.-]{20,}"), ("glpat-",)),
    Rule(
        "slack_webhook",
        re.compile(r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/+-]{8,}"),
        ("hooks.slack.com",),
    ),
    Rule("slack_token", re.compile(r"xox[abposr]-(?<![A-Za-z0-9_-].....)[A-Za-z0-9-]{10,}"), ("xox",)),
    Rule("slack_token", _prefixed("xapp-", r"\d-[A-Za-z0-9-]{10,}"), ("xapp-",)),
    Rule(
        "stripe_key",
        re.compile(r"(?<![A-Za-z0-9_])[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"),
        ("k_live_", "k_test_"),
    ),
    Rule("stripe_key", _prefixed("whsec_", r"[A-Za-z0-9]{24,}", "A-Za-z0-9_"), ("whsec_",)),
    Rule("anthropic_key", _prefixed("sk-ant-", r"[A-Za-z0-9_-]{20,}"), ("sk-ant-",)),
    Rule(
        "openai_key",
        _prefixed("sk-", r"(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        ("sk-",),
        accept=_mixed_token,
    ),
    Rule(
        "huggingface_token",
        _prefixed("hf_", r"[A-Za-z0-9]{34,}(?![A-Za-z0-9_])", "A-Za-z0-9_"),
        ("hf_",),
        accept=_letters_token,
    ),
    Rule(
        "npm_token",
        _prefixed("npm_", r"[A-Za-z0-9]{36}(?![A-Za-z0-9_])", "A-Za-z0-9_"),
        ("npm_",),
        accept=_mixed_token,
    ),
    Rule("pypi_token", _prefixed("pypi-AgEIcHlwaS5vcmc", r"[A-Za-z0-9_-]{50,}"), ("pypi-AgEIcHlwaS5vcmc",)),
    Rule(
        "bearer_token",
        re.compile(r"\bbearer[ \t]+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)", re.IGNORECASE),
        ("bearer",),
        fold=True,
        groups=("secret",),
        accept=_opaque_token,
    ),
    Rule(
        "basic_auth",
        re.compile(r"\bbasic[ \t]+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])", re.IGNORECASE),
        ("basic ", "basic\t"),
        fold=True,
        groups=("secret",),
        accept=_basic_credentials,
    ),
)

# Assignments are found from their key word (a fast substring search) rather than by one regex
# tried at every position, which was the slowest step by far.
KEY_WORDS = (
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "secret",
    "token",
    "credential",
    "credentials",
    "key",
)
KEY_QUALIFIER = re.compile(r"(?:api|access|private|secret|session|signing|encryption|master|auth)[_-]?\Z")
KEY_START = re.compile(r"[A-Za-z0-9_.-]*\Z")
ASSIGNED_VALUE = re.compile(
    r"(?![A-Za-z0-9_])[\"']?[ \t]*"
    r"(?::[ \t]*[A-Za-z_][\w\[\]., |]{0,40}?[ \t]*=(?!=)|(?P<compare>[=!]==?)|=>|:=|=|:)[ \t]*"
    r"(?:(?P<q>[\"'`])(?P<quoted>[^\"'`\n\\]{1,512})(?P=q)|(?P<bare>[^\s\"'`,;]{1,512}))"
)
ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def assignment_kind(key: str, word: str) -> str:
    """The placeholder kind for a value assigned to ``key``, whose key word is ``word``."""
    if "secret" in key and "access" in key:
        return "aws_secret_key"
    return "password" if word.startswith(("pass", "pwd")) else "secret"
