"""Issue 22 (the sink's half) and issue 26 (signed adoption) with real Kafka, lease servers, Spark.

Each test is one "Done when" claim, against what an attacker with write access to the raw topic
can really do:

* a genuine placed ``pfc`` copied from partition 0 onto the topic's three partitions and another
  topic (a FENCE at seq 2^62, and the copied record itself at seq 0) admits nothing: one sink run
  over both topics appends every legit record once, in order, and none of the attacker's;
* a back-dated record carrying a certificate whose lease has ended is ``FORGED`` (expired) on a
  ``LogAppendTime`` topic, though its CreateTime says it was written before the end;
* in per-record mode (``pidfence sink --record-mac-secret``) a record injected at a live
  producer's next seq, without ``pfm``, with a random one or with one copied from another
  record, is ``FORGED`` (reason ``mac``);
* with signing on, a sink that first reads a producer past its start (retention trimmed the head)
  adopts it at its first re-stamped record whose statement verifies; the records before it are
  ``UNVERIFIED``, later ones append.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.demo.topic import RAW_TOPIC_CONFIG
from pidfence.pid_allocator import LeaseClient
from pidfence.producer import IdempotentProducer, ProducerConfig
from pidfence.services.lease_server import LeasePki
from pidfence.spark_sink import SinkRunSummary, read_log, read_rejects, run_sink
from pidfence.spark_sink.batch_report import summarise
from pidfence.wire import CERT_HEADER_KEY, FLAG_FENCE, PF_HEADER_KEY, decode_pf, encode_pf
from pidfence.wire.mac import MAC_HEADER_KEY, RECORD_MAC_BYTES
from pidfence.wire.statement import encode_placed_pfc
from tests.fixtures.commands import sink_args
from tests.fixtures.lease import LeaseServerFactory
from tests.integration.test_cli_sink import run_sink as run_sink_cli
from tests.integration.test_gaps import delete_records_before, gap_rows, values
from tests.integration.test_sink_signed import raw

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: ``timestampType`` of a record whose time the broker set (Spark's Kafka source column).
LOG_APPEND_TIME = 1


def read_partition(bootstrap: str, topic: str, partition: int) -> list[Message]:
    """Every record of (topic, partition) now in Kafka, in offset order, as any consumer reads
    them (what an attacker with read access sees)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"attacker-{topic}",
            "enable.auto.commit": False,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        consumer.assign([TopicPartition(topic, partition, low)])
        got: list[Message] = []
        deadline = time.monotonic() + 60
        while len(got) < high - low:
            assert time.monotonic() < deadline, f"read {len(got)} of {high - low} records"
            msg = consumer.poll(1.0)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg)
        return got
    finally:
        consumer.close()


def headers_of(msg: Message) -> dict[str, bytes]:
    """A record's headers by name."""
    return {name: bytes(value) for name, value in msg.headers() or [] if value is not None}


@dataclass(frozen=True)
class Injected:
    """One record the attacker writes with a plain Kafka producer."""

    topic: str
    partition: int
    value: bytes
    headers: Sequence[tuple[str, bytes]]
    key: bytes | None = None
    #: CreateTime the attacker sets (None: now).
    timestamp_ms: int | None = None


def inject(bootstrap: str, records: Sequence[Injected]) -> None:
    """Write ``records`` in order and wait until Kafka acknowledged every one."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[Any] = []
    for rec in records:
        producer.produce(
            rec.topic,
            value=rec.value,
            key=rec.key,
            partition=rec.partition,
            headers=list(rec.headers),
            timestamp=rec.timestamp_ms or 0,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(30) == 0 and not errors, errors


def produce(
    producer: IdempotentProducer, topic: str, partition: int, labels: Sequence[str]
) -> None:
    """``labels`` as values through the real producer to one partition, acknowledged."""
    for label in labels:
        producer.produce(topic, label.encode(), partition=partition)
    producer.flush()


def by_place(table: pa.Table, column: str = "value") -> dict[tuple[str, int], list[Any]]:
    """``column`` per (topic, partition), in the table's order (values decoded)."""
    out: dict[tuple[str, int], list[Any]] = {}
    for row in table.select(["topic", "partition", column]).to_pylist():
        cell = row[column]
        out.setdefault((row["topic"], row["partition"]), []).append(
            cell.decode() if isinstance(cell, bytes) else cell
        )
    return out


