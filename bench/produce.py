"""``pidfence bench produce``: producer throughput with and without ``pf`` headers.

One ZooKeeper, one Kafka broker and one lease server are started for the run and stopped after.
Three contenders send the same records (100-byte values, unkeyed, explicit partition round-robin
over 4 partitions) with the same librdkafka settings (``acks=all``, ``linger.ms=5``), each timed
from its first ``produce`` until ``flush()`` returns (every record acknowledged):

1. plain confluent-kafka, no headers, librdkafka idempotence off;
2. confluent-kafka with librdkafka idempotence on (``enable.idempotence=true``), no headers;
   2b. the same plus one constant header of the pf header's size (what any header costs
   confluent-kafka, without pidfence's own work);
3. ``IdempotentProducer`` with its defaults (librdkafka idempotence on, a delivery report per
   record, no ledger);
4. ``IdempotentProducer`` with ``success_reports=False`` (librdkafka reports failures only, as
   plain confluent-kafka without a delivery callback effectively does; errors still raise).

Contenders run interleaved for several rounds in the same run and the best round of each is
kept, so a burst of load from elsewhere on the machine does not decide the ratio.
"""

from __future__ import annotations

import logging
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
from rich.progress import Progress

from pidfence.benchkit import BenchReport
from pidfence.pid_allocator import LeaseClient, LeaseServerThread
from pidfence.producer import IdempotentProducer, ProducerConfig
from pidfence.services import KafkaCluster, ZooKeeperEnsemble, create_topic, new_chroot
from pidfence.wire import PF_HEADER_KEY, decode_pf

PARTITIONS = 4
VALUE_SIZE = 100
LINGER_MS = 5
PLAIN = "plain confluent-kafka (no headers)"
LIBRDKAFKA = "confluent-kafka + librdkafka idempotence"
HEADER_ONLY = "confluent-kafka + idempotence + constant 12-byte header"
OURS = "IdempotentProducer (pf headers)"
OURS_NO_RDK = "IdempotentProducer, success_reports=False"


def _chroot(hosts: str) -> str:
    return new_chroot(hosts, "/bench-produce")


def _plain(
    bootstrap: str, idempotence: bool, header: bytes | None = None
) -> Callable[[str, list[bytes]], tuple[float, float]]:
    def send(topic: str, values: list[bytes]) -> tuple[float, float]:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": LINGER_MS,
                "enable.idempotence": idempotence,
            }
        )
        # Prime: connections up and (with idempotence) the producer id acquired before timing.
        producer.produce(topic, b"prime", partition=0)
        producer.flush(60)
        produce = producer.produce
        poll = producer.poll
        started, cpu = time.perf_counter(), time.process_time()
        for i, value in enumerate(values):
            while True:
                try:
                    if header is None:
                        produce(topic, value, partition=i % PARTITIONS)
                    else:
                        produce(topic, value, partition=i % PARTITIONS, headers=[("pf", header)])
                    break
                except BufferError:
                    poll(0.05)
        left = producer.flush(120)
        elapsed = (time.perf_counter() - started, time.process_time() - cpu)
        assert left == 0, f"{left} records not acknowledged"
        return elapsed

    return send


def _ours(
    bootstrap: str, lease_address: str, success_reports: bool
) -> Callable[[str, list[bytes]], tuple[float, float]]:
    def send(topic: str, values: list[bytes]) -> tuple[float, float]:
        config = ProducerConfig(bootstrap, linger_ms=LINGER_MS, success_reports=success_reports)
        with LeaseClient(lease_address) as client:
            producer = IdempotentProducer(config, client)
            producer.produce(topic, b"prime", partition=0)
            producer.flush(60)
            produce = producer.produce
            started, cpu = time.perf_counter(), time.process_time()
            for i, value in enumerate(values):
                produce(topic, value, partition=i % PARTITIONS)
            left = producer.flush(120)
            elapsed = (time.perf_counter() - started, time.process_time() - cpu)
            producer.close()
        assert left == 0, f"{left} records not acknowledged"
        return elapsed

    return send


