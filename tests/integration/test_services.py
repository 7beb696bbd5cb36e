"""Real ZooKeeper, Kafka and Spark: round trips, faults on 3-node clusters, `pidfence services`."""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidfence.services import (
    KafkaCluster,
    Services,
    ZooKeeperEnsemble,
    proc_start_time,
    same_process,
    started_pids,
)
from pidfence.services.process import wait_until
from pidfence.services.stack import down as services_down
from pidfence.services.stack import read_state
from tests.fixtures.commands import run_pidfence
from tests.fixtures.services import _STARTED_SERVICES, SESSION_SERVERS

PIDFENCE = [sys.executable, "-c", "from pidfence.cli import main; main()"]


def _consume(bootstrap: str, topic: str, want: int, deadline_s: float = 60.0) -> list[Any]:
    """Every message of ``topic`` from the start, until ``want`` arrived or the deadline."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Any] = []
    deadline = time.monotonic() + deadline_s
    try:
        while len(messages) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            messages.append(msg)
    finally:
        consumer.close()
    return messages


def test_produce_and_consume_with_headers(kafka: Any, new_topic: Callable[..., str]) -> None:
    from confluent_kafka import Producer

    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    sent: dict[bytes, list[tuple[str, str | bytes | None]]] = {
        f"k{i}".encode(): [("pf", bytes([0x95, 1, i])), ("trace", b"t%d" % i)] for i in range(20)
    }
    for key, headers in sent.items():
        producer.produce(topic, key=key, value=b"v" + key, headers=headers)
    assert producer.flush(30) == 0
    got = {m.key(): (m.value(), m.headers()) for m in _consume(kafka.bootstrap, topic, len(sent))}
    assert got == {key: (b"v" + key, headers) for key, headers in sent.items()}


def test_kazoo_versioned_compare_and_set(zk_chroot: str) -> None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import BadVersionError

    client = KazooClient(hosts=zk_chroot)
    client.start(timeout=30)
    try:
        client.create("/block", b"0")
        _, stat = client.get("/block")
        new_stat = client.set("/block", b"100", version=stat.version)
        assert new_stat.version == stat.version + 1
        with pytest.raises(BadVersionError):
            client.set("/block", b"200", version=stat.version)
        assert client.get("/block")[0] == b"100"
    finally:
        client.stop()
        client.close()


def test_spark_stream_reads_kafka_headers(
    spark: Any, kafka: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = new_topic()
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(5):
        producer.produce(topic, value=b"v%d" % i, headers=[("pf", b"\x95\x01\x07" + bytes([i]))])
    assert producer.flush(30) == 0
    name = f"headers_{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .selectExpr("value", "headers")
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    rows = spark.sql(f"SELECT value, headers FROM {name}").collect()  # noqa: S608 - our uuid name
    seen = {bytes(r.value): [(h.key, bytes(h.value)) for h in r.headers] for r in rows}
    assert seen == {b"v%d" % i: [("pf", b"\x95\x01\x07" + bytes([i]))] for i in range(5)}


def _zk_mode(port: int) -> str:
    """``leader``, ``follower`` or ``standalone`` from the ``srvr`` four-letter word."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"srvr")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    for line in reply.decode().splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def test_zookeeper_ensemble_serves_with_one_node_killed(zk_ensemble3: ZooKeeperEnsemble) -> None:
    from kazoo.client import KazooClient

    modes = [_zk_mode(port) for port in zk_ensemble3.client_ports]
    victim = modes.index("leader") if "leader" in modes else 0
    path = f"/pidfence-test/{uuid.uuid4().hex}"
    client = KazooClient(hosts=zk_ensemble3.hosts, timeout=10)
    client.start(timeout=30)
    try:
        client.ensure_path(path)
        zk_ensemble3.kill(victim)
        # Killing the leader forces an election; retries ride out the connection loss.
        for i in range(20):
            client.retry(client.set, path, b"%d" % i)
        assert client.retry(client.get, path)[0] == b"19"
    finally:
        client.stop()
        client.close()
        zk_ensemble3.restart(victim)
    for i in range(3):
        reader = KazooClient(hosts=zk_ensemble3.node_hosts(i))
        reader.start(timeout=30)
        try:
            reader.sync(path)
            assert reader.get(path)[0] == b"19"
        finally:
            reader.stop()
            reader.close()


