"""A local Apache Kafka 4.x cluster in KRaft mode (one broker, or several), assembled from Maven Central.

The jars are resolved once by Maven (``infra/pom.xml``) into ``<cache_dir>/kafka-<version>/libs``,
outside the work tree, and reused by every later start. Each broker's log directory lives under the
state folder and is formatted once, so topics and their data survive restarts.

One broker (the default) is formatted as a standalone controller. Several (``kafka_brokers``) are
each broker and controller, with a static quorum of all of them: three survive the loss of any one,
and the internal topics (consumer offsets, transactions) get three replicas and a minimum of two in
sync, like the loop's own topics (``TopicsSettings.replication``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra.errors import PrerequisiteMissing, ServiceStartError
from infra.probes import port_open, require_program
from infra.processes import ManagedProcess
from infra.settings import StackSettings, TopicsSettings

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
    """Start, stop and probe one local broker (node ``node``, from 1) of the cluster ``StackSettings`` describes.

    Node 1 keeps the names a single broker always had (``<state>/kafka``, process ``kafka``), so a
    single-broker stack's data is found where it was; node n > 1 is ``kafka-n``."""

    def __init__(self, settings: StackSettings, node: int = 1) -> None:
        self.settings = settings
        self.node = node
        self.name = "kafka" if node == 1 else f"kafka-{node}"
        self.home = settings.state_dir / self.name
        self.data_dir = self.home / "data"
        self.config_path = self.home / "server.properties"
        self.process = ManagedProcess(self.name, settings.run_dir, settings.logs_dir)
        self.port, self.controller_port = settings.kafka_node_ports(node)

    @property
    def jars_dir(self) -> Path:
        return self.settings.cache_dir / f"kafka-{self.settings.kafka_version}" / "libs"

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

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

    def _quorum(self) -> dict[str, str]:
        s = self.settings
        if s.kafka_brokers == 1:
            # Formatted --standalone: a dynamic quorum of this one controller, found through its own port.
            return {"controller.quorum.bootstrap.servers": f"{s.host}:{self.controller_port}"}
        # Several: a static quorum of every node (formatted without --standalone), the same on each.
        voters = ",".join(f"{node}@{s.host}:{s.kafka_node_ports(node)[1]}" for node in range(1, s.kafka_brokers + 1))
        return {"controller.quorum.voters": voters}

    def _write_config(self) -> None:
        s = self.settings
        host = s.host
        # The internal topics' replication follows the loop's topics' defaults for this many brokers.
        replication = TopicsSettings().replication(s.kafka_brokers)
        factor, isr = str(replication.factor), str(replication.min_insync)
        listeners = f"PLAINTEXT://{host}:{self.port},CONTROLLER://{host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node),
            **self._quorum(),
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir.resolve()),
            "num.partitions": "3",
            # Topics created without these (Faust's changelogs, when it is not told) get the cluster's replication.
            "default.replication.factor": factor,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": factor,
            "transaction.state.log.replication.factor": factor,
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": factor,
            "share.coordinator.state.topic.min.isr": isr,
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
        standalone = ["--standalone"] if self.settings.kafka_brokers == 1 else []
        cmd = [java, "-cp", self._classpath(), "kafka.tools.StorageTool", "format", *standalone,
               "-t", cluster_id(self.settings), "-c", str(self.config_path)]  # fmt: skip
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


