"""Redaction: every kind of secret is replaced by its placeholder, ordinary code passes untouched.

The fake secrets are assembled at run time, so that this file holds no literal that a secret
scanner would flag.
"""

from __future__ import annotations

import base64
import json
import random
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import GenerationEvent, parse_event
from ingest.events import event_to_json
from ingest.payloads import MAX_TEXT_CHARS
from ingest.redaction import placeholder, redact_event, redact_text
from tests.ingest.event_samples import sample_event

_RNG = random.Random(20250131)
ALNUM = string.ascii_letters + string.digits


def fake(alphabet: str, size: int) -> str:
    """A deterministic random string: the same fake secrets on every run."""
    return "".join(_RNG.choice(alphabet) for _ in range(size))


def mixed(size: int, alphabet: str = ALNUM) -> str:
    """A random string with upper case, lower case and digits, like real key material."""
    while True:
        value = fake(alphabet, size)
        if any(c.isupper() for c in value) and any(c.islower() for c in value) and any(c.isdigit() for c in value):
            return value


AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SESSION_ID = "ASIA" + fake(string.ascii_uppercase + string.digits, 16)
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
GCP_KEY = "AIza" + mixed(35, ALNUM + "-_")
GITHUB_TOKENS = [prefix + "_" + mixed(36) for prefix in ("ghp", "gho", "ghu", "ghs", "ghr")]
GITHUB_PAT = "github_pat_" + mixed(22) + "_" + mixed(59)
GITLAB_TOKEN = "glpat-" + mixed(20)
SLACK_BOT = "xoxb-" + fake(string.digits, 12) + "-" + fake(string.digits, 13) + "-" + mixed(24)
SLACK_USER = "xoxp-" + fake(string.digits, 12) + "-" + fake(string.digits, 12) + "-" + mixed(32)
SLACK_HOOK = "https://hooks.slack.com/services/T" + fake(ALNUM, 8) + "/B" + fake(ALNUM, 8) + "/" + mixed(24)
STRIPE_SECRET = "sk_" + "live_" + mixed(24)
STRIPE_RESTRICTED = "rk_" + "live_" + mixed(24)
OPENAI_PROJECT = "sk-" + "proj-" + mixed(48, ALNUM + "-_")
OPENAI_LEGACY = "sk-" + mixed(20) + "T3Blbk" + "FJ" + mixed(20)
ANTHROPIC = "sk-" + "ant-api03-" + mixed(93, ALNUM + "-_") + "AA"
HUGGINGFACE = "hf_" + fake(string.ascii_letters, 34)
JWT = ".".join(
    base64.urlsafe_b64encode(part).decode().rstrip("=")
    for part in (b'{"alg":"HS256","typ":"JWT"}', b'{"sub":"1234567890","name":"Jane","iat":1516239022}', b"\x8f" * 32)
)
PEM_BODY = base64.b64encode(bytes(_RNG.getrandbits(8) for _ in range(600))).decode()
PEM_LINES = "\n".join(PEM_BODY[i : i + 64] for i in range(0, len(PEM_BODY), 64))
BEGIN, END = "-----BEGIN ", "-----END "
RSA_KEY = f"{BEGIN}RSA PRIVATE KEY-----\n{PEM_LINES}\n{END}RSA PRIVATE KEY-----"
OPENSSH_KEY = f"{BEGIN}OPENSSH PRIVATE KEY-----\n{PEM_LINES}\n{END}OPENSSH PRIVATE KEY-----"
BEARER = mixed(40, ALNUM + "-._~")
HIGH_ENTROPY = mixed(44, ALNUM + "+/")