def verdicts(table: pa.Table) -> dict[str, str]:
    """Rejected value -> verdict."""
    return dict(zip(values(table), table["verdict"].to_pylist(), strict=True))


@pytest.fixture
def signing_server(lease_server_factory: LeaseServerFactory, lease_pki: LeasePki) -> Any:
    """A lease server that signs every lease (version 2 certificates naming the producer key)."""
    return lease_server_factory(signing_key=lease_pki.signing_key)


@pytest.fixture
def lease_client(signing_server: Any) -> Iterator[LeaseClient]:
    client = LeaseClient(signing_server.address)
    yield client
    client.close()


def run_signed(
    spark: Any, bootstrap: str, topics: str, tmp_path: Path, pki: LeasePki
) -> tuple[Path, SinkRunSummary]:
    """One sink run over ``topics`` into ``tmp_path/out`` that checks lease certificates against
    ``pki``'s public key: the output folder and what the run committed."""
    out = tmp_path / "out"
    options = {"leasePublicKey": str(pki.public_key)}
    summary = run_sink(
        spark, bootstrap, topics, str(out), str(tmp_path / "ckpt"), sink_options=options
    )
    return out, summary


def test_a_certificate_copied_to_other_partitions_and_a_topic_admits_nothing(
    spark: Any,
    kafka: Any,
    new_topic: Any,
    lease_client: LeaseClient,
    lease_pki: LeasePki,
    tmp_path: Path,
) -> None:
    """Issue 22 case 2: was a FENCE at 2^62 silencing the producer there (its records
    ``DUPLICATE``) and a copied seq 0 appended in place of the producer's own."""
    topic, other = new_topic(partitions=3), new_topic(partitions=1)
    with IdempotentProducer(ProducerConfig(kafka.bootstrap), lease_client) as producer:
        produce(producer, topic, 0, ["t0-a0", "t0-a1", "t0-a2"])
        first = headers_of(read_partition(kafka.bootstrap, topic, 0)[0])
        pf = decode_pf(first[PF_HEADER_KEY])
        assert (pf.seq, CERT_HEADER_KEY in first) == (0, True)
        stolen = first[CERT_HEADER_KEY]
        fence = encode_pf(pf.pid, pf.generation, 2**62, FLAG_FENCE)
        # A FENCE on the three partitions and the other topic; the copied seq 0 record (pf and
        # pfc as they are) where the producer has not written yet.
        targets = [(topic, 1), (topic, 2), (other, 0)]
        attacks = {
            f"fence-{t}-{p}": Injected(
                t, p, f"fence-{t}-{p}".encode(), [(PF_HEADER_KEY, fence), (CERT_HEADER_KEY, stolen)]
            )
            for t, p in [(topic, 0), *targets]
        }
        attacks |= {
            f"copy-{t}-{p}": Injected(
                t,
                p,
                f"copy-{t}-{p}".encode(),
                [(PF_HEADER_KEY, first[PF_HEADER_KEY]), (CERT_HEADER_KEY, stolen)],
            )
            for t, p in targets
        }
        inject(kafka.bootstrap, list(attacks.values()))
        # The producer goes on everywhere, its first record on each new place after the attack.
        legit = {(topic, 0): [f"t0-a{i}" for i in range(3, 8)]}
        legit |= {
            (t, p): [f"{'t' if t == topic else 'u'}{p}-a{i}" for i in range(5)] for t, p in targets
        }
        for (t, p), labels in legit.items():
            produce(producer, t, p, labels)
    legit[(topic, 0)] = [f"t0-a{i}" for i in range(8)]

    out, summary = run_signed(spark, kafka.bootstrap, f"{topic},{other}", tmp_path, lease_pki)
    log = read_log(str(out))
    assert by_place(log) == legit
    assert by_place(log, "seq") == {place: list(range(len(v))) for place, v in legit.items()}
    assert set(log["pid"].to_pylist()) == {pf.pid}
    # On the producer's own partition a FENCE of its live generation needs no proof and moves
    # nothing (DESIGN §4: gE = g; highwater kept): its later records appended above. Elsewhere
    # it would create an entry, so it must prove its place, and cannot.
    home = f"fence-{topic}-0"
    assert verdicts(read_rejects(str(out))) == dict.fromkeys(attacks, "FORGED") | {home: "FENCE"}
    assert summary.forged == {"other_place": len(attacks) - 1}