def recorded_brokers(state_dir: Path) -> int | None:
    """How many brokers the local cluster of ``state_dir`` was formatted with, if it was."""
    try:
        return int((state_dir / "kafka" / "brokers").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cluster_id(settings: StackSettings) -> str:
    """The KRaft cluster id every node of the local cluster is formatted with, made once and kept.

    Refuses a state folder formatted for another number of brokers: a quorum cannot grow or shrink by
    changing a setting (its voters are in every node's log)."""
    home = settings.state_dir / "kafka"
    home.mkdir(parents=True, exist_ok=True)
    id_path, brokers_path = home / "cluster-id", home / "brokers"
    if (home / "data" / "meta.properties").exists() and not brokers_path.exists():
        brokers_path.write_text("1", encoding="utf-8")  # formatted before the count was recorded: one broker
    recorded = recorded_brokers(settings.state_dir)
    if recorded is not None and recorded != settings.kafka_brokers:
        raise ServiceStartError(
            f"the Kafka data in {settings.state_dir} is a cluster of {recorded} broker(s), not "
            f"{settings.kafka_brokers}; use another state folder or `liveloop down --purge` first"
        )
    brokers_path.write_text(str(settings.kafka_brokers), encoding="utf-8")
    if not id_path.exists():
        id_path.write_text(uuid.uuid4().hex[:22], encoding="utf-8")
    return id_path.read_text(encoding="utf-8").strip()


class KafkaCluster:
    """The local brokers ``StackSettings`` describes (``kafka_brokers`` of them), started and probed together."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.brokers = [KafkaBroker(settings, node) for node in range(1, settings.kafka_brokers + 1)]

    @property
    def jars_dir(self) -> Path:
        """Where the brokers' jars are (one copy, shared by all)."""
        return self.brokers[0].jars_dir

    @property
    def names(self) -> list[str]:
        """The process names of the brokers (``kafka``, ``kafka-2``, ...)."""
        return [broker.name for broker in self.brokers]

    def check_java(self) -> str:
        """The java binary (17+) every broker runs on."""
        return self.brokers[0].check_java()

    def ensure_jars(self) -> Path:
        """Resolve the jars once for every broker."""
        return self.brokers[0].ensure_jars()

    def start(self) -> None:
        """Start every broker that does not run (returns before they are ready; see ``healthy``)."""
        if all(broker.process.pid() is not None for broker in self.brokers):
            return
        cluster_id(self.settings)  # refuse a state folder of another size before any broker starts
        for broker in self.brokers:
            broker.start()

    def stop(self) -> bool:
        """Stop every broker (each a controlled shutdown); True if any was running.

        All at once: one by one, the last ones would wait out their shutdown timeout for a quorum that the
        first ones took with them."""
        with ThreadPoolExecutor(max_workers=len(self.brokers)) as pool:
            return any(list(pool.map(KafkaBroker.stop, self.brokers)))

    def healthy(self) -> bool:
        """True when every broker answers and the cluster's metadata lists all of them."""
        return all(broker.healthy() for broker in self.brokers) and (
            self.settings.kafka_brokers == 1 or brokers_registered(self.settings.kafka_address) >= len(self.brokers)
        )


def brokers_registered(bootstrap: str) -> int:
    """How many brokers the cluster at ``bootstrap`` reports (0 if none answers)."""
    if not _any_port_open(bootstrap.split(",")):
        return 0
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, client_id="liveloop-health")
    except (KafkaError, OSError, ValueError):
        return 0
    try:
        return len(admin.describe_cluster()["brokers"])
    except (KafkaError, OSError):
        return 0
    finally:
        admin.close()


def under_replicated(bootstrap: str, topics: Sequence[str]) -> int:
    """Partitions of ``topics`` with fewer replicas in sync than assigned; -1 when the cluster does not answer
    (a broker that just came back is catching up: ask again)."""
    if not _any_port_open(bootstrap.split(",")):
        return -1
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, client_id="liveloop-isr")
    except (KafkaError, OSError, ValueError):
        return -1
    try:
        described = admin.describe_topics(list(topics))
        return sum(len(p["isr_nodes"]) < len(p["replica_nodes"]) for t in described for p in t["partitions"])
    except (KafkaError, OSError, KeyError):
        return -1
    finally:
        admin.close()


def _any_port_open(addresses: Sequence[str]) -> bool:
    for address in addresses:
        host, _, port = address.rpartition(":")
        if port_open(host.strip("[]"), int(port)):
            return True
    return False


def kafka_answers(bootstrap: str) -> bool:
    """True when a broker at ``bootstrap`` (any of its addresses) answers a metadata request within a couple of
    seconds."""
    # Probe the ports first: a client built against closed ports only retries, and leaks its socket.
    if not _any_port_open(bootstrap.split(",")):
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
