"""A real Apache Kafka cluster in KRaft mode (1 to 3 combined broker+controller nodes)."""

from __future__ import annotations

import base64
import logging
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pidfence.jars import classpath, java
from pidfence.services.class_archive import archive_options
from pidfence.services.node import Cluster
from pidfence.services.ports import free_port
from pidfence.services.process import ServiceFailed, jvm_options, wait_until

log = logging.getLogger(__name__)

_LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{HH:mm:ss.SSS} %-5p %c{1} - %m%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class KafkaCluster(Cluster):
    """``size`` Kafka nodes (each broker and KRaft controller), each a JVM process we started.

    Args:
        size: 1 to 3 nodes; internal topics use replication ``min(3, size)``.
        run_dir: data, configs and logs (a temporary folder by default, removed on stop).
        heap: JVM heap per node.
    """

    kind = "kafka"

    def __init__(self, size: int = 1, run_dir: Path | None = None, heap: str = "512m") -> None:
        super().__init__(size, run_dir, "pidfence-kafka-")
        self.heap = heap
        self.ports = [free_port() for _ in range(size)]
        self.controller_ports = [free_port() for _ in range(size)]
        self.cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _configure(self, i: int) -> Path:
        node_dir = self.run_dir / f"kafka{i}"
        (node_dir / "data").mkdir(parents=True, exist_ok=True)
        rf = min(3, self.size)
        voters = ",".join(
            f"{j + 1}@127.0.0.1:{port}" for j, port in enumerate(self.controller_ports)
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": str(i + 1),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.ports[i]},"
            f"CONTROLLER://127.0.0.1:{self.controller_ports[i]}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.ports[i]}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node_dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": str(rf),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(rf),
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.segment.bytes": str(64 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
            # No no-op records from the controller (KIP-835's liveness metric, one every 500 ms
            # by default): 40% of an idle local node's CPU, and nothing here reads the metric.
            "metadata.max.idle.interval.ms": "0",
        }
        cfg = node_dir / "server.properties"
        cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (node_dir / "log4j2.properties").write_text(_LOG4J2)
        return cfg

    def _jvm(self, node_dir: Path) -> list[str]:
        jars = classpath("kafka")
        return [
            java(),
            f"-Xmx{self.heap}",
            "-Xms128m",
            *jvm_options(("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")),
            *archive_options("kafka", jars),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={node_dir / 'log4j2.properties'}",
            "-cp",
            jars,
        ]

    def _node(self, i: int) -> tuple[list[str], Path, int, str]:
        """Format node ``i``'s storage; its broker command line."""
        cfg = self._configure(i)
        fmt = subprocess.run(
            [
                *self._jvm(cfg.parent),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={self.cluster_id}",
                "-c",
                str(cfg),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if fmt.returncode != 0:
            raise ServiceFailed(f"kafka storage format failed: {fmt.stdout}{fmt.stderr}")
        cmd = [*self._jvm(cfg.parent), "kafka.Kafka", str(cfg)]
        return cmd, cfg.parent, self.ports[i], f"Kafka node {i} (127.0.0.1:{self.ports[i]})"

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every running node answers metadata itself and is in the cluster view."""
        self.wait_all_ready(timeout)

    def _node_ready(self, i: int) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {
                "bootstrap.servers": f"127.0.0.1:{self.ports[i]}",
                "socket.timeout.ms": 3000,
                "log_level": 0,
            }
        )
        meta = admin.list_topics(timeout=3)
        return bool(meta.orig_broker_id == i + 1 and (i + 1) in meta.brokers)

    def broker_ids(self) -> set[int]:
        """Broker ids the cluster metadata shows right now."""
        from confluent_kafka.admin import AdminClient

        # log_level 0: a probe of a broker that is still starting is expected to fail quietly.
        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 3000, "log_level": 0}
        )
        meta = admin.list_topics(timeout=3)
        return set(meta.brokers)

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication: int = 1,
        config: dict[str, str] | None = None,
    ) -> str:
        """Create a topic and wait until its leaders are known."""
        return create_topic(self.bootstrap, name, partitions, replication, config)

    def stop(self) -> None:
        """Stop every node and remove the run folder if we made it."""
        # All at once: a KRaft node stopped last, after its peers, waits for a quorum that is gone.
        for node in self.nodes:
            node.terminate()
        for node in self.nodes:
            node.stop(timeout=20)
        self._remove_run_dir()


def delete_topics(bootstrap: str, names: Sequence[str], timeout: float = 30.0) -> None:
    """Delete ``names`` from any cluster, as far as it lets (a clean-up: errors are logged)."""
    from confluent_kafka.admin import AdminClient

    futures = AdminClient({"bootstrap.servers": bootstrap}).delete_topics(list(names))
    for name, future in futures.items():
        try:
            future.result(timeout)
        except Exception as exc:  # noqa: BLE001 - best effort: a topic left is not a failure
            log.warning("topic %s was not deleted: %s", name, exc)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    replication: int = 1,
    config: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> str:
    """Create ``name`` on any cluster and wait until every partition has a leader."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication, config=config or {})], operation_timeout=30
    )
    futures[name].result(timeout)

    def ready() -> bool:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        return (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        )

    wait_until(ready, timeout, f"topic {name}")
    return name
