"""Real ZooKeeper, Kafka and Spark processes for development, tests and the demo.

Library code never imports this package; tests, the demo and ``pidfence services`` do.

* :class:`ZooKeeperEnsemble` and :class:`KafkaCluster` (KRaft, combined broker and controller)
  start 1 to 3 JVM nodes (their jars fetched from Maven Central on first use: :mod:`pidfence.jars`)
  on free 127.0.0.1 ports, and return once real round trips succeed. Each node is a
  :class:`ServerNode` with the fault hooks (``kill``/``restart``/``pause``/``resume``/``log_tail``);
  a cluster indexes its nodes (``cluster[1].kill()``) and keeps ``cluster.kill(1)`` as a shorthand.
* :class:`Services` combines both for ``pidfence services up``: it records pids (with their start
  times), ports and connect strings in ``<run dir>/state.json`` so that :func:`status` and
  :func:`down` work from another process; ``down`` signals recorded pids only.
* :func:`spark_session` builds a SparkSession with the Kafka connector matched to pyspark (from
  the jar cache, fetched on first use); :class:`SparkStandaloneCluster` runs a master and workers
  from pyspark's own distribution.
* Every process started here is a :class:`ManagedProcess`; :func:`started_pids` lists those still
  alive, which the test suite checks is empty at the end.
"""

from pidfence.jars import classpath
from pidfence.services.kafka import KafkaCluster, create_topic
from pidfence.services.node import Cluster, ServerNode
from pidfence.services.ports import free_port
from pidfence.services.process import ManagedProcess, ServiceFailed, started_pids
from pidfence.services.spark import SparkStandaloneCluster, spark_session, stop_session
from pidfence.services.stack import (
    NodeRecord,
    Services,
    ServicesAlreadyUp,
    ServicesError,
    ServicesPartlyDown,
    ServicesState,
    default_run_dir,
    down,
    proc_start_time,
    same_process,
    status,
)
from pidfence.services.zookeeper import ZooKeeperEnsemble, new_chroot

__all__ = [
    "Cluster",
    "KafkaCluster",
    "ManagedProcess",
    "NodeRecord",
    "ServiceFailed",
    "ServerNode",
    "Services",
    "ServicesAlreadyUp",
    "ServicesError",
    "ServicesPartlyDown",
    "ServicesState",
    "SparkStandaloneCluster",
    "ZooKeeperEnsemble",
    "classpath",
    "create_topic",
    "default_run_dir",
    "down",
    "free_port",
    "new_chroot",
    "proc_start_time",
    "same_process",
    "spark_session",
    "started_pids",
    "status",
    "stop_session",
]