# (kind, text containing the secret, the secret itself)
SECRETS: list[tuple[str, str, str]] = [
    ("aws_access_key", f'aws_access_key_id = "{AWS_ID}"\n', AWS_ID),
    ("aws_access_key", f"The temporary key {AWS_SESSION_ID} expires in an hour.", AWS_SESSION_ID),
    ("aws_secret_key", f"[default]\naws_secret_access_key = {AWS_SECRET}\nregion = eu-west-1\n", AWS_SECRET),
    ("aws_secret_key", f'{{"AccessKeyId": "x", "SecretAccessKey": "{AWS_SECRET}"}}', AWS_SECRET),
    ("gcp_api_key", f'const firebaseConfig = {{ apiKey: "{GCP_KEY}", projectId: "demo" }};', GCP_KEY),
    *[("github_token", f"git clone https://{token}@github.com/acme/app.git", token) for token in GITHUB_TOKENS],
    ("github_token", f"export GITHUB_TOKEN={GITHUB_PAT}", GITHUB_PAT),
    ("gitlab_token", f'curl --header "PRIVATE-TOKEN: {GITLAB_TOKEN}" https://gitlab.com/api/v4/projects', GITLAB_TOKEN),
    ("slack_token", f"client = WebClient(token='{SLACK_BOT}')", SLACK_BOT),
    ("slack_token", f"SLACK_USER_TOKEN: {SLACK_USER}", SLACK_USER),
    ("slack_webhook", f'requests.post("{SLACK_HOOK}", json={{"text": "deployed"}})', SLACK_HOOK),
    ("stripe_key", f"stripe.api_key = '{STRIPE_SECRET}'", STRIPE_SECRET),
    ("stripe_key", f"Use {STRIPE_RESTRICTED} for the reporting job.", STRIPE_RESTRICTED),
    ("openai_key", f'client = OpenAI(api_key="{OPENAI_PROJECT}")', OPENAI_PROJECT),
    ("openai_key", f"my key is {OPENAI_LEGACY}, why does it fail?", OPENAI_LEGACY),
    ("anthropic_key", f"ANTHROPIC_API_KEY={ANTHROPIC} python agent.py", ANTHROPIC),
    ("huggingface_token", f"huggingface-cli login --token {HUGGINGFACE}", HUGGINGFACE),
    ("private_key", f"key = '''{RSA_KEY}'''\nsign(key)", PEM_BODY[:64]),
    ("private_key", f"cat ~/.ssh/id_ed25519\n{OPENSSH_KEY}\n", PEM_BODY[64:128]),
    ("private_key", json.dumps({"private_key": RSA_KEY}), PEM_BODY[128:192]),
    ("private_key", f"here is the key, truncated:\n{BEGIN}EC PRIVATE KEY-----\n{PEM_LINES[:300]}", PEM_BODY[:64]),
    ("bearer_token", f'curl -H "Authorization: Bearer {BEARER}" https://api.example.com/v1/me', BEARER),
    ("bearer_token", f"headers = {{'authorization': 'bearer {BEARER}'}}", BEARER),
    ("basic_auth", "Authorization: Basic " + base64.b64encode(b"admin:" + mixed(12).encode()).decode(), "YWRtaW46"),
    ("jwt", f"const session = '{JWT}';", JWT),
    ("url_password", "DATABASE_URL=postgres://app:" + "S3cr3t-pw" + "@db.internal:5432/app", "S3cr3t-pw"),
    ("url_password", "mongodb+srv://root:" + "hunter2hunter2" + "@cluster0.mongodb.net/test", "hunter2hunter2"),
    ("url_password", "redis://:" + "R3disPass!" + "@localhost:6379/0", "R3disPass!"),
    ("password", 'password = "' + "correct-horse-9" + '"', "correct-horse-9"),
    ("password", "db:\n  user: app\n  password: " + "s3cr3t-Pa55" + "\n", "s3cr3t-Pa55"),
    ("password", "DB_PASSWORD=" + "supersecretvalue" + "\nDB_HOST=localhost", "supersecretvalue"),
    ("password", 'if (pwd === "' + "letmein2024" + '") { grant(); }', "letmein2024"),
    ("password", 'PASSWORD: "' + "correct horse battery staple" + '"', "correct horse battery staple"),
    ("secret", "api_key: '" + "k3y-" + mixed(12) + "'", "k3y-"),
    ("secret", 'SECRET_KEY = "django-insecure-' + fake(string.ascii_lowercase + "#$%^&*(-_=+)", 50) + '"', "insecure"),
    ("secret", '{"client_secret": "' + "cs_" + mixed(20) + '"}', "cs_"),
    ("secret", "secret=" + "A1b2C3d4E5" + "&grant_type=client_credentials", "A1b2C3d4E5"),
    ("high_entropy", f'SIGNING_BLOB = "{HIGH_ENTROPY}"', HIGH_ENTROPY),
]