def test_a_back_dated_expired_certificate_is_forged_on_a_log_append_time_topic(
    spark: Any,
    kafka: Any,
    new_topic: Any,
    lease_server_factory: LeaseServerFactory,
    lease_pki: LeasePki,
    tmp_path: Path,
) -> None:
    """Issue 22 case 3: was accepted as a new producer (expiry judged at the record's CreateTime).

    The lease's own statements are genuine, signed for exactly the place they are written to:
    the only thing wrong with the attacker's records is that the lease has ended. A record of the
    same lease written while it was live is appended (the certificate is good)."""
    topic = new_topic(partitions=2, config=dict(RAW_TOPIC_CONFIG))
    server = lease_server_factory(signing_key=lease_pki.signing_key, lifetime_ms=3_000)
    signer = Ed25519PrivateKey.generate()
    with LeaseClient(server.address) as client:
        lease = client.lease(key=raw(signer))
    pid, gen, cert = lease.pid, lease.generation, lease.cert
    assert cert is not None

    def placed(partition: int, seq: int, flags: int = 0) -> list[tuple[str, bytes]]:
        pfc = encode_placed_pfc(cert, signer, topic, partition, pid, gen, seq, flags)
        return [(PF_HEADER_KEY, encode_pf(pid, gen, seq, flags)), (CERT_HEADER_KEY, pfc)]

    inject(kafka.bootstrap, [Injected(topic, 1, b"live", placed(1, 0))])
    while time.time() * 1000 <= lease.expire_ms:  # the state: the lease has ended
        time.sleep(0.1)
    back_dated = lease.expire_ms - 1_000
    inject(
        kafka.bootstrap,
        [
            Injected(topic, 0, b"expired-s0", placed(0, 0), timestamp_ms=back_dated),
            Injected(topic, 0, b"expired-fence", placed(0, 1, FLAG_FENCE), timestamp_ms=back_dated),
        ],
    )

    out, summary = run_signed(spark, kafka.bootstrap, topic, tmp_path, lease_pki)
    assert values(read_log(str(out))) == ["live"]
    rejects = read_rejects(str(out))
    assert verdicts(rejects) == {"expired-s0": "FORGED", "expired-fence": "FORGED"}
    assert summary.forged == {"expired": 2}
    # The broker's append time, not the writer's back-dated CreateTime, is what was judged.
    assert set(rejects["timestampType"].to_pylist()) == {LOG_APPEND_TIME}
    assert min(t.timestamp() * 1000 for t in rejects["timestamp"].to_pylist()) > lease.expire_ms