def _header_bytes(bootstrap: str, topic: str, sample: int) -> tuple[float, float]:
    """Mean ``pf`` value bytes and mean bytes the header adds to a Kafka v2 record."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
    sizes: list[int] = []
    try:
        while len(sizes) < sample:
            msg = consumer.poll(10.0)
            if msg is None:
                break
            raw = dict(msg.headers() or [])[PF_HEADER_KEY]
            assert isinstance(raw, bytes)
            decode_pf(raw)
            sizes.append(len(raw))
    finally:
        consumer.close()
    value = statistics.fmean(sizes)
    # A v2 record header is varint(key length) + key + varint(value length) + value; the
    # header-count varint is 1 byte with or without headers. All lengths here are < 64.
    return value, value + 1 + len(PF_HEADER_KEY) + 1


def run(quick: bool, progress: Progress) -> BenchReport:
    """Measure the three contenders; ``quick`` sends fewer records and rounds."""
    records = 100_000 if quick else 200_000
    rounds = 3 if quick else 5
    values = [(f"{i:012d}".encode() * 9)[:VALUE_SIZE] for i in range(records)]
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    task = progress.add_task("produce bench: starting services", total=5 * rounds)
    times: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    last_ours_topic = ""
    with ZooKeeperEnsemble(1) as zk, KafkaCluster(1) as kafka:
        lease = LeaseServerThread(_chroot(zk.hosts)).start()
        try:
            contenders: list[tuple[str, Callable[[str, list[bytes]], tuple[float, float]]]] = [
                (PLAIN, _plain(kafka.bootstrap, False)),
                (LIBRDKAFKA, _plain(kafka.bootstrap, True)),
                (
                    HEADER_ONLY,
                    _plain(
                        kafka.bootstrap, True, b"\x95\x01\xcd\x01\x00\xce\x12\x34\x56\x78\x05\x00"
                    ),
                ),
                (OURS, _ours(kafka.bootstrap, lease.address, True)),
                (OURS_NO_RDK, _ours(kafka.bootstrap, lease.address, False)),
            ]
            # Warm-up: JIT of the broker's request path, connections, first segment files.
            warm = create_topic(kafka.bootstrap, f"warm-{uuid.uuid4().hex[:6]}", PARTITIONS)
            for _, send in contenders:
                send(warm, values[: records // 10])
            for r in range(rounds):
                for name, send in contenders:
                    progress.update(task, description=f"round {r + 1}: {name}")
                    topic = create_topic(
                        kafka.bootstrap, f"bench-{uuid.uuid4().hex[:8]}", PARTITIONS
                    )
                    wall, cpu = send(topic, values)
                    times.setdefault(name, []).append(wall)
                    cpus.setdefault(name, []).append(cpu)
                    if name == OURS:
                        last_ours_topic = topic
                    progress.advance(task)
            pf_value, pf_wire = _header_bytes(kafka.bootstrap, last_ours_topic, 2_000)
        finally:
            lease.stop()
    plain = records / min(times[PLAIN])
    plain_cpu = min(cpus[PLAIN])
    rows: list[dict[str, Any]] = []
    for name in (PLAIN, LIBRDKAFKA, HEADER_ONLY, OURS, OURS_NO_RDK):
        best = records / min(times[name])
        rows.append(
            {
                "contender": name,
                "records": records,
                "msgs_per_s": best,
                "msgs_per_s_median": records / statistics.median(times[name]),
                "ratio_to_plain": best / plain,
                "cpu_us_per_record": min(cpus[name]) * 1e6 / records,
                "cpu_ratio_to_plain": plain_cpu / min(cpus[name]),
                "header_bytes_per_record": pf_wire if name in (OURS, OURS_NO_RDK) else 0.0,
            }
        )
    return BenchReport(
        title=f"Producer throughput: {VALUE_SIZE}-byte values to one local broker",
        columns=[
            "contender",
            "records",
            "msgs_per_s",
            "msgs_per_s_median",
            "ratio_to_plain",
            "cpu_us_per_record",
            "cpu_ratio_to_plain",
            "header_bytes_per_record",
        ],
        rows=rows,
        notes=[
            "Target: IdempotentProducer >= 0.8x plain confluent-kafka (0.9x is the goal).",
            f"Same settings for all: acks=all, linger.ms={LINGER_MS}, {PARTITIONS} partitions, "
            "explicit partition i % 4, one broker (RF 1) on the same 2-core machine.",
            f"msgs_per_s: best of {rounds} interleaved rounds (produce start to flush return); "
            "msgs_per_s_median: their median.",
            "cpu_us_per_record: CPU time of the producing process (Python and librdkafka "
            "threads) per record, best round; cpu_ratio_to_plain = plain's CPU / this one's, "
            "the throughput ratio one core would give, less sensitive to load from elsewhere.",
            f"pf header value: {pf_value:.1f} bytes on average (msgpack [1, pid, generation, "
            f"seq, flags]); on the wire {pf_wire:.1f} bytes per record with the key 'pf' and "
            "the two length varints.",
        ],
        params={"records": records, "rounds": rounds, "value_size": VALUE_SIZE},
    )
