"""``IdempotentProducer`` and ``pidfence produce`` against a real Kafka and a real lease server.

Every test reads what landed back from Kafka and, where it matters, replays the topic through the
broker rules (``pidfence.broker_plugin.ProducerStateTable``) in offset order, exactly as the sink
will.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from pidfence.broker_plugin import ProducerStateTable
from pidfence.jars import classpath, java
from pidfence.ledger import read_ledger
from pidfence.pid_allocator import LeaseClient, LeaseServerThread, StaleGeneration
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
    key_partition,
    wall_clock_ms,
)
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.services.ports import free_port
from pidfence.wire import FLAG_FENCE, PF_HEADER_KEY, PfHeader, Verdict, decode_pf
from tests.fixtures.commands import produce_args

PIDFENCE = str(Path(sys.executable).with_name("pidfence"))
DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Record:
    """One record read back from Kafka."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    pf: PfHeader | None
    raw_pf: bytes | None
    ts_ms: int


def read_topic(bootstrap: str, topic: str) -> list[Record]:
    """Every record of ``topic`` up to the current high watermarks, by (partition, offset)."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30)
        partitions = sorted(meta.topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=30)[
                1
            ]
            for p in partitions
        }
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in partitions
            ]
        )
        left = {p for p, end in ends.items() if end > 0}
        records: list[Record] = []
        while left:
            msg = consumer.poll(5.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            raw = dict(msg.headers() or []).get(PF_HEADER_KEY)
            assert raw is None or isinstance(raw, bytes)
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            records.append(
                Record(
                    partition,
                    offset,
                    msg.key(),
                    msg.value(),
                    decode_pf(raw) if raw is not None else None,
                    raw,
                    msg.timestamp()[1],
                )
            )
            if offset + 1 >= ends[partition]:
                left.discard(partition)
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


def replay(records: list[Record]) -> list[tuple[Record, Verdict]]:
    """Final broker-rule verdicts of ``records``, each partition replayed in offset order."""
    out: list[tuple[Record, Verdict]] = []
    tables: dict[int, ProducerStateTable] = {}
    last_ts: dict[int, int] = {}
    for record in records:
        table = tables.setdefault(
            record.partition, ProducerStateTable(capacity=10_000, lifetime_ms=DAY_MS)
        )
        last_ts[record.partition] = record.ts_ms
        for decision in table.offer_header(record.raw_pf, record.ts_ms, ref=record):
            if decision.verdict is not Verdict.BUFFERED:
                out.append((decision.ref, decision.verdict))
    for partition, table in tables.items():
        out.extend((d.ref, d.verdict) for d in table.flush(last_ts[partition]))
    return out


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``pidfence ARGS`` to completion."""
    return subprocess.run(
        [PIDFENCE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def producer_for(
    kafka: Any, lease: LeaseServerThread, **kwargs: Any
) -> tuple[IdempotentProducer, LeaseClient]:
    """A fresh producer on the session Kafka and ``lease``; close both after use."""
    client = LeaseClient(lease.address)
    return IdempotentProducer(ProducerConfig(kafka.bootstrap), client, **kwargs), client


Producing = Callable[[int], tuple[str, IdempotentProducer, LeaseClient]]


@pytest.fixture
def producing(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> Producing:
    """Callable(partitions) -> (a new topic, a fresh producer, its lease client): close both."""
    return lambda partitions: (new_topic(partitions=partitions), *producer_for(kafka, lease_server))


def send_round_robin(
    producer: IdempotentProducer, topic: str, prefix: str, indexes: range, partitions: int
) -> None:
    """Send ``<prefix><i>`` for each ``i`` of ``indexes`` to partition ``i % partitions``."""
    for i in indexes:
        producer.produce(topic, f"{prefix}{i}".encode(), partition=i % partitions)


def checkpoint_after(
    producer: IdempotentProducer, topic: str, count: int, partitions: int
) -> ProducerCheckpoint:
    """Send a0..a<count-1> round robin, wait until all are delivered, then checkpoint."""
    send_round_robin(producer, topic, "a", range(count), partitions)
    assert producer.flush(30) == 0
    return producer.checkpoint()


def assert_gap_free(records: list[Record]) -> None:
    """Each (pid, partition) carries data seqs 0, 1, 2, … in offset order, no gap, no repeat."""
    by_stream: dict[tuple[int, int], list[int]] = {}
    for r in records:
        assert r.pf is not None
        if not r.pf.flags & FLAG_FENCE:
            by_stream.setdefault((r.pf.pid, r.partition), []).append(r.pf.seq)
    for stream, seqs in by_stream.items():
        assert seqs == list(range(len(seqs))), stream


# ---- pidfence produce -----------------------------------------------------------------------


def test_produce_cli_writes_gap_free_sequences_from_zero(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    topic = new_topic(partitions=4)
    ledger = tmp_path / "ledger.jsonl"
    done = run_cli(
        *produce_args(kafka.bootstrap, lease_server.address, topic),
        "--count",
        "2000",
        "--keys",
        "100",
        "--ledger",
        str(ledger),
    )
    assert done.returncode == 0, done.stderr
    records = read_topic(kafka.bootstrap, topic)
    assert len(records) == 2000
    assert {r.pf.pid for r in records if r.pf} == {records[0].pf.pid if records[0].pf else -1}
    assert {r.partition for r in records} == {0, 1, 2, 3}
    assert all(r.pf is not None and r.pf.flags == 0 for r in records)
    assert_gap_free(records)
    for r in records:
        assert r.key is not None and r.partition == key_partition(r.key, 4)
    assert Counter(v for _, v in replay(records)) == {Verdict.APPENDED: 2000}
    acked = list(read_ledger([ledger]))
    assert sorted((e.partition, e.seq) for e in acked) == sorted(
        (r.partition, r.pf.seq) for r in records if r.pf
    )


JAVA_PRODUCER = """
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KeyedProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int i = 2; i < args.length; i++) {
                byte[] key = args[i].getBytes("UTF-8");
                RecordMetadata meta =
                    producer.send(new ProducerRecord<>(args[1], key, key)).get();
                System.out.println(args[i] + " " + meta.partition());
            }
        }
    }
}
"""


def test_keyed_records_land_where_the_java_client_puts_them(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    ours, theirs = new_topic(partitions=7), new_topic(partitions=7)
    keys = [
        "21",
        "foobar",
        "abc",
        "",
        "k0",
        "k17",
        "user-42",
        "ümlaut",
        *[f"key{i}" for i in range(40)],
    ]
    producer, client = producer_for(kafka, lease_server)
    with client, producer:
        for key in keys:
            producer.produce(ours, b"v", key=key)
    landed = {
        r.key.decode(): r.partition for r in read_topic(kafka.bootstrap, ours) if r.key is not None
    }
    source = tmp_path / "KeyedProducer.java"
    source.write_text(JAVA_PRODUCER)
    # The empty key is an empty byte array in Java too (not null), so it is hashed.
    java_run = subprocess.run(
        [java(), "-cp", classpath("kafka"), str(source), kafka.bootstrap, theirs, *keys],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert java_run.returncode == 0, java_run.stderr[-3000:]
    java_partitions: dict[str, int] = {}
    for line in java_run.stdout.splitlines():
        key, _, partition = line.rpartition(" ")
        java_partitions[key] = int(partition)
    assert java_partitions == landed
    assert len(set(landed.values())) > 1


# ---- resume and fencing ---------------------------------------------------------------------


def test_resume_fences_a_zombie_that_keeps_writing(kafka: Any, producing: Producing) -> None:
    topic, zombie, client = producing(3)
    with client:
        checkpoint = checkpoint_after(zombie, topic, 30, 3)
        heir = IdempotentProducer.resume(checkpoint, client, zombie.config)
        assert heir.sequencer.pid == checkpoint.pid
        assert heir.sequencer.generation > checkpoint.generation
        # The zombie never learns of the takeover and keeps writing under its old generation.
        send_round_robin(zombie, topic, "a", range(30, 39), 3)
        zombie.close()
        send_round_robin(heir, topic, "b", range(9), 3)
        heir.close()
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    by_value: dict[bytes | None, list[Verdict]] = {}
    fences = 0
    for record, verdict in verdicts:
        assert record.pf is not None
        if record.pf.flags & FLAG_FENCE:
            fences += 1
            assert verdict is Verdict.FENCE and record.value == b""
            continue
        by_value.setdefault(record.value, []).append(verdict)
        if (
            record.value is not None
            and record.value.startswith(b"a")
            and int(record.value[1:]) >= 30
        ):
            assert record.pf.generation == checkpoint.generation < heir.sequencer.generation
    assert fences == 3
    assert all(by_value[f"a{i}".encode()] == [Verdict.APPENDED] for i in range(30))
    assert all(by_value[f"a{i}".encode()] == [Verdict.FENCED] for i in range(30, 39))
    assert all(by_value[f"b{i}".encode()] == [Verdict.APPENDED] for i in range(9))


def _state_next_i(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["next_i"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def test_paused_producer_process_is_fenced_by_its_resumed_replacement(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread, tmp_path: Path
) -> None:
    """Process A is SIGSTOPped; B resumes A's checkpoint; A, continued, is FENCED everywhere."""
    topic = new_topic(partitions=2)
    state_a, state_b = tmp_path / "a.json", tmp_path / "b.json"
    common = produce_args(
        kafka.bootstrap, lease_server.address, topic, "--keys", "0", "--checkpoint-every", "20"
    )
    zombie_log = (tmp_path / "zombie.err").open("w")
    zombie = subprocess.Popen(
        [
            PIDFENCE,
            *common,
            "--count",
            "1000000",
            "--rate",
            "400",
            "--state",
            str(state_a),
        ],
        stdout=subprocess.DEVNULL,
        stderr=zombie_log,
    )
    try:
        while _state_next_i(state_a) < 100:
            assert zombie.poll() is None, (tmp_path / "zombie.err").read_text()
            zombie_wait(zombie, 0.05)
        os.kill(zombie.pid, signal.SIGSTOP)
        shutil.copyfile(state_a, state_b)
        taken_over_at = _state_next_i(state_b)
        heir = run_cli(
            *common,
            "--count",
            str(taken_over_at + 40),
            "--rate",
            "400",  # a resume must repeat the options that shaped its records
            "--state",
            str(state_b),
        )
        assert heir.returncode == 0, heir.stderr
        # Let the zombie write on: every record it sends now carries the fenced generation.
        os.kill(zombie.pid, signal.SIGCONT)
        before = len(read_topic(kafka.bootstrap, topic))
        while len(read_topic(kafka.bootstrap, topic)) < before + 20:
            assert zombie.poll() is None, (tmp_path / "zombie.err").read_text()
            zombie_wait(zombie, 0.2)
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGKILL)
        zombie.wait(30)
        zombie_log.close()
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    fence_at = {r.partition: r.offset for r, v in verdicts if v is Verdict.FENCE}
    heir_generation = max(r.pf.generation for r, _ in verdicts if r.pf)
    assert sorted(fence_at) == [0, 1]
    late_zombie = [
        (r, v)
        for r, v in verdicts
        if r.offset > fence_at[r.partition] and r.pf and r.pf.generation < heir_generation
    ]
    assert len(late_zombie) >= 20
    assert {v for _, v in late_zombie} == {Verdict.FENCED}
    # The appended log is records 0 .. taken_over_at+39 of the load, each exactly once.
    appended = [json.loads(r.value or b"{}")["i"] for r, v in verdicts if v is Verdict.APPENDED]
    assert sorted(appended) == list(range(taken_over_at + 40))


def zombie_wait(process: subprocess.Popen[Any], seconds: float) -> None:
    """Wait up to ``seconds`` for ``process`` (a polling pause that ends early if it exits)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(seconds)


def test_resume_of_an_expired_checkpoint_rolls_it_into_its_successor(
    kafka: Any,
    new_topic: Callable[..., str],
    lease_server: LeaseServerThread,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic(partitions=1)
    # A checkpoint taken the way a caller stores it, resumed once its lease ended.
    producer, client = producer_for(kafka, lease_server)
    with client:
        producer.produce(topic, b"y")
        assert producer.flush(30) == 0
        checkpoint = producer.checkpoint()
        producer.close()
        later = checkpoint.expire_ms + 1
        with caplog.at_level(logging.INFO, logger="pidfence.producer"):
            resumed = IdempotentProducer.resume(
                checkpoint, client, producer.config, clock=lambda: later
            )
        assert resumed.resumed_how == "rolled" and resumed.resumed_from_expired
        assert resumed.sequencer.pid != checkpoint.pid
        assert resumed.sequencer.checkpoint().next_seq == {}
        assert any("(rolled)" in r.getMessage() for r in caplog.records)
        # The pid was retired by the roll: the old owner can neither bump nor roll it any more.
        with pytest.raises(StaleGeneration) as stale:
            client.roll(checkpoint.pid, checkpoint.generation, checkpoint.secret)
        assert stale.value.successor == resumed.sequencer.pid
        resumed.produce(topic, b"z")
        resumed.close()
    records = read_topic(kafka.bootstrap, topic)
    assert [r.value for r in records] == [b"y", b"z"]
    assert records[-1].pf is not None and records[-1].pf.seq == 0
    assert not any(r.pf and r.pf.flags & FLAG_FENCE for r in records)


def test_rollover_leases_a_new_pid_with_seqs_from_zero(
    kafka: Any, new_topic: Callable[..., str], lease_server: LeaseServerThread
) -> None:
    topic = new_topic(partitions=2)
    offset = [0]
    producer, client = producer_for(kafka, lease_server, clock=lambda: wall_clock_ms() + offset[0])
    with client:
        first_pid = producer.sequencer.pid
        lifetime = producer.sequencer.expire_ms - wall_clock_ms()
        send_round_robin(producer, topic, "a", range(10), 2)
        # 23/24 of the lifetime has passed: the next record goes out under a new pid (after the
        # old pid's records are drained). The successor's lease is issued on the server's clock,
        # so the producer's clock goes back to it right after the roll.
        offset[0] = lifetime * 23 // 24 + 1000
        for i in range(10):
            producer.produce(topic, f"b{i}".encode(), partition=i % 2)
            offset[0] = 0
        assert producer.rollovers == 1
        assert producer.sequencer.pid != first_pid
        producer.close()
    records = read_topic(kafka.bootstrap, topic)
    assert_gap_free(records)
    assert {r.pf.pid for r in records if r.pf} == {first_pid, producer.sequencer.pid}
    assert Counter(v for _, v in replay(records)) == {Verdict.APPENDED: 20}


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


def test_resume_after_a_bump_that_wrote_no_fence_is_accepted_by_the_broker_rules(
    kafka: Any, producing: Producing
) -> None:
    """A predecessor bumped, then died before its FENCEs: the heir walks the generation up."""
    topic, first, client = producing(2)
    with client:
        checkpoint = checkpoint_after(first, topic, 6, 2)
        first.close()
        # the dead predecessor's bump
        client.bump(checkpoint.pid, checkpoint.generation, checkpoint.secret)
        heir = IdempotentProducer.resume(checkpoint, client, first.config)
        assert heir.sequencer.generation == checkpoint.generation + 2
        send_round_robin(heir, topic, "b", range(4), 2)
        heir.close()
    verdicts = replay(read_topic(kafka.bootstrap, topic))
    assert Counter(v for _, v in verdicts) == {Verdict.APPENDED: 10, Verdict.FENCE: 4}


# --- issue 24: the failing component named once; the delivery timeout settable ----------------


def dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


def test_zookeeper_down_behind_the_lease_server_is_named_not_the_lease_server() -> None:
    """The lease server runs and answers UNAVAILABLE (its ZooKeeper is unreachable): the error
    names ZooKeeper and does not tell the user to start a lease server."""
    from pidfence.pid_allocator.memory import MemoryCoordinator

    store = MemoryCoordinator()
    store.up = False  # every ZooKeeper call answers UNAVAILABLE, as with ZooKeeper unreachable
    server = LeaseServerThread(None, coordinator=store, block_size=1).start()
    try:
        done = run_cli(*produce_args(dead_address(), server.address, "t", "--count", "1"))
    finally:
        server.stop()
    assert done.returncode == 75, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("pidfence: retriable: ZooKeeperUnavailable: "), line
    assert "cannot reach ZooKeeper" in line and "--zk" in line
    assert "start one" not in done.stderr and "start a lease server" not in done.stderr


def test_lease_server_down_says_how_to_start_one_once(kafka: Any) -> None:
    done = run_cli(*produce_args(kafka.bootstrap, dead_address(), "t", "--count", "1"))
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
