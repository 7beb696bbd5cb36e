"""Lease-service faults: one of two lease servers killed (client failover), and a lease that
expires while its producer is paused, at a checkpoint (it rolls on) and with records in flight
(it refuses to roll over, exits 75 and a restart goes on): each event once either way."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from pidfence.demo.faults import KillAndResume, drive
from pidfence.demo.procstat import is_stopped
from pidfence.demo.topic import create_topic
from pidfence.ledger import read_ledger
from pidfence.services.lease_server import spawn_lease_server
from pidfence.services.process import wait_until
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(240)


def test_one_of_two_lease_servers_killed_producer_fails_over(
    chaos: ChaosKit, kafka: Any, new_topic: Any, zk_chroot: str, spark: Any
) -> None:
    servers = [
        spawn_lease_server(zk_chroot, chaos.logs, name=f"lease-{i}", wait=False) for i in range(2)
    ]
    try:
        for server in servers:
            server.wait_listening()
        topic = new_topic(partitions=2)
        both = ",".join(s.address for s in servers)
        role = chaos.start("p", kafka.bootstrap, both, topic, 2000, rate=400.0)
        # Kill the first server, then crash the producer: its resume must bump through the other.
        servers[0].kill()
        fault = KillAndResume(role, at=600)
        drive([fault], timeout=150, until=lambda: not role.running())
        assert not servers[0].proc.running
        assert role.current.exit_code() == 0, role.current.tail()
        assert role.instances[1].fences() >= 1, "resume did not bump through the live server"
    finally:
        for server in servers:
            server.stop()
    outcome = chaos.clean_outcome(spark, kafka.bootstrap, topic)
    assert outcome.verdicts["FENCE"] >= 1
    assert outcome.log.num_rows == 2000


LIFETIME_S = 6


def expiry_topic(kafka: Any, request: Any) -> str:
    """One partition, LogAppendTime: a record's time is when the broker appends it, so records
    that sat in the paused producer's queue arrive "late" by the broker's clock."""
    return create_topic(
        kafka.bootstrap,
        f"expiry-{request.node.name[:40]}".replace("[", "-").replace("]", ""),
        partitions=1,
        config={"message.timestamp.type": "LogAppendTime"},
    )


def self_stopped_producer(
    chaos: ChaosKit,
    stop_all: Any,
    bootstrap: str,
    address: str,
    topic: str,
    *,
    rate: float,
    checkpoint_every: int,
    stop_after: int,
) -> tuple[Any, Any]:
    """A producer of 6,000 records to ``topic`` at ``rate`` records/s that stops itself right
    after its state save number ``stop_after`` (``stop_all`` ends it at teardown): its role,
    and its process once stopped."""
    extra = ("--stop-after-checkpoint", str(stop_after))
    role = chaos.role(
        "p",
        bootstrap,
        address,
        topic,
        6000,
        rate=rate,
        checkpoint_every=checkpoint_every,
        extra=extra,
    )
    stop_all(role)
    worker = role.spawn()
    wait_until(
        lambda: (worker.pid is not None and is_stopped(worker.pid)) or not worker.running,
        120,
        f"the producer to stop itself after state save {stop_after}",
    )
    assert worker.running, worker.tail()
    return role, worker


def judge_expiry_run(chaos: ChaosKit, kafka: Any, spark: Any, topic: str, count: int) -> None:
    chaos.sink(spark, kafka.bootstrap, topic, sink_options={"lifetime": f"{LIFETIME_S}s"})
    outcome = chaos.outcome()
    # DESIGN §9: a producer woken after its lease ended never sends under it; it goes on under
    # a successor through the lineage. Records frozen in librdkafka's queue land late but once,
    # and the sink's timestamp skew (1 h by default) keeps the pid's entry live for them, so
    # nothing is refused and every event is in the log exactly once.
    outcome.assert_clean()  # includes event_duplicate and event_lost
    assert outcome.log.num_rows == count
    assert outcome.verdicts["UNKNOWN_PID"] == 0, outcome.verdicts
    pids = {e.pid for e in read_ledger([chaos.ledgers])}
    assert len(pids) >= 2, pids  # it went on under a successor


def test_lease_expiry_while_paused_at_a_checkpoint_rolls_on(
    chaos: ChaosKit, kafka: Any, zk_chroot: str, spark: Any, stop_all: Any, request: Any
) -> None:
    topic = expiry_topic(kafka, request)
    server = spawn_lease_server(
        zk_chroot, chaos.logs, name="lease", lifetime_ms=LIFETIME_S * 1000, wait=False
    )
    try:
        server.wait_listening()
        # It stops itself right after its third state save (at record 2000): everything it sent
        # is acknowledged, nothing is in flight when it wakes after its lease ended.
        _, worker = self_stopped_producer(
            chaos,
            stop_all,
            kafka.bootstrap,
            server.address,
            topic,
            rate=2000.0,
            checkpoint_every=1000,
            stop_after=3,
        )
        time.sleep(LIFETIME_S + 2)  # the fault itself: the pause outlives the lease
        worker.resume()
        # Nothing to drain: it rolls over to a successor through the lineage and goes on.
        assert worker.wait(180) == 0, worker.tail()
    finally:
        server.stop()
    judge_expiry_run(chaos, kafka, spark, topic, 6000)


def topic_on_one_broker(bootstrap: str, name: str, broker_id: int) -> str:
    """A 1-partition topic whose only replica is ``broker_id``: with that broker down the
    partition has no leader, so nothing sent to it is appended or acknowledged, however the
    machine schedules the producer."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(name, 1, replica_assignment=[[broker_id]])
    for future in admin.create_topics([new], operation_timeout=30).values():
        future.result(timeout=60)
    return name