@pytest.mark.parametrize(("kind", "text", "secret"), SECRETS, ids=[f"{i}-{case[0]}" for i, case in enumerate(SECRETS)])
def test_every_kind_of_secret_is_replaced_by_its_placeholder(kind: str, text: str, secret: str) -> None:
    redacted, counts = redact_text(text)
    assert secret not in redacted
    assert placeholder(kind) in redacted
    assert counts.get(kind, 0) >= 1


def test_url_password_keeps_user_and_host() -> None:
    redacted, _ = redact_text("postgres://app:" + "S3cr3t-pw" + "@db.internal:5432/app")
    assert redacted == "postgres://app:[REDACTED:url_password]@db.internal:5432/app"


def test_only_the_secret_is_replaced() -> None:
    assert redact_text(f'Authorization: Bearer {BEARER}"')[0] == 'Authorization: Bearer [REDACTED:bearer_token]"'
    assert redact_text('password = "' + "correct-horse-9" + '"')[0] == 'password = "[REDACTED:password]"'
    assert redact_text(f"x {AWS_ID} y {AWS_ID}") == (
        "x [REDACTED:aws_access_key] y [REDACTED:aws_access_key]",
        {"aws_access_key": 2},
    )


def test_a_whole_file_of_secrets_is_redacted_at_once() -> None:
    text = "\n\n".join(case[1] for case in SECRETS)
    redacted, counts = redact_text(text)
    for _kind, _text, secret in SECRETS:
        assert secret not in redacted
    assert sum(counts.values()) >= len(SECRETS)


