"""``IdempotentProducer`` and ``pidfence produce``/``copy`` failing against real servers: each
failure named once, with the component at fault and whether a rerun can continue."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from pidfence.pid_allocator import LeaseClient, LeaseServerThread
from pidfence.producer import (
    BrokerUnavailable,
    DeliveryFailed,
    IdempotentProducer,
    LeaseExpired,
    LeaseServerDown,
    ProducerConfig,
    ReservedHeader,
    UnknownTopic,
    ValueTooLarge,
    wall_clock_ms,
)
from pidfence.services.ports import free_port
from tests.fixtures.commands import produce_args
from tests.fixtures.produced import producer_for, read_topic, run_cli

# ---- named errors ---------------------------------------------------------------------------


def test_flush_raises_the_first_delivery_error(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> None:
    topic = new_topic(partitions=1, config={"max.message.bytes": "2000"})
    producer, client = producer_for(kafka, lease_server)
    with client:
        producer.produce(topic, b"fits")
        producer.produce(topic, b"x" * 10_000)  # below the producer's limit, above the topic's
        with pytest.raises(DeliveryFailed) as caught:
            producer.flush(30)
        assert "MSG_SIZE_TOO_LARGE" in caught.value.code
        assert not caught.value.retriable
        assert producer.flush(30) == 0  # raised once, then cleared
        producer.close()


def test_unknown_topic_is_named_and_not_retriable(
    kafka: Any, lease_server: LeaseServerThread
) -> None:
    producer, client = producer_for(kafka, lease_server)
    with client, producer:
        with pytest.raises(UnknownTopic, match="create it") as caught:
            producer.produce("pidfence-no-such-topic", b"x")
        assert not caught.value.retriable


def test_value_too_large_is_named_and_not_retriable(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> None:
    topic = new_topic(partitions=1)
    client = LeaseClient(lease_server.address)
    config = ProducerConfig(kafka.bootstrap, message_max_bytes=1000)
    with client, IdempotentProducer(config, client) as producer:
        with pytest.raises(ValueTooLarge, match="message_max_bytes") as caught:
            producer.produce(topic, b"x" * 1001)
        assert not caught.value.retriable
        with pytest.raises(ReservedHeader):
            producer.produce(topic, b"x", headers=[("pf", b"mine")])
        producer.produce(topic, b"ok")
    records = read_topic(kafka.bootstrap, topic)
    assert [(r.value, r.pf.seq if r.pf else None) for r in records] == [(b"ok", 0)]


def test_broker_down_at_start_is_named_and_retriable(lease_server: LeaseServerThread) -> None:
    config = ProducerConfig(f"127.0.0.1:{free_port()}", metadata_timeout_s=2.0)
    with LeaseClient(lease_server.address) as client:
        producer = IdempotentProducer(config, client)
        with pytest.raises(BrokerUnavailable, match="--bootstrap") as caught:
            producer.produce("t", b"x")
        assert caught.value.retriable
        producer.close(1.0)


def test_lease_server_down_is_retried_then_named_and_retriable(kafka: Any) -> None:
    attempts: list[float] = []
    client = LeaseClient(
        f"127.0.0.1:{free_port()}",
        connect_timeout_s=0.5,
        retries=3,
        backoff_s=0.01,
        sleep=attempts.append,
    )
    with client, pytest.raises(LeaseServerDown, match="lease server") as caught:
        IdempotentProducer(ProducerConfig(kafka.bootstrap), client)
    assert caught.value.retriable
    assert len(attempts) >= 3  # the client backed off between its retries


def test_expired_lease_without_lease_server_is_named_and_retriable(
    kafka: Any,
    new_topic: Callable[..., str],
    lease_server_factory: Callable[..., LeaseServerThread],
) -> None:
    topic = new_topic(partitions=1)
    server = lease_server_factory()
    offset = [0]
    client = LeaseClient(server.address, connect_timeout_s=0.5, retries=1, backoff_s=0.01)
    with client:
        producer = IdempotentProducer(
            ProducerConfig(kafka.bootstrap), client, clock=lambda: wall_clock_ms() + offset[0]
        )
        producer.produce(topic, b"before")
        assert producer.flush(30) == 0  # drained: the rollover fails only for want of a server
        server.stop()
        offset[0] = producer.sequencer.expire_ms - wall_clock_ms() + 1
        with pytest.raises(LeaseExpired, match="retry") as caught:
            producer.produce(topic, b"after")
        assert caught.value.retriable
        producer.close()
    assert [r.value for r in read_topic(kafka.bootstrap, topic)] == [b"before"]


# --- issue 24: the failing component named once; the delivery timeout settable ----------------


def dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


def resumable(tmp_path: Path) -> tuple[str, str]:
    """A state file: with it a failed ``produce`` is retriable (75); without, a rerun would
    start over, so it is 3 once a record was sent."""
    return ("--state", str(tmp_path / "produce.json"))


def test_zookeeper_down_behind_the_lease_server_is_named_not_the_lease_server(
    tmp_path: Path,
) -> None:
    """The lease server runs and answers UNAVAILABLE (its ZooKeeper is unreachable): the error
    names ZooKeeper and does not tell the user to start a lease server."""
    from pidfence.pid_allocator.memory import MemoryCoordinator

    store = MemoryCoordinator()
    store.up = False  # every ZooKeeper call answers UNAVAILABLE, as with ZooKeeper unreachable
    server = LeaseServerThread(None, coordinator=store, block_size=1).start()
    try:
        done = run_cli(
            *produce_args(dead_address(), server.address, "t", "--count", "1", *resumable(tmp_path))
        )
    finally:
        server.stop()
    assert done.returncode == 75, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("pidfence: retriable: ZooKeeperUnavailable: "), line
    assert "cannot reach ZooKeeper" in line and "--zk" in line
    assert "start one" not in done.stderr and "start a lease server" not in done.stderr


def test_lease_server_down_says_how_to_start_one_once(kafka: Any, tmp_path: Path) -> None:
    done = run_cli(
        *produce_args(kafka.bootstrap, dead_address(), "t", "--count", "1", *resumable(tmp_path))
    )
    assert done.returncode == 75, done.stderr
    assert "pidfence: retriable: LeaseServerDown: no lease server answered" in done.stderr
    assert done.stderr.count("pidfence lease-server") == 1, done.stderr


MARGIN_WARNING = "rollover margin"


@pytest.fixture
def short_leases(lease_server_factory: Callable[..., LeaseServerThread]) -> LeaseServerThread:
    """A lease server with 60 s leases: a 2.5 s rollover margin, below librdkafka's default
    5 min ``message.timeout.ms``."""
    return lease_server_factory(lifetime_ms=60_000)


def test_produce_takes_the_message_timeout_so_short_leases_need_no_warning(
    kafka: Any, new_topic: Callable[..., str], short_leases: LeaseServerThread
) -> None:
    topic = new_topic(partitions=2)
    common = (
        "produce",
        "--bootstrap",
        kafka.bootstrap,
        "--lease-server",
        short_leases.address,
        "--topic",
        topic,
        "--count",
        "20",
        "--keys",
        "0",
    )
    default = run_cli(*common)
    assert default.returncode == 0, default.stderr
    assert MARGIN_WARNING in default.stderr and "--message-timeout" in default.stderr
    fitted = run_cli(*common, "--message-timeout", "2s")
    assert fitted.returncode == 0, fitted.stderr
    assert MARGIN_WARNING not in fitted.stderr
    assert len(read_topic(kafka.bootstrap, topic)) == 40
    usage = run_cli(*common, "--message-timeout", "soon")
    assert usage.returncode == 2 and "not a duration" in usage.stderr


def test_copy_takes_the_message_timeout_so_short_leases_need_no_warning(
    kafka: Any, new_topic: Callable[..., str], short_leases: LeaseServerThread, tmp_path: Path
) -> None:
    source, target = new_topic(partitions=2), new_topic(partitions=2)
    plain = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    for i in range(10):
        plain.produce(source, b"v%d" % i, partition=i % 2)
    assert plain.flush(30) == 0
    done = run_cli(
        "copy",
        "--bootstrap",
        kafka.bootstrap,
        "--lease-server",
        short_leases.address,
        "--from-topic",
        source,
        "--to-topic",
        target,
        "--state",
        str(tmp_path / "copy.json"),
        "--idle-exit",
        "2",
        "--message-timeout",
        "2s",
    )
    assert done.returncode == 0, done.stderr
    assert MARGIN_WARNING not in done.stderr
    assert sorted(r.value for r in read_topic(kafka.bootstrap, target) if r.value) == sorted(
        b"v%d" % i for i in range(10)
    )