@pytest.mark.timeout(600)  # starts the 3-broker cluster if no test did, and restarts a broker
def test_lease_expiry_with_records_in_flight_refuses_to_roll_then_restarts(
    chaos: ChaosKit,
    kafka_cluster3: Any,
    zk_chroot: str,
    spark: Any,
    stop_all: Any,
    request: Any,
) -> None:
    bootstrap = kafka_cluster3.bootstrap
    topic = topic_on_one_broker(bootstrap, f"inflight-{request.node.name[-24:]}", broker_id=3)
    server = spawn_lease_server(
        zk_chroot, chaos.logs, name="lease", lifetime_ms=LIFETIME_S * 1000, wait=False
    )
    broker_down = False
    try:
        server.wait_listening()
        # It stops itself right after its first state save (a fresh lease, nothing sent yet);
        # meanwhile the topic's only broker crashes; then it goes on at 500 records/s, so it
        # reaches its rollover point long before its 6,000 records are handed over.
        role, worker = self_stopped_producer(
            chaos,
            stop_all,
            bootstrap,
            server.address,
            topic,
            rate=500.0,
            checkpoint_every=6000,
            stop_after=1,
        )
        kafka_cluster3.kill(2)  # broker id 3
        broker_down = True
        worker.resume()
        # Nothing it sends can be acknowledged, so the drain before its rollover cannot finish
        # inside the lease: it refuses to roll over (DrainFailed, retriable, exit 75) and never
        # sends those records under a new pid.
        assert worker.wait(180) == 75, worker.tail()
        assert "DrainFailed" in worker.tail(), worker.tail()
        kafka_cluster3.restart(2)
        broker_down = False
        # A supervisor restarts it from its state file: a checkpoint saved before its first
        # record, which names no topic. The resume fences and scans the topic it writes anyway
        # and sends every record once.
        assert role.spawn(replace(role.spec, extra=())).wait(180) == 0, role.current.tail()
    finally:
        if broker_down:  # leave every node running for the next test
            kafka_cluster3.restart(2)
        server.stop()
    outcome = chaos.clean_outcome(
        spark, bootstrap, topic, sink_options={"lifetime": f"{LIFETIME_S}s"}
    )  # includes event_duplicate and event_lost
    assert outcome.log.num_rows == 6000


def test_health_check_fails_on_a_frozen_server_that_still_accepts_connections(
    zk_chroot: str, tmp_path: Any
) -> None:
    """Finding 2's symptom: a frozen server still completes TCP connects (the kernel accepts
    them), so a connect-based healthcheck passed. ``--health`` pings, so it fails."""
    import socket

    from typer.testing import CliRunner

    from pidfence.cli import app

    server = spawn_lease_server(zk_chroot, tmp_path, name="frozen")
    try:
        health = ["lease-server", "--health", server.address, "--timeout", "1"]
        assert CliRunner().invoke(app, health).exit_code == 0
        server.pause()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass  # the listen backlog still accepts
        assert CliRunner().invoke(app, health).exit_code == 1
        server.resume()
        assert CliRunner().invoke(app, health).exit_code == 0
    finally:
        server.stop()