ORDINARY_CODE = [
    '''def calculate_total_price_with_discount(items: list[Item], discount_rate: float) -> Decimal:
    """Sum the items and apply the discount."""
    subtotal = sum(item.unit_price * item.quantity for item in items)
    return subtotal * (1 - Decimal(str(discount_rate)))
''',
    """class HTTP2ServerConnectionManagerFactory(AbstractSingletonProxyFactoryBean2Impl):
    def test_transformer_encoder_layer_with_rope_2048(self) -> None: ...
    TestTransformerEncoderLayerWithRoPE2048 = None
""",
    """def check_password(self, password: str) -> bool:
    password_hash = self.password_hash
    token = request.headers.get("Authorization")
    api_key = os.environ["OPENAI_API_KEY"]
    SECRET_KEY = os.getenv("SECRET_KEY")
    password = getpass.getpass()
    new_password = form.password.data
    password = None
    secret = ""
    token: str | None = None
    return bcrypt.checkpw(password.encode(), password_hash)
""",
    """tokenizer = AutoTokenizer.from_pretrained("meta-llama/Llama-3.1-8B-Instruct")
model = AutoModelForCausalLM.from_pretrained("mistralai/Mixtral-8x7B-Instruct-v0.1")
outputs = model.generate(**inputs, max_tokens=1024, max_new_tokens=256, num_tokens=32768)
""",
    """commit e83c5163316f89bfbde7d9ab23ca2e25604af290
Author: Jane Doe <jane@example.com>
    sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    md5: 098f6bcd4621d373cade4e832627b4f6
    sha512: ee26b0dd4af7e749aa1a8ee3c10ae9923f618980772e473f8819a5d4940e0db2
            7ac185f8a0e1d5f84f88bc887fd67b143732c304cc5fa9ad8e6f57f50028a8ff
    image: nginx@sha256:0d17b565c37bcbd895e9d92315a05c1c3c9a29f762b011a10c54a66cd53c9b31
""",
    """request_id = "123e4567-e89b-12d3-a456-426614174000"
trace = {"span_id": "00f067aa0ba902b7", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
user = User(id=UUID("f47ac10b-58cc-4372-a567-0e02b2c3d479"))
""",
    """PIXEL = "data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"
ICON = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
HELLO = base64.b64decode("SGVsbG8sIHdvcmxkIQ==")
"integrity": "sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUR75A=="
""",
    """See https://github.com/acme/app/blob/e83c5163316f89bfbde7d9ab23ca2e25604af290/src/app/main.py#L10
and https://docs.python.org/3/library/re.html?highlight=search#re.search
git remote add origin git@github.com:acme/app.git
ssh://git@github.com:22/acme/app.git  http://localhost:8080/api/v1/users/12345/profile
mailto:jane.doe@example.com  https://user@example.com/path  redis://localhost:6379/0
""",
    """version = "1.2.3-rc.1+build.4567"
"dependencies": {"react": "^18.2.0", "typescript": "~5.4.5", "@types/node": ">=20.11.30 <21"}
python_requires = ">=3.11,<3.14"
FROM python:3.11.7-slim-bookworm
""",
    """const calculateTotalPriceWithDiscount = (items, rate) => items.reduce((s, i) => s + i.price, 0) * (1 - rate);
async function fetchUserProfile(token) {
  const res = await fetch(`${API_BASE_URL}/users/me`, { headers: { Authorization: `Bearer ${token}` } });
  if (!token) throw new Error("missing token");
  const password = req.body.password;
  return res.json();
}
<input type="password" name="password" placeholder="Enter your password" autocomplete="current-password">
<div class="sk-loading-spinner-container-wrapper"></div>
""",
    """func (s *Server) HandleUserAuthenticationRequest(w http.ResponseWriter, r *http.Request) {
	token := r.Header.Get("Authorization")
	if token == "" {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}
}
""",
    """apiVersion: v1
kind: Pod
spec:
  containers:
    - name: app
      env:
        - name: DB_PASSWORD
          valueFrom:
            secretKeyRef: {name: db-credentials, key: password}
        - name: API_TOKEN
          value: ${API_TOKEN}
      password: "{{ .Values.db.password }}"
""",
    """# .env.example
OPENAI_API_KEY=your-api-key-here
DB_PASSWORD=<your-db-password>
api_key = "YOUR_API_KEY"
password = "********"
{"password": "Password", "password_confirm": "Confirm password"}
Reset your password in the settings; tokens expire after 24 hours. The API key: see the docs.
The bearer of bad news had basic internationalization support.
""",
    """class Tokenizer:
    def __init__(self, mask_token: str = "[MASK]", pad_token="<pad>", eos_token="</s>", image_token="<|image|>"):
        if token == "struct" or token == "typedef":
            return
        while next_page_token := response.next_page_token:
            yield next_page_token
CREDENTIALS = "credentials"
PASSWORD = "password"
_PKCS1_MARKER = ("-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----")
upgrade_token = "%s_upgrades" % name
bos_token, n_token, api_key = "__start__", "vocab_size", "no-token"
elif token == "#bygroup":
host, port, access_key, secret_key = s3_connection
example = {"api_key": "sk-...xyz1234"}
ACL_CREDENTIALS = "Access-Control-Allow-Credentials"
engine = create_engine("postgresql://user:password@localhost/test")
""",
    """/usr/local/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py
src/components/UserProfileSettingsPanel2.tsx  node_modules/@types/react-dom/index.d.ts
x86_64-unknown-linux-gnu-gcc-12-build  i18n_translations_en_US_2023_06_01_backup
  File "/app/server.py", line 42, in handle_request  at 0x7f3a2b1c4d5e
""",
]
PUBLIC_CERTIFICATE = f"{BEGIN}CERTIFICATE-----\n{PEM_LINES}\n{END}CERTIFICATE-----\n"
SSH_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA" + mixed(43, ALNUM + "+/") + " jane@laptop\n"


@pytest.mark.parametrize("text", [*ORDINARY_CODE, PUBLIC_CERTIFICATE, SSH_PUBLIC_KEY])
def test_ordinary_code_passes_through_unchanged(text: str) -> None:
    assert redact_text(text) == (text, {})


def test_zero_false_positives_on_the_ordinary_corpus() -> None:
    corpus = "\n".join([*ORDINARY_CODE, PUBLIC_CERTIFICATE, SSH_PUBLIC_KEY])
    assert redact_text(corpus) == (corpus, {})