def test_records_injected_at_the_next_seq_are_forged_in_per_record_mode(
    kafka: Any,
    new_topic: Any,
    lease_server_factory: LeaseServerFactory,
    lease_pki: LeasePki,
    tmp_path: Path,
) -> None:
    """Per-record mode through ``pidfence sink --record-mac-secret`` as a user starts it."""
    topic = new_topic(partitions=1)
    server = lease_server_factory(record_mac_secret=lease_pki.record_mac_secret, insecure=True)
    with (
        LeaseClient(server.address) as client,
        IdempotentProducer(ProducerConfig(kafka.bootstrap), client) as producer,
    ):
        produce(producer, topic, 0, [f"e{i}" for i in range(5)])
        seen = read_partition(kafka.bootstrap, topic, 0)
        assert all(MAC_HEADER_KEY in headers_of(m) for m in seen)
        pf = decode_pf(headers_of(seen[-1])[PF_HEADER_KEY])
        nxt = encode_pf(pf.pid, pf.generation, pf.seq + 1)
        donor = seen[2]
        inject(
            kafka.bootstrap,
            [
                Injected(topic, 0, b"no-pfm", [(PF_HEADER_KEY, nxt)]),
                Injected(
                    topic,
                    0,
                    b"random-pfm",
                    [(PF_HEADER_KEY, nxt), (MAC_HEADER_KEY, os.urandom(RECORD_MAC_BYTES))],
                ),
                Injected(
                    topic,
                    0,
                    donor.value(),
                    key=donor.key(),
                    headers=[
                        (PF_HEADER_KEY, nxt),
                        (MAC_HEADER_KEY, headers_of(donor)[MAC_HEADER_KEY]),
                    ],
                ),
            ],
        )
        produce(producer, topic, 0, [f"e{i}" for i in range(5, 10)])

    out = tmp_path / "out"
    result, _ = run_sink_cli(
        *sink_args(kafka.bootstrap, topic, out, tmp_path / "ckpt"),
        "--master",
        "local[2]",
        "--record-mac-secret",
        str(lease_pki.record_mac_secret),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "FORGED 3 (mac 3)" in result.stdout, result.stdout
    log = read_log(str(out))
    assert values(log) == [f"e{i}" for i in range(10)]
    assert log["seq"].to_pylist() == list(range(10))
    rejects = read_rejects(str(out))
    assert values(rejects) == ["no-pfm", "random-pfm", "e2"]
    assert rejects["verdict"].to_pylist() == ["FORGED"] * 3
    assert rejects["seq"].to_pylist() == [pf.seq + 1] * 3
    assert rejects["pid"].to_pylist() == [pf.pid] * 3
    assert [sorted(h["key"] for h in hs) for hs in rejects["headers"].to_pylist()] == [
        [PF_HEADER_KEY],
        [PF_HEADER_KEY, MAC_HEADER_KEY],
        [PF_HEADER_KEY, MAC_HEADER_KEY],
    ]
    assert summarise(str(out)).forged == {"mac": 3}


def test_a_late_sink_adopts_a_signed_producer_at_its_first_restamped_record(
    tmp_path: Path,
    spark: Any,
    kafka: Any,
    new_topic: Any,
    lease_client: LeaseClient,
    lease_pki: LeasePki,
    signing_server: Any,
) -> None:
    """Issue 26 with signing on: retention trimmed the head (and the producer's first ``pfc``)
    before the sink first read the partition. The producer's clock is stepped over its
    ``restamp_ms`` (1 s, the default) so where the re-stamp falls does not depend on load.
    The lease server vouches for the pid (issue 35: without one the sink adopts nothing)."""
    topic = new_topic(partitions=1)
    now = [int(time.time() * 1000)]
    config = ProducerConfig(kafka.bootstrap)
    with IdempotentProducer(config, lease_client, clock=lambda: now[0]) as producer:
        produce(producer, topic, 0, [f"e{i}" for i in range(120)])
        now[0] += config.restamp_ms
        produce(producer, topic, 0, [f"e{i}" for i in range(120, 150)])
        pid = producer.checkpoint().pid
        stamped = [
            m.offset()
            for m in read_partition(kafka.bootstrap, topic, 0)
            if CERT_HEADER_KEY in headers_of(m)
        ]
        assert stamped == [0, 120]
        delete_records_before(kafka.bootstrap, topic, 50)

        out, ckpt = tmp_path / "out", tmp_path / "ckpt"
        options = {
            "leasePublicKey": str(lease_pki.public_key),
            "leaseServer": signing_server.address,
        }
        run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt), sink_options=options)
        log = read_log(str(out))
        assert values(log) == [f"e{i}" for i in range(120, 150)]
        assert log["seq"].to_pylist() == list(range(120, 150))
        rejects = read_rejects(str(out))
        assert values(rejects) == [f"e{i}" for i in range(50, 120)]
        assert set(rejects["verdict"].to_pylist()) == {"UNVERIFIED"}
        assert gap_rows(out) == [
            ("offsets", None, None, None, None, 50),
            ("head", pid, 0, 119, None, 120),
        ]
        # Later records of the adopted producer append (no pfc on them: not a re-stamp yet).
        produce(producer, topic, 0, [f"e{i}" for i in range(150, 160)])
    run_sink(spark, kafka.bootstrap, topic, str(out), str(ckpt), sink_options=options)
    assert values(read_log(str(out))) == [f"e{i}" for i in range(120, 160)]
    assert read_rejects(str(out)).num_rows == 70
