"""A single-node Apache Kafka 4.x broker in KRaft mode, assembled from Maven Central.

The jars are resolved once by Maven (``infra/pom.xml``) into ``<cache_dir>/kafka-<version>/libs``,
outside the work tree, and reused by every later start. The log directory lives under the state
folder and is formatted once, so topics and their data survive restarts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from infra.errors import PrerequisiteMissing, ServiceStartError
from infra.probes import port_open, require_program
from infra.processes import ManagedProcess
from infra.settings import StackSettings

POM_PATH = Path(__file__).with_name("pom.xml")

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""


class KafkaBroker:
    """Start, stop and probe the local broker described by ``StackSettings``."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.home = settings.state_dir / "kafka"
        self.data_dir = self.home / "data"
        self.config_path = self.home / "server.properties"
        self.process = ManagedProcess("kafka", settings.run_dir, settings.logs_dir)

    @property
    def jars_dir(self) -> Path:
        return self.settings.cache_dir / f"kafka-{self.settings.kafka_version}" / "libs"

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.settings.kafka_port}"

    def ensure_jars(self) -> Path:
        """Resolve the broker's jars from Maven Central unless they are cached already."""
        done = self.jars_dir.parent / ".complete"
        if done.exists():
            return self.jars_dir
        mvn = require_program("mvn", "maven", "Maven fetches the Kafka broker from Maven Central")
        staging = self.jars_dir.parent / f".staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn, "-q", "-B", "-f", str(POM_PATH), "dependency:copy-dependencies",
            f"-Dkafka.version={self.settings.kafka_version}", "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-3000:]
            raise ServiceStartError(f"Maven could not resolve Kafka {self.settings.kafka_version}: {output}")
        shutil.rmtree(self.jars_dir, ignore_errors=True)
        staging.replace(self.jars_dir)
        done.touch()
        return self.jars_dir

    def check_java(self) -> str:
        """The java binary, if it is version 17 or newer (Kafka 4.x needs it)."""
        java = require_program("java", "openjdk-17-jre-headless", "the Kafka broker runs on Java 17+")
        out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
        # `openjdk version "17.0.15"` or `"1.8.0_392"`: the major version is the first number (or the second after 1.)
        try:
            quoted = out.split('"')[1]
            parts = quoted.split(".")
            major = int(parts[1] if parts[0] == "1" else parts[0].split("-")[0])
        except (IndexError, ValueError):
            major = 0
        if major < 17:
            raise PrerequisiteMissing(
                f"Kafka 4.x needs Java 17+, found {out.splitlines()[0] if out else 'unknown'}; "
                "install it with `apt-get install openjdk-17-jre-headless`"
            )
        return java

    def _write_config(self) -> None:
        s = self.settings
        host = s.host
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{host}:{s.kafka_controller_port}",
            "listeners": f"PLAINTEXT://{host}:{s.kafka_port},CONTROLLER://{host}:{s.kafka_controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{s.kafka_port},CONTROLLER://{host}:{s.kafka_controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir.resolve()),
            "num.partitions": "3",
            # A single node: every internal topic has one replica.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Topics are provisioned explicitly with their settings; a typo must not create one.
            "auto.create.topics.enable": "false",
            # One broker, no reason to wait for more group members before the first rebalance.
            "group.initial.rebalance.delay.ms": "0",
            # A partition's offset and time indexes are sparse files preallocated to this size and mapped into
            # memory. The first entry written faults a page in, and the kernel reads ahead around it (8 MiB
            # on these machines' disks), zeroing every hole it reads: at Kafka's 10 MiB default, about 40 ms
            # of broker CPU per file, so up to a second in a test or benchmark that makes a few dozen fresh
            # partitions (measured with perf on the distiller benchmark). At 1 MiB a segment still indexes
            # over 300 MiB of log before it rolls.
            "log.index.size.max.bytes": str(1 << 20),
        }
        self.home.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
        (self.home / "log4j2.properties").write_text(_LOG4J2.format(level="INFO"), encoding="utf-8")

    def _classpath(self) -> str:
        return str(self.jars_dir.resolve() / "*")

    def ensure_formatted(self, java: str) -> None:
        """Format the KRaft log directory once; later starts reuse it and keep every topic."""
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = uuid.uuid4().hex[:22]
        cmd = [java, "-cp", self._classpath(), "kafka.tools.StorageTool", "format", "--standalone",
               "-t", cluster_id, "-c", str(self.config_path)]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ServiceStartError(f"formatting Kafka storage failed: {result.stdout[-1500:]}{result.stderr[-1500:]}")

    def start(self) -> None:
        """Start the broker unless it runs (returns before it is ready; see ``healthy``)."""
        if self.process.pid() is not None:
            return
        java = self.check_java()
        self.ensure_jars()
        self._write_config()
        self.ensure_formatted(java)
        heap = self.settings.kafka_heap_opts.split()
        log4j = (self.home / "log4j2.properties").resolve()
        argv = [java, *heap, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={log4j}", "-cp", self._classpath(),
                "kafka.Kafka", str(self.config_path.resolve())]  # fmt: skip
        self.process.start(argv)

    def stop(self) -> bool:
        """Stop the broker cleanly (a controlled shutdown flushes its logs)."""
        return self.process.stop(timeout_s=60)

    def healthy(self) -> bool:
        """True when the broker answers a metadata request."""
        return kafka_answers(self.address)


def kafka_answers(bootstrap: str) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request within a couple of seconds."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    # Probe the port first: a client built against a closed port only retries, and leaks its socket.
    if not port_open(host, int(port)):
        return False
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, client_id="liveloop-health")
    except (KafkaError, OSError, ValueError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()
