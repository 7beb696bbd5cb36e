"""Issue 26 on real Kafka and Spark: one missing record never blocks a producer in the output.

Each case is what an operator meets: retention trims a partition's head before a sink first
reads it; Kafka loses one record of a producer; a new sink starts at ``latest`` while producers
are mid-stream; retention runs while the sink is stopped (refused by default, continued with
``--allow-data-loss``). In every case each record still in Kafka that is not a duplicate is
appended exactly once, in seq order, each gap is reported with its range, and no duplicate or
fenced record gets in. Where the sink could not see a producer start it adopts it through the
lease server (issue 35: ``leaseServer``); without one it adopts nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from pidfence.cli.exits import EXIT_UNAVAILABLE
from pidfence.pid_allocator import LeaseClient
from pidfence.producer import IdempotentProducer, ProducerConfig
from pidfence.spark_sink import read_gaps, read_log, read_rejects, run_sink, start_sink
from pidfence.spark_sink.data_loss import DataLost
from pidfence.wire import FLAG_FENCE, encode_pf
from tests.fixtures.commands import sink_args
from tests.integration.test_cli_sink import run_sink as run_sink_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def delete_records_before(bootstrap: str, topic: str, offset: int, partition: int = 0) -> None:
    """What retention does: Kafka's log start of the partition moves to ``offset``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, partition, offset)])
    for future in futures.values():
        future.result(timeout=30)


def values(table: pa.Table) -> list[str]:
    return [v.decode() for v in table.column("value").to_pylist()]


def seqs_of(table: pa.Table, pid: int) -> list[int]:
    return [
        s
        for p, s in zip(table["pid"].to_pylist(), table["seq"].to_pylist(), strict=True)
        if p == pid
    ]


def gap_rows(path: Path) -> list[tuple[Any, ...]]:
    gaps = read_gaps(str(path))
    return [
        (r["kind"], r["pid"], r["seq_first"], r["seq_last"], r["offset_before"], r["offset_after"])
        for r in gaps.to_pylist()
    ]


def authority(lease_server: Any) -> dict[str, str]:
    """The sink options that let it adopt through the test's lease server."""
    return {"leaseServer": lease_server.address}


@dataclass
class Leased:
    """A real producer leased from the test's lease server, the one-partition topic it filled
    with ``e0..e99``, and the sink options that adopt through that server."""

    producer: IdempotentProducer
    topic: str
    adopt: dict[str, str]

    @property
    def pid(self) -> int:
        """The producer's pid (from its checkpoint: everything is flushed when this is asked)."""
        return self.producer.checkpoint().pid

    def produce(self, first: int, n: int) -> None:
        """``n`` events ``e<first>..`` through the real producer, to partition 0, acknowledged."""
        for i in range(first, first + n):
            self.producer.produce(self.topic, f"e{i}".encode(), partition=0)
        self.producer.flush()


@pytest.fixture
def leased(kafka: Any, new_topic: Any, lease_server: Any) -> Iterator[Leased]:
    client = LeaseClient(lease_server.address)
    prod = IdempotentProducer(ProducerConfig(kafka.bootstrap), client)
    case = Leased(prod, new_topic(partitions=1), authority(lease_server))
    case.produce(0, 100)
    yield case
    prod.close()
    client.close()


def test_retention_trimmed_head_before_the_first_read(
    spark: Any, kafka: Any, leased: Leased, tmp_path: Path
) -> None:
    """Issue 26 case 1: was 0 of 150 appended (150 UNKNOWN_PID)."""
    topic = leased.topic
    delete_records_before(kafka.bootstrap, topic, 50)
    leased.produce(100, 100)
    out = tmp_path / "out"
    bare = tmp_path / "bare"
    # Without the lease server nothing is adopted: every record is named UNKNOWN_PID.
    run_sink(spark, kafka.bootstrap, topic, str(bare), str(tmp_path / "bare-ckpt"))
    assert read_log(str(bare)).num_rows == 0
    assert set(read_rejects(str(bare))["verdict"].to_pylist()) == {"UNKNOWN_PID"}
    summary = run_sink(
        spark,
        kafka.bootstrap,
        topic,
        str(out),
        str(tmp_path / "ckpt"),
        sink_options=leased.adopt,
    )
    log = read_log(str(out))
    assert values(log) == [f"e{i}" for i in range(50, 200)]
    assert seqs_of(log, leased.pid) == list(range(50, 200))
    assert read_rejects(str(out)).num_rows == 0
    assert gap_rows(out) == [
        ("offsets", None, None, None, None, 50),
        ("head", leased.pid, 0, 49, None, 50),
    ]
    assert summary.gaps == {"head": 1, "offsets": 1}


