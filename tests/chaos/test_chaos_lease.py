"""Lease-service faults: one of two lease servers killed (client failover), and a lease that
expires while its producer is paused (its late records are rejected, not appended)."""

from __future__ import annotations

from typing import Any

import pytest

from pidfence.demo.faults import KillAndResume, drive
from pidfence.demo.topic import create_topic
from pidfence.ledger import read_ledger
from pidfence.services.lease_server import spawn_lease_server
from tests.chaos.conftest import ChaosKit

pytestmark = pytest.mark.timeout(240)


def test_one_of_two_lease_servers_killed_producer_fails_over(
    chaos: ChaosKit, kafka: Any, new_topic: Any, zk_chroot: str, spark: Any, stop_all: Any
) -> None:
    servers = [
        spawn_lease_server(zk_chroot, chaos.logs, name=f"lease-{i}", wait=False) for i in range(2)
    ]
    try:
        for server in servers:
            server.wait_listening()
        topic = new_topic(partitions=2)
        both = ",".join(s.address for s in servers)
        role = chaos.role("p", kafka.bootstrap, both, topic, 2000, rate=400.0)
        stop_all(role)
        role.spawn()
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
    chaos.sink(spark, kafka.bootstrap, topic)
    outcome = chaos.outcome()
    outcome.assert_clean()
    assert outcome.verdicts["FENCE"] >= 1
    assert outcome.log.num_rows == 2000


def test_lease_expiry_while_paused_every_event_once(
    chaos: ChaosKit, kafka: Any, zk_chroot: str, spark: Any, stop_all: Any, request: Any
) -> None:
    # LogAppendTime: a record's time is when the broker appends it, so records that sat in the
    # paused producer's queue arrive "late" by the broker's clock, after the lease expired.
    topic = create_topic(
        kafka.bootstrap,
        f"expiry-{request.node.name[:40]}".replace("[", "-").replace("]", ""),
        partitions=1,
        config={"message.timestamp.type": "LogAppendTime"},
    )
    lifetime_s = 6
    server = spawn_lease_server(
        zk_chroot, chaos.logs, name="lease", lifetime_ms=lifetime_s * 1000, wait=False
    )
    try:
        server.wait_listening()
        # A steady rate and no checkpoint flushes: librdkafka always holds lingering records,
        # so the SIGSTOP below freezes some of them in the queue.
        role = chaos.role(
            "p", kafka.bootstrap, server.address, topic, 30_000, rate=2000.0,
            checkpoint_every=1_000_000,
        )  # fmt: skip
        stop_all(role)
        worker = role.spawn()
        drive([], timeout=120, until=lambda: role.acked() >= 2000 or not worker.running)
        worker.pause()
        import time

        time.sleep(lifetime_s + 2)  # the fault itself: the pause outlives the lease
        worker.resume()
        code = worker.wait(180)
        if code == 75:
            # Records were still unacknowledged when its lease ended: it refuses to roll over
            # (DrainFailed, retriable) and never sends them under a new pid. A supervisor
            # restarts it from its state file; the old process is gone, so the resumer's
            # recovery scan sees everything it got into Kafka.
            assert "DrainFailed" in worker.tail(), worker.tail()
            assert role.spawn().wait(180) == 0, role.current.tail()
        else:
            # Nothing was in flight: it rolled over to a successor and went on.
            assert code == 0, worker.tail()
    finally:
        server.stop()
    chaos.sink(spark, kafka.bootstrap, topic, sink_options={"lifetime": f"{lifetime_s}s"})
    outcome = chaos.outcome()
    # DESIGN §9: a producer woken after its lease ended never sends under it; it rolls to a
    # successor through the lineage and goes on. Records frozen in librdkafka's queue land
    # late but once, and the sink's timestamp skew (1 h by default) keeps the pid's entry live
    # for them, so nothing is refused and every event is in the log exactly once.
    outcome.assert_clean()  # includes event_duplicate and event_lost
    assert outcome.log.num_rows == 30_000
    assert outcome.verdicts["UNKNOWN_PID"] == 0, outcome.verdicts
    pids = {e.pid for e in read_ledger([chaos.ledgers])}
    assert len(pids) >= 2, pids  # the producer went on under a successor


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
