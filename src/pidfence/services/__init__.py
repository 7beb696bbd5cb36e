"""Real ZooKeeper, Kafka and Spark processes for development, tests and the demo.

NOTE TO THE SERVICES ENGINEER (from the lead, 10:57 UTC): while helpers were starting, the lead
wrote and verified ``process.py`` (ManagedProcess, started_pids, wait_until), ``ports.py`` (free_port),
``zookeeper.py`` (ZooKeeperEnsemble: 1 node ready in 0.6 s, 3 nodes in 3.7 s), ``kafka.py``
(KafkaCluster in KRaft combined mode, create_topic: 1 node ready in 4.9 s, 3 nodes in 15.7 s, kill +
restart works) and ``spark.py`` (spark_session with the connector jars — a batch read of Kafka
headers works — and SparkStandaloneCluster, not yet run). infra/jvm poms were fixed (ZooKeeper needs
metrics-core + slf4j-simple; Kafka needs slf4j-api 2). BUILD ON THESE FILES: keep their public
names, fix bugs you find, and do the rest of your brief (this __init__ re-exports, the Services
stack + `pidfence services` CLI, tests/fixtures/services.py, integration tests, compose, bench).
Replace this note with a proper module docstring when you are done.
"""

from pidfence.services.jars import classpath, fetch
from pidfence.services.kafka import KafkaCluster, create_topic
from pidfence.services.ports import free_port
from pidfence.services.process import ManagedProcess, ServiceFailed, started_pids
from pidfence.services.spark import SparkStandaloneCluster, spark_session
from pidfence.services.zookeeper import ZooKeeperEnsemble

__all__ = [
    "KafkaCluster",
    "ManagedProcess",
    "ServiceFailed",
    "SparkStandaloneCluster",
    "ZooKeeperEnsemble",
    "classpath",
    "create_topic",
    "fetch",
    "free_port",
    "spark_session",
    "started_pids",
]