def test_kafka_rf3_acks_all_loses_nothing_with_a_broker_killed(
    kafka_cluster3: KafkaCluster,
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    topic = kafka_cluster3.create_topic(
        f"rf3-{uuid.uuid4().hex[:10]}",
        partitions=2,
        replication=3,
        config={"min.insync.replicas": "2"},
    )
    meta = AdminClient({"bootstrap.servers": kafka_cluster3.bootstrap}).list_topics(topic, 10)
    victim = meta.topics[topic].partitions[0].leader - 1
    errors: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": kafka_cluster3.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
        }
    )
    total = 4000
    try:
        for i in range(total):
            producer.produce(topic, key=b"%d" % (i % 16), value=b"%d" % i, on_delivery=report)
            producer.poll(0)
            if i == total // 2:
                producer.flush(60)
                kafka_cluster3.kill(victim)
        assert producer.flush(120) == 0
    finally:
        kafka_cluster3.restart(victim)
    assert errors == []
    values = [int(m.value()) for m in _consume(kafka_cluster3.bootstrap, topic, total, 120)]
    assert sorted(values) == list(range(total))
    assert kafka_cluster3.broker_ids() == {1, 2, 3}


def test_services_cli_up_status_down(tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient
    from kazoo.client import KazooClient

    run_dir = tmp_path / "services"
    try:
        up = run_pidfence("services", "up", "--run-dir", str(run_dir), timeout=300)
        assert up.returncode == 0, up.stderr
        status = run_pidfence("services", "status", "--json", "--run-dir", str(run_dir), timeout=60)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert set(doc["pids"]) == {"zookeeper-0", "kafka-0"}
        assert all(doc["alive"].values())
        state = read_state(run_dir)
        assert state is not None
        records = list(state.nodes)
        assert all(same_process(n.pid, n.start_time) for n in records)
        # The servers outlived the `up` command and serve.
        meta = AdminClient({"bootstrap.servers": doc["kafka"]}).list_topics(timeout=30)
        assert len(meta.brokers) == 1
        zk = KazooClient(hosts=doc["zookeeper"])
        zk.start(timeout=30)
        try:
            assert zk.exists("/pidfence-ready") is not None
        finally:
            zk.stop()
            zk.close()
        down = run_pidfence("services", "down", "--run-dir", str(run_dir), timeout=120)
        assert down.returncode == 0, down.stderr
        assert "kafka-0" in down.stdout
        assert not any(proc_start_time(n.pid) == n.start_time for n in records)
        assert not (run_dir / "state.json").exists()
    finally:
        if read_state(run_dir) is not None:
            services_down(run_dir)


def _proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]


def test_services_api_fault_hooks(tmp_path: Path) -> None:
    from kazoo.client import KazooClient

    stack = Services(zookeeper=1, kafka=1, run_dir=tmp_path / "stack")
    state = stack.up()
    try:
        first = state.pids()["zookeeper-0"]
        stack.kill("zookeeper-0")
        assert not any(
            n.name == "zookeeper-0" and same_process(n.pid, n.start_time) for n in state.nodes
        )
        stack.restart("zookeeper-0")
        after = read_state(stack.run_dir)
        assert after is not None
        assert after.pids()["zookeeper-0"] != first
        assert all(same_process(n.pid, n.start_time) for n in after.nodes)
        client = KazooClient(hosts=stack.zk_hosts)
        client.start(timeout=30)
        client.stop()
        client.close()
        kafka_pid = after.pids()["kafka-0"]
        # Signals are delivered asynchronously: wait for the state to change.
        stack.pause("kafka-0")
        wait_until(lambda: _proc_state(kafka_pid) == "T", 30, "kafka-0 stopped")
        stack.resume("kafka-0")
        wait_until(lambda: _proc_state(kafka_pid) != "T", 30, "kafka-0 running")
        records = after.nodes
    finally:
        stack.down()
    assert not any(same_process(n.pid, n.start_time) for n in records)
    assert not stack.run_dir.exists()


def test_no_process_left() -> None:
    """Only the session's shared servers may still run; they stop when the session ends."""
    shared = {
        node.pid for service in _STARTED_SERVICES for node in service.nodes if node.pid is not None
    } | {server.pid for server in SESSION_SERVERS if server.pid is not None}
    assert started_pids() <= shared
