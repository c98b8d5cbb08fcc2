"""A private PostgreSQL cluster for the audit store and MLflow's backend store.

``initdb`` and ``postgres`` refuse to run as root, and CI runs as root: then the cluster is owned by
an unprivileged OS user (``postgres`` by default) and every server command runs as that user. The
cluster listens on TCP only (host from settings) and requires a password (scram-sha-256).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
from functools import cached_property
from pathlib import Path

from infra.credentials import DevCredentials
from infra.errors import PrerequisiteMissing, ServiceStartError
from infra.probes import require_program
from infra.settings import StackSettings

DATABASES = ("liveloop", "mlflow")


def find_pg_bin(configured: Path | None) -> Path:
    """The directory of the PostgreSQL server binaries (initdb, pg_ctl, postgres)."""
    candidates: list[Path] = []
    if configured is not None:
        candidates.append(configured)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    which = shutil.which("pg_ctl")
    if which:
        candidates.append(Path(which).resolve().parent)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise PrerequisiteMissing(
        "PostgreSQL server binaries (initdb, pg_ctl) not found; install them with `apt-get install postgresql`"
        " or set LIVELOOP_INFRA_POSTGRES_BIN_DIR"
    )


class LocalPostgres:
    """Create, start, stop and probe the local cluster."""

    os_user = "postgres"

    def __init__(self, settings: StackSettings, credentials: DevCredentials) -> None:
        self.settings = settings
        self.credentials = credentials
        self.as_root = os.geteuid() == 0

    @cached_property
    def root_dir(self) -> Path:
        """The cluster's folder (its data and its log); found on first use, as that may probe the OS user."""
        return self._cluster_root()

    @property
    def data_dir(self) -> Path:
        return self.root_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.root_dir / "postgres.log"

    def _cluster_root(self) -> Path:
        """Where the cluster lives: under the state folder, unless the server's OS user cannot reach it."""
        preferred = (self.settings.state_dir / "postgres").resolve()
        if not self.as_root or self._reachable_by_os_user(preferred.parent):
            return preferred
        # E.g. a checkout under /root (mode 0700): keep the cluster where its owner can reach it, named
        # after the state folder and its credentials, so that neither two checkouts nor a state folder
        # made anew (new password) ever meet an old cluster. `liveloop down --purge` removes it.
        identity = f"{preferred}\0{self.credentials.postgres_password.get_secret_value()}"
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        return Path("/var/tmp") / f"liveloop-postgres-{digest}"  # noqa: S108 (owned by the server user, 0700)

    def _reachable_by_os_user(self, directory: Path) -> bool:
        directory.mkdir(parents=True, exist_ok=True)
        runuser = require_program("runuser", "util-linux", "PostgreSQL must run as an unprivileged user")
        probe = subprocess.run([runuser, "-u", self.os_user, "--", "test", "-x", str(directory)], check=False)
        return probe.returncode == 0

    def _run(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if self.as_root:
            try:
                pwd.getpwnam(self.os_user)
            except KeyError as exc:
                raise PrerequisiteMissing(
                    f"PostgreSQL cannot run as root and there is no '{self.os_user}' user; "
                    "install `postgresql` (it creates one) or run liveloop as an unprivileged user"
                ) from exc
            runuser = require_program("runuser", "util-linux", "PostgreSQL must run as an unprivileged user")
            argv = [runuser, "-u", self.os_user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]

    def _chown(self, path: Path) -> None:
        if self.as_root:
            shutil.chown(path, user=self.os_user, group=None)

    @property
    def port(self) -> int:
        return self.settings.postgres_port

    def dsn(self, database: str = "liveloop") -> str:
        """A libpq connection string (contains the password: never log it)."""
        c = self.credentials
        return (
            f"postgresql://{c.postgres_user}:{c.postgres_password.get_secret_value()}"
            f"@{self.settings.host}:{self.port}/{database}"
        )

    def ensure_cluster(self) -> None:
        """Run initdb once, with password authentication and our listen address and port."""
        if (self.data_dir / "PG_VERSION").exists():
            return
        pg_bin = find_pg_bin(self.settings.postgres_bin_dir)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self._chown(self.root_dir)
        with tempfile.NamedTemporaryFile("w", dir=self.root_dir, delete=False) as pwfile:
            pwfile.write(self.credentials.postgres_password.get_secret_value() + "\n")
        pw_path = Path(pwfile.name)
        try:
            os.chmod(pw_path, 0o600)
            self._chown(pw_path)
            result = self._run([
                str(pg_bin / "initdb"), "-D", str(self.data_dir), "-U", self.credentials.postgres_user,
                f"--pwfile={pw_path}", "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
            ])  # fmt: skip
        finally:
            pw_path.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServiceStartError(f"initdb failed: {result.stdout[-1500:]}{result.stderr[-1500:]}")

    def _write_config(self) -> None:
        conf = self.data_dir / "liveloop.conf"
        conf.write_text(
            f"listen_addresses = '{self.settings.host}'\n"
            f"port = {self.port}\n"
            # The socket lives in the cluster's own folder: /var/run/postgresql may not be writable.
            f"unix_socket_directories = '{self.data_dir}'\n"
            "max_connections = 200\n"
            "shared_buffers = 128MB\n",
            encoding="utf-8",
        )
        self._chown(conf)
        main = self.data_dir / "postgresql.conf"
        text = main.read_text(encoding="utf-8")
        if "include_if_exists = 'liveloop.conf'" not in text:
            main.write_text(text + "\ninclude_if_exists = 'liveloop.conf'\n", encoding="utf-8")

    def start(self) -> None:
        """Start the server (pg_ctl waits until it accepts connections) and create our databases."""
        self.ensure_cluster()
        self._write_config()
        if not self.running():
            pg_bin = find_pg_bin(self.settings.postgres_bin_dir)
            timeout = str(int(self.settings.startup_timeout_s))
            result = self._run(
                [
                    str(pg_bin / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_path),
                    "-w",
                    "-t",
                    timeout,
                    "start",
                ]
            )
            if result.returncode != 0:
                raise ServiceStartError(f"PostgreSQL did not start; see {self.log_path}: {result.stderr[-1500:]}")
        self.ensure_databases()

    def running(self) -> bool:
        """True while the postmaster of this cluster is alive."""
        if not self.data_dir.exists():
            return False
        pg_bin = find_pg_bin(self.settings.postgres_bin_dir)
        return self._run([str(pg_bin / "pg_ctl"), "-D", str(self.data_dir), "status"]).returncode == 0

    def stop(self) -> bool:
        """Fast shutdown (rolls back open transactions, flushes everything committed)."""
        if not self.running():
            return False
        pg_bin = find_pg_bin(self.settings.postgres_bin_dir)
        self._run([str(pg_bin / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"])
        return True

    def remove(self) -> None:
        """Delete the cluster's files (stop it first)."""
        shutil.rmtree(self.root_dir, ignore_errors=True)

    def ensure_databases(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn("postgres"), autocommit=True, connect_timeout=5) as conn:
            existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
            for name in DATABASES:
                if name not in existing:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def healthy(self) -> bool:
        return postgres_answers(self.dsn())


def postgres_answers(dsn: str) -> bool:
    """True when the server at ``dsn`` runs a query."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False
