"""``produce`` on its inline path and ``produce_many``: the same records as the general path.

The producer stamps a partition inline (no ``Sequencer.stamp`` call, no checks) once a record of
it went through the general path under the current sequencer and nothing (skip, ``pfc``, user
headers or callbacks, a tracked record) needs that path again. These tests hold both paths to
the same output: the Kafka log of a producer on the inline path equals, record for record and
byte for byte, the log of one forced onto the general path (a resend buffer makes every record
tracked), and ``produce_many`` equals a loop of ``produce``, also when a rollover, a fence or an
error falls in the middle of a batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidfence.ledger import read_ledger
from pidfence.producer import (
    BatchMismatch,
    DeliveryFailed,
    DrainFailed,
    IdempotentProducer,
    KafkaRefused,
    LeaseExpired,
    LeaseState,
    ProducerCheckpoint,
    ProducerConfig,
    ProducerFenced,
    Sequencer,
    ValueTooLarge,
)
from pidfence.wire import SEQ_LIMIT, decode_pf, encode_pf
from pidfence.wire.cert import CERT_HEADER_KEY
from tests.unit.producer_kit import LIFETIME, Rig
from tests.unit.test_producer_lineage import ROLL_AT, SharedRig

INLINE = ProducerConfig("127.0.0.1:9", sticky_records=3)  # nothing tracked: inline path
GENERAL = replace(INLINE, resend_buffer=4)  # every record tracked: general path only


class Ticking(list[bytes]):
    """Values that call ``hook(i)`` whenever value ``i`` is read (indexed or iterated), so a
    clock or fault moves at an exact record of a batch (and of the loop it is compared with)."""

    def __init__(self, values: list[bytes], hook: Any) -> None:
        super().__init__(values)
        self.hook = hook

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, int):
            self.hook(i)
        return super().__getitem__(i)

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self[i]


def at(index: int, action: Any) -> Any:
    def hook(i: int) -> None:
        if i == index:
            action()

    return hook


def wire(rig: Rig) -> list[tuple[Any, ...]]:
    """Everything a record carries to Kafka, in log order."""
    assert rig.kafka is not None
    return [(m.topic(), m.partition(), m.key(), m.value(), m.headers()) for m in rig.kafka.log]


def loop(producer: IdempotentProducer, topic: str, values: Any, keys: Any, partition: Any) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value, None if keys is None else keys[i], partition)


# ---- the inline path and produce_many against the general path ----------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("one"),
            st.sampled_from(["t", "u"]),
            st.integers(0, 3),
            st.sampled_from([None, b"k1", "k2"]),
            st.sampled_from([None, 0]),
            st.booleans(),
        ),
        st.tuples(
            st.just("many"),
            st.sampled_from(["t", "u"]),
            st.integers(0, 40),
            st.booleans(),
            st.sampled_from([None, 0]),
        ),
        st.tuples(st.just("roll")),
        st.tuples(st.just("flush")),
    ),
    max_size=25,
)


def run(rig: Rig, script: list[tuple[Any, ...]], batches: bool) -> list[tuple[Any, ...]]:
    producer = rig.producer()
    n = 0
    for op in script:
        if op[0] == "one":
            _, topic, size, key, partition, header = op
            value = b"v%d" % n + b"x" * size
            extra = [("trace", b"%d" % n)] if header else None
            producer.produce(topic, value, key, partition, headers=extra)
            n += 1
        elif op[0] == "many":
            _, topic, count, keyed, partition = op
            values = [b"m%d" % (n + i) for i in range(count)]
            keys = [b"k%d" % ((n + i) % 5) for i in range(count)] if keyed else None
            n += count
            if batches:
                assert producer.produce_many(topic, values, keys, partition) == count
                assert producer.batch_done == count
            else:
                loop(producer, topic, values, keys, partition)
        elif op[0] == "roll":
            rig.now += ROLL_AT  # the next record rolls over first
        else:
            producer.flush()
    producer.close()
    return wire(rig)


@settings(max_examples=150, deadline=None)
@given(script=ops, sign=st.booleans())
def test_inline_path_and_batches_put_the_same_records_on_the_wire(
    script: list[tuple[Any, ...]], sign: bool
) -> None:
    """Seqs, partitions (keyed, sticky, explicit), ``pfc`` on the first record of each
    (pid, generation, partition) and user headers are identical on both paths, across
    rollovers; ``produce_many`` is a loop of ``produce``."""
    inline, general = Rig(), Rig()
    inline.config, general.config = INLINE, GENERAL
    inline.lease.sign = general.lease.sign = sign
    assert run(inline, script, batches=True) == run(general, script, batches=False)


@pytest.mark.parametrize("first", [0, 100, 126, 254, 65_534, 2**32 - 2, SEQ_LIMIT - 3])
def test_inline_headers_are_byte_identical_to_encode_pf(first: int) -> None:
    """Each msgpack width of seq (fixint, uint8, uint16, uint32, uint64) and its edges."""
    rig = Rig()
    rig.config = INLINE
    first_producer = rig.producer()
    first_producer.flush()
    base = first_producer.checkpoint()
    cp = replace(base, next_seq={("t", 0): first, ("t", 1): first, ("u", 0): first})
    producer = rig.resume(cp)
    count = min(300, SEQ_LIMIT - first)  # from 0: across the 128 and 256 edges
    for _ in range(count):
        producer.produce("t", b"a", partition=0)
    producer.produce_many("t", [b"b"] * count, partition=1)
    producer.produce_many("u", [b"c"] * count)  # sticky: "u" has one partition
    producer.flush()
    assert rig.kafka is not None
    data = [m for m in rig.kafka.log if m.value()]
    expected = [encode_pf(100, 41, first + i) for i in range(count)] * 3
    assert [m.headers()[0][1] for m in data] == expected


@given(st.integers(0, SEQ_LIMIT - 1))
def test_sequencer_header_is_encode_pf_for_every_seq(seq: int) -> None:
    assert Sequencer(5, 3, 0).header(seq) == encode_pf(5, 3, seq)


def test_sequencer_header_table_and_uint16_range_are_encode_pf() -> None:
    """The precomputed headers (seqs 0..255: fixint, then uint8) and the whole uint16 range,
    byte for byte, for a small and a wide pid and generation."""
    for pid, generation in ((5, 3), (2**40, 70_000)):
        seq = Sequencer(pid, generation, 0)
        assert len(seq.fixed) == 256
        for n in range(0x10001):
            assert seq.header(n) == encode_pf(pid, generation, n)


def test_sequencer_header_refuses_seq_past_the_limit() -> None:
    with pytest.raises(OverflowError):
        Sequencer(5, 3, 0).header(SEQ_LIMIT)


# ---- produce_many: rollover, fencing and errors in the middle of a batch -----------------


def test_rollover_in_the_middle_of_a_batch_rolls_before_that_record(
    tmp_path: Path,
) -> None:
    """The record that finds the rollover due goes out under the successor; ``on_roll`` sees
    its index in ``batch_done``; the ledger has every acknowledged record, seqs contiguous."""
    rig = SharedRig()
    rig.config = INLINE
    ledger = tmp_path / "sent.jsonl"
    seen: list[tuple[int, int]] = []
    producer: IdempotentProducer | None = None

    def save(cp: ProducerCheckpoint) -> None:
        assert producer is not None
        seen.append((cp.pid, producer.batch_done))

    def due() -> None:
        rig.now += ROLL_AT

    producer = rig.producer(ledger=ledger, on_roll=save)
    values = Ticking([b"z%d" % i for i in range(30)], at(17, due))
    events = [f"e{i}" for i in range(30)]
    assert producer.produce_many("t", values, partition=1, event_ids=events) == 30
    producer.close()
    assert seen == [(101, 17)]
    pfs = [decode_pf(dict(m.headers())["pf"]) for m in rig.log]
    assert [(pf.pid, pf.seq) for pf in pfs] == [(100, i) for i in range(17)] + [
        (101, i) for i in range(13)
    ]
    entries = list(read_ledger([ledger]))
    assert [(e.pid, e.seq, e.event) for e in entries] == [
        (pf.pid, pf.seq, f"e{i}") for i, pf in enumerate(pfs)
    ]
    assert rig.appended() == Counter(b"z%d" % i for i in range(30))


@pytest.mark.parametrize("config", [INLINE, GENERAL], ids=["inline", "general"])
def test_batch_rollover_matches_a_produce_loop(config: ProducerConfig) -> None:
    logs = []
    for batches in (True, False):
        rig = Rig()
        rig.config = config
        rig.lease.sign = True
        producer = rig.producer()
        values = Ticking(
            [b"z%d" % i for i in range(20)], at(9, lambda r=rig: setattr(r, "now", r.now + ROLL_AT))
        )
        if batches:
            producer.produce_many("t", values)
        else:
            loop(producer, "t", values, None, None)
        producer.close()
        assert producer.rollovers == 1
        logs.append(wire(rig))
    assert logs[0] == logs[1]
    certs = [h for *_, headers in logs[0] for h in headers if h[0] == CERT_HEADER_KEY]
    # Sticky by 3 over 3 partitions: both pids wrote every partition, each certified once.
    assert len(certs) == 6


def test_batch_fenced_mid_way_stops_at_that_record(tmp_path: Path) -> None:
    """Another owner bumped the pid: the roll due at record 5 is refused, ProducerFenced as
    from ``produce``; records 0..4 were sent, nothing after, and the producer stays FENCED."""
    rig = SharedRig()
    rig.config = INLINE
    producer = rig.producer()

    def zombie() -> None:
        rig.lease.latest[100] = 41  # a resumer's bump
        rig.now += ROLL_AT

    values = Ticking([b"z%d" % i for i in range(10)], at(5, zombie))
    with pytest.raises(ProducerFenced):
        producer.produce_many("t", values, partition=0)
    assert producer.batch_done == 5 and producer.state is LeaseState.FENCED
    producer.flush()
    assert [m.value() for m in rig.log] == [b"z%d" % i for i in range(5)]
    with pytest.raises(ProducerFenced):
        producer.produce_many("t", [b"again"], partition=0)
    assert producer.batch_done == 0


def test_batch_past_the_lease_end_raises_lease_expired_and_sends_nothing_more() -> None:
    rig = Rig()
    rig.config = INLINE
    producer = rig.producer()
    rig.lease.down = True

    def end() -> None:
        rig.now += LIFETIME  # no lease server to roll with, and the lease is over

    values = Ticking([b"z%d" % i for i in range(8)], at(3, end))
    with pytest.raises(LeaseExpired):
        producer.produce_many("t", values, partition=2)
    assert producer.batch_done == 3
    producer.flush()
    assert [(m.value(), decode_pf(m.headers()[0][1]).seq) for m in rig.kafka.log] == [  # type: ignore[union-attr]
        (b"z%d" % i, i) for i in range(3)
    ]


def test_batch_drain_failure_keeps_the_old_pid_and_reports_the_position() -> None:
    rig = Rig()
    rig.config = INLINE
    producer = rig.producer()

    def stuck() -> None:
        assert rig.kafka is not None
        rig.kafka.stuck = True
        rig.now += ROLL_AT

    with pytest.raises(DrainFailed):
        producer.produce_many("t", Ticking([b"a", b"b", b"c"], at(2, stuck)), partition=0)
    assert producer.batch_done == 2 and producer.state is LeaseState.LEASED
    assert "roll 100 40" not in rig.lease.calls


@pytest.mark.parametrize("config", [INLINE, GENERAL], ids=["inline", "general"])
def test_bad_record_mid_batch_costs_no_seq(config: ProducerConfig) -> None:
    rig = Rig()
    rig.config = config
    producer = rig.producer()
    big = b"x" * (config.message_max_bytes + 1)
    with pytest.raises(ValueTooLarge):
        producer.produce_many("t", [b"a", b"b", big, b"c"], partition=0)
    assert producer.batch_done == 2
    producer.produce_many("t", [b"c"], partition=0)
    producer.flush()
    assert [decode_pf(m.headers()[0][1]).seq for m in rig.kafka.log] == [0, 1, 2]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="does not exist"):
        producer.produce_many("t", [b"d"], partition=7)
    assert producer.sequencer.counters() == {("t", 0): 3}


def test_kafka_refusing_a_record_on_the_inline_path_rewinds_its_seq() -> None:
    rig = Rig()
    rig.config = INLINE
    producer = rig.producer()
    producer.produce("t", b"a", partition=0)  # partition 0 is now inline
    assert rig.kafka is not None
    real = rig.kafka.produce
    calls = {"n": 0}

    def refuse_second(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise confluent_kafka.KafkaException(confluent_kafka.KafkaError._INVALID_ARG)
        real(*args, **kwargs)

    rig.kafka.produce = refuse_second  # type: ignore[method-assign]
    producer._kafka_produce = refuse_second  # the bound method the producer kept
    producer.produce("t", b"b", partition=0)
    with pytest.raises(KafkaRefused, match="a record to t"):
        producer.produce_many("t", [b"c", b"d"], partition=0)
    assert producer.batch_done == 0
    rig.kafka.full_once = True  # a full queue on the inline path is waited out, not lost
    producer.produce_many("t", [b"c", b"d"], partition=0)
    producer.flush()
    assert [(m.value(), decode_pf(m.headers()[0][1]).seq) for m in rig.kafka.log] == [
        (b"a", 0),
        (b"b", 1),
        (b"c", 2),
        (b"d", 3),
    ]


def test_batch_skips_what_the_predecessor_got_in_after_a_resume() -> None:
    """A resumer past the rollover point skips, in a batch as in single produce, the records
    its predecessor got into Kafka after the checkpoint: each event appended once."""
    rig = SharedRig()
    rig.config = INLINE
    a = rig.producer()
    a.produce_many("t", [b"z%d" % i for i in range(5)], partition=0)
    a.flush()
    cp = a.checkpoint()
    a.produce_many("t", [b"z%d" % i for i in range(5, 10)], partition=0)
    a.flush()
    rig.now += ROLL_AT
    b = rig.resume(cp)
    assert b.produce_many("t", [b"z%d" % i for i in range(5, 14)], partition=0) == 4
    b.flush()
    assert b.skipped == 5 and b.rollovers == 1
    assert rig.appended() == Counter(b"z%d" % i for i in range(14))


def test_batch_columns_must_match_the_values() -> None:
    rig = Rig()
    producer = rig.producer()
    with pytest.raises(BatchMismatch, match="keys has 1 entries for 2 values") as info:
        producer.produce_many("t", [b"a", b"b"], keys=[b"k"])
    assert isinstance(info.value, ValueError) and not info.value.retriable
    with pytest.raises(BatchMismatch, match="event_ids"):
        producer.produce_many("t", [b"a"], event_ids=[])
    producer.flush()
    assert rig.kafka is not None and rig.kafka.log == []
    assert producer.produce_many("t", []) == 0


def test_batch_delivery_failure_is_raised_by_flush_as_for_produce() -> None:
    rig = Rig()
    rig.config = replace(INLINE, success_reports=False)
    producer = rig.producer()
    assert rig.kafka is not None
    rig.kafka.fail = confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT)
    producer.produce_many("t", [b"a", b"b"], partition=0)
    with pytest.raises(DeliveryFailed):
        producer.flush()
    assert producer.acked == 0