@pytest.mark.parametrize(("alphabet", "allowed_misses"), [(ALNUM, 1), (ALNUM + "-_", 8), (ALNUM + "+/", 4)])
def test_random_key_material_is_caught_by_the_entropy_rule(alphabet: str, allowed_misses: int) -> None:
    # A backstop, not a guarantee: measured misses for random 48-character tokens are about 0.1%
    # (alphanumeric), 3% (base64url: "-" and "_" can cut it into name-sized pieces) and 1% (base64).
    rng = random.Random(5)
    tokens = ["".join(rng.choice(alphabet) for _ in range(48)) for _ in range(200)]
    missed = [token for token in tokens if token in redact_text(f"blob = {token}\n")[0]]
    assert len(missed) <= allowed_misses, missed


def _generation_with_secrets() -> dict[str, Any]:
    data = sample_event("generation")
    payload = data["payload"]
    payload["prompt"] = f"my key is {AWS_ID}\n"
    payload["completion"] = f"export GITHUB_TOKEN={GITHUB_PAT}\n"
    command = "psql postgres://app:" + "S3cr3t-pw" + "@db.internal:5432/app"
    payload["tool_calls"] = [{"name": "shell", "arguments": json.dumps({"cmd": command}), "valid": True}]
    payload["trajectory"][2]["text"] = f"read file:\n{RSA_KEY}\n"
    return data


def test_redact_event_scrubs_prompt_completion_tool_calls_and_trajectory() -> None:
    event = parse_event(_generation_with_secrets())
    redacted, counts = redact_event(event)
    assert isinstance(redacted, GenerationEvent)
    payload = redacted.payload
    assert payload.prompt == "my key is [REDACTED:aws_access_key]\n"
    assert payload.completion == "export GITHUB_TOKEN=[REDACTED:github_token]\n"
    assert "[REDACTED:url_password]" in payload.tool_calls[0].arguments
    assert payload.trajectory is not None
    assert payload.trajectory[2].text == "read file:\n[REDACTED:private_key]\n"
    assert counts == {"aws_access_key": 1, "github_token": 1, "url_password": 1, "private_key": 1}
    assert redacted.event_id == event.event_id
    assert isinstance(event, GenerationEvent)
    assert event.payload.trajectory is not None
    assert payload.trajectory[1] is event.payload.trajectory[1]  # untouched parts are shared, not copied
    assert parse_event(event_to_json(redacted)) == redacted


def test_redact_event_scrubs_feedback_text() -> None:
    data = sample_event("tool.result")
    data["payload"]["error"] = f"auth failed for {GITLAB_TOKEN}"
    redacted, counts = redact_event(parse_event(data))
    assert redacted.payload.error == "auth failed for [REDACTED:gitlab_token]"  # type: ignore[union-attr]
    assert counts == {"gitlab_token": 1}


def test_redact_event_returns_the_same_event_when_clean() -> None:
    event = parse_event(sample_event("generation"))
    assert redact_event(event) == (event, {})
    assert redact_event(event)[0] is event


def test_redact_event_keeps_fields_within_their_limits() -> None:
    data = sample_event("generation")
    tail = 'password = "' + "hunter22x" + '"'
    data["payload"]["prompt"] = "x" * (MAX_TEXT_CHARS - len(tail)) + tail
    redacted, counts = redact_event(parse_event(data))
    assert counts == {"password": 1}
    assert len(redacted.payload.prompt) == MAX_TEXT_CHARS  # type: ignore[union-attr]
    assert "hunter22x" not in redacted.payload.prompt  # type: ignore[union-attr]
    assert parse_event(event_to_json(redacted)) == redacted


@settings(max_examples=150, deadline=None, database=None)
@given(
    st.lists(
        st.text(max_size=30) | st.sampled_from([case[1] for case in SECRETS] + ORDINARY_CODE),
        max_size=4,
    ).map("".join)
)
def test_redaction_is_idempotent(text: str) -> None:
    once, _ = redact_text(text)
    assert redact_text(once) == (once, {})