def test_one_record_lost_by_kafka_is_a_gap_not_a_blocked_producer(
    spark: Any, kafka: Any, new_topic: Any, tmp_path: Path
) -> None:
    """Issue 26 case 2: seq 50 never reaches the partition (was 50 appended, 95 OUT_OF_ORDER).

    Resends of appended records and a zombie's records after its fence are mixed in: they stay
    ``DUPLICATE`` and ``FENCED``.
    """
    topic = new_topic(partitions=1)
    pid, gen = 9_001, 4
    records: list[tuple[str, bytes]] = [(f"s{s}", encode_pf(pid, gen, s)) for s in range(50)]
    records += [("dup-s10", encode_pf(pid, gen, 10)), ("dup-s49", encode_pf(pid, gen, 49))]
    records += [(f"s{s}", encode_pf(pid, gen, s)) for s in range(51, 100)]
    records += [("fence", encode_pf(pid, gen + 1, 100, FLAG_FENCE))]
    records += [("zombie-s100", encode_pf(pid, gen, 100))]
    records += [(f"s{s}", encode_pf(pid, gen + 1, s)) for s in range(100, 150)]
    records += [("dup-s120", encode_pf(pid, gen + 1, 120))]
    raw = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for label, pf in records:
        raw.produce(topic, value=label.encode(), partition=0, headers=[("pf", pf)])
    assert raw.flush(30) == 0
    out = tmp_path / "out"
    run_sink(spark, kafka.bootstrap, topic, str(out), str(tmp_path / "ckpt"))
    log = read_log(str(out))
    assert values(log) == [f"s{s}" for s in range(150) if s != 50]
    assert seqs_of(log, pid) == [s for s in range(150) if s != 50]
    rejects = read_rejects(str(out))
    assert dict(zip(values(rejects), rejects["verdict"].to_pylist(), strict=True)) == {
        "dup-s10": "DUPLICATE",
        "dup-s49": "DUPLICATE",
        "fence": "FENCE",
        "zombie-s100": "FENCED",
        "dup-s120": "DUPLICATE",
    }
    assert gap_rows(out) == [("lost", pid, 50, 50, 49, 52)]  # offsets 50, 51 are the dups


def test_a_new_sink_started_at_latest_adopts_producers_mid_stream(
    spark: Any, kafka: Any, leased: Leased, tmp_path: Path
) -> None:
    topic = leased.topic
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = start_sink(
        spark,
        kafka.bootstrap,
        topic,
        str(out),
        str(ckpt),
        available_now=False,
        trigger_seconds=0.5,
        starting_offsets="latest",
        sink_options=leased.adopt,
    )
    try:
        # The source writes its initial (latest) offsets when the query starts.
        deadline = time.monotonic() + 120
        while not (ckpt / "sources" / "0" / "0").exists():
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.2)
        leased.produce(100, 100)
        while read_log(str(out)).num_rows < 100:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.5)
    finally:
        query.stop()
    log = read_log(str(out))
    assert values(log) == [f"e{i}" for i in range(100, 200)]
    assert seqs_of(log, leased.pid) == list(range(100, 200))
    assert gap_rows(out) == [
        ("offsets", None, None, None, None, 100),
        ("head", leased.pid, 0, 99, None, 100),
    ]


def test_retention_while_the_sink_is_stopped(
    spark: Any, kafka: Any, leased: Leased, tmp_path: Path
) -> None:
    """By default the next run refuses before Spark starts (exit 3, naming topic, partition,
    range and the option); the library's query fails the same way; with the option it continues
    and reports the gap."""
    topic = leased.topic
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt))
    leased.produce(100, 100)
    delete_records_before(kafka.bootstrap, topic, 150)

    result, _ = run_sink_cli(
        *sink_args(kafka.bootstrap, topic, out, ckpt),
    )
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert f"{topic}[0] offsets 100..149" in line and "--allow-data-loss" in line

    with pytest.raises(DataLost, match="--allow-data-loss") as failed:
        run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt))
    assert not failed.value.retriable
    # Spark's Kafka source stopped the query (not the CLI's check before Spark starts), and the
    # message names the JVM's own cause in one line.
    assert "retention overtook the sink" in str(failed.value), str(failed.value)[:500]
    assert "OffsetOutOfRange" in str(failed.value) or "failOnDataLoss" in str(failed.value)
    assert read_log(str(out)).num_rows == 100

    summary = run_sink(
        spark,
        kafka.bootstrap,
        topic,
        str(out),
        str(ckpt),
        allow_data_loss=True,
        sink_options=leased.adopt,
    )
    log = read_log(str(out))
    assert values(log) == [f"e{i}" for i in (*range(100), *range(150, 200))]
    assert gap_rows(out) == [
        ("offsets", None, None, None, 99, 150),
        ("lost", leased.pid, 100, 149, None, 150),
    ]
    assert summary.appended == 50


def test_gap_resolution_keeps_up_with_a_live_producer(
    spark: Any, kafka: Any, new_topic: Any, lease_server: Any, tmp_path: Path
) -> None:
    """A sink started late keeps a producer that is still writing: every record after the
    horizon lands once and in order while the producer keeps sending across batches."""
    topic = new_topic(partitions=2)
    client = LeaseClient(lease_server.address)
    stop = threading.Event()
    sent = [0]

    def write() -> None:
        with IdempotentProducer(ProducerConfig(kafka.bootstrap), client) as prod:
            while not stop.is_set() or sent[0] < 400:
                prod.produce(topic, f"v{sent[0]}".encode(), key=str(sent[0] % 7))
                sent[0] += 1
                if sent[0] % 50 == 0:
                    prod.flush()
                    time.sleep(0.05)
            prod.flush()

    writer = threading.Thread(target=write)
    writer.start()
    while sent[0] < 150:
        time.sleep(0.05)
    delete_records_before(kafka.bootstrap, topic, 20, partition=0)
    delete_records_before(kafka.bootstrap, topic, 20, partition=1)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    options = authority(lease_server)
    run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt), sink_options=options)
    stop.set()
    writer.join(60)
    client.close()
    run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt), sink_options=options)
    log = read_log(str(out))
    assert read_rejects(str(out)).num_rows == 0
    for partition in (0, 1):
        part = log.filter(pa.compute.equal(log["partition"], partition))
        seqs = part["seq"].to_pylist()
        assert seqs == sorted(set(seqs)) and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert len(set(values(log))) == log.num_rows
    assert {(r[0], r[2]) for r in gap_rows(out)} == {("offsets", None), ("head", 0)}
