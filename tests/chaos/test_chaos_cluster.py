"""Cluster faults under a running producer: one of three Kafka brokers killed and restarted
(RF 3, acks=all, min.insync.replicas=2), and one of three ZooKeeper nodes killed while the
producer crashes and resumes (its bump goes through the surviving quorum)."""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.demo.faults import Bounce, KillAndResume, drive
from pidfence.demo.topic import create_topic
from pidfence.services.lease_server import spawn_lease_server
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(420)

RECORDS = 3000


def test_kafka_broker_killed_and_restarted_loses_nothing(
    chaos: ChaosKit,
    kafka_cluster3: Any,
    lease_server: Any,
    spark: Any,
    request: Any,
) -> None:
    bootstrap = kafka_cluster3.bootstrap
    topic = create_topic(
        bootstrap,
        f"chaos-broker-{request.node.name[-20:]}",
        partitions=3,
        replication=3,
        config={"min.insync.replicas": "2"},
    )
    role = chaos.start("p", bootstrap, lease_server.address, topic, RECORDS, rate=300.0)
    bounce = Bounce(
        "kafka broker 1",
        when=lambda: role.acked() >= RECORDS // 4,
        kill=kafka_cluster3[1].kill,  # the fault hooks live on the node
        restart=lambda: kafka_cluster3.restart(1),
        down_s=3.0,
    )
    try:
        drive([bounce], timeout=300, until=lambda: not role.running())
    finally:
        if not bounce.done:  # leave every node running for the next test
            kafka_cluster3.restart(1)
    assert role.current.exit_code() == 0, role.current.tail()
    assert bounce.events[0] == "killed kafka broker 1"
    outcome = chaos.clean_outcome(spark, bootstrap, topic)
    assert outcome.log.num_rows == RECORDS


def test_zookeeper_node_killed_while_producer_resumes(
    chaos: ChaosKit, kafka: Any, new_topic: Any, zk_ensemble3: Any, spark: Any
) -> None:
    server = spawn_lease_server(zk_ensemble3.hosts, chaos.logs, name="lease", wait=False)
    try:
        server.wait_listening()
        topic = new_topic(partitions=2)
        role = chaos.start("p", kafka.bootstrap, server.address, topic, 2000, rate=400.0)
        bounce = Bounce(
            "zookeeper node 0",
            when=lambda: role.acked() >= 400,
            kill=zk_ensemble3[0].kill,
            restart=zk_ensemble3[0].restart,
            down_s=5.0,
        )
        # The crash comes while node 0 is down: resume's bump is a ZooKeeper compare-and-set.
        crash = KillAndResume(role, at=600)
        resumed_with_node_0: list[bool] = []
        spawn = role.spawn

        def spawn_noting_node_0() -> Any:
            resumed_with_node_0.append(zk_ensemble3[0].running)
            return spawn()

        role.spawn = spawn_noting_node_0  # type: ignore[method-assign]
        try:
            drive([bounce, crash], timeout=200, until=lambda: not role.running())
        finally:
            if not bounce.done:
                zk_ensemble3.restart(0)
        assert resumed_with_node_0 == [False], bounce.events + crash.events
        assert role.current.exit_code() == 0, role.current.tail()
        assert role.instances[1].fences() >= 1
    finally:
        server.stop()
    outcome = chaos.clean_outcome(spark, kafka.bootstrap, topic)
    assert outcome.verdicts["FENCE"] >= 1
    assert outcome.log.num_rows == 2000
