"""Unit tests of IdempotentProducer with a fake Kafka client and a fake lease client."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka
import pytest

from pidfence.ledger import read_ledger, value_digest
from pidfence.producer import (
    BrokerUnavailable,
    DeliveryFailed,
    LeaseExpired,
    LeaseKeeper,
    LeaseServerDown,
    LeaseState,
    NotFlushed,
    ProducerCheckpoint,
    ProducerConfig,
    ProducerFenced,
    ReservedHeader,
    UnknownPartition,
    UnknownTopic,
    ValueTooLarge,
    key_partition,
)
from pidfence.wire import FLAG_FENCE, PidfenceError, decode_pf
from pidfence.wire.mac import MAC_HEADER_KEY, RecordMacCheck
from tests.unit.producer_kit import LIFETIME, Rig


@pytest.fixture
def rig() -> Rig:
    return Rig()


def test_a_partition_the_topic_lacks_is_a_pidfence_error_naming_the_count(rig: Rig) -> None:
    producer = rig.producer()
    with pytest.raises(UnknownPartition, match=r"it has 3 partitions \(0\.\.2\)") as failed:
        producer.produce("t", b"v", partition=3)
    assert isinstance(failed.value, PidfenceError) and not failed.value.retriable


def test_keyed_records_use_murmur2_and_count_seq_per_partition(rig: Rig) -> None:
    producer = rig.producer()
    assert producer.state is LeaseState.LEASED
    parts = [producer.produce("t", b"v%d" % i, key=b"k%d" % i) for i in range(30)]
    assert parts == [key_partition(b"k%d" % i, 3) for i in range(30)]
    assert producer.flush() == 0
    assert rig.kafka is not None
    seen: dict[int, list[int]] = {}
    for msg, pf in zip(rig.kafka.log, rig.headers(), strict=True):
        assert pf.pid == 100 and pf.generation == 40 and pf.flags == 0
        seen.setdefault(msg.partition(), []).append(pf.seq)
    assert all(seqs == list(range(len(seqs))) for seqs in seen.values())
    assert producer.acked == 30
    assert rig.kafka.conf["acks"] == "all" and rig.kafka.conf["enable.idempotence"] is True


def test_unkeyed_records_stick_then_round_robin(rig: Rig) -> None:
    producer = rig.producer()
    parts = [producer.produce("t", b"x") for _ in range(10)]
    # The first partition is pid % partitions (pid 100, 3 partitions).
    assert parts == [1, 1, 1, 2, 2, 2, 0, 0, 0, 1]


def test_user_pf_header_is_refused_and_loses_no_seq(rig: Rig) -> None:
    producer = rig.producer()
    with pytest.raises(ReservedHeader, match="reserved"):
        producer.produce("t", b"x", partition=0, headers=[("pf", b"mine")])
    assert isinstance(ReservedHeader("x"), ValueError | PidfenceError)
    producer.produce("t", b"x", partition=0, headers=[("trace", b"1")])
    producer.flush()
    assert rig.headers()[0].seq == 0
    assert rig.kafka is not None and rig.kafka.log[0].headers()[1] == ("trace", b"1")


def test_flush_raises_first_delivery_error_once(rig: Rig) -> None:
    producer = rig.producer()
    assert rig.kafka is not None
    rig.kafka.fail = confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT)
    producer.produce("t", b"a", partition=0)
    producer.produce("t", b"b", partition=1)
    with pytest.raises(DeliveryFailed, match="resume from the last checkpoint") as info:
        producer.flush()
    assert info.value.code == "_MSG_TIMED_OUT"
    rig.kafka.fail = None
    assert producer.flush() == 0


def test_user_delivery_callback_runs_after_bookkeeping(rig: Rig) -> None:
    producer = rig.producer()
    got: list[int] = []
    producer.produce("t", b"a", partition=2, on_delivery=lambda err, msg: got.append(msg.offset()))
    producer.flush()
    assert got == [0] and producer.acked == 1


def test_buffer_full_is_retried_without_losing_the_record(rig: Rig) -> None:
    producer = rig.producer()
    assert rig.kafka is not None
    rig.kafka.full_once = True
    producer.produce("t", b"a", partition=0)
    producer.flush()
    assert [pf.seq for pf in rig.headers()] == [0]


def test_errors_are_named_with_retriable_set(rig: Rig) -> None:
    producer = rig.producer()
    with pytest.raises(UnknownTopic, match="create it"):
        producer.produce("nope", b"x")
    with pytest.raises(ValueTooLarge):
        producer.produce("t", b"x" * (rig.config.message_max_bytes + 1))
    with pytest.raises(ValueError, match="does not exist"):
        producer.produce("t", b"x", partition=3)
    assert rig.kafka is not None
    rig.kafka.broker_down = True
    with pytest.raises(BrokerUnavailable) as info:
        producer.produce("u2", b"x")
    assert info.value.retriable
    assert not UnknownTopic.retriable and not ValueTooLarge.retriable
    rig.lease.down = True
    with pytest.raises(LeaseServerDown) as down:
        rig.producer()
    assert down.value.retriable


def test_checkpoint_requires_flush(rig: Rig) -> None:
    producer = rig.producer()
    producer.produce("t", b"a", partition=0)
    with pytest.raises(NotFlushed):
        producer.checkpoint()
    producer.flush()
    cp = producer.checkpoint()
    assert (cp.pid, cp.generation, dict(cp.next_seq)) == (100, 40, {("t", 0): 1})
    assert cp.expire_ms == rig.now + LIFETIME and cp.lifetime_ms == LIFETIME


def test_resume_bumps_and_fences_every_partition_before_data(rig: Rig, tmp_path: Path) -> None:
    first = rig.producer()
    for i in range(7):
        first.produce("t", b"%d" % i, key=b"%d" % i)
    first.produce("u", b"u")
    first.flush()
    cp = first.checkpoint()
    ledger = tmp_path / "l.jsonl"
    second = rig.resume(cp, ledger=ledger)
    assert rig.kafka is not None
    fences = rig.headers()
    assert [(m.topic(), m.partition()) for m in rig.kafka.log] == sorted(cp.next_seq)
    assert all(pf.flags == FLAG_FENCE and pf.generation == 41 for pf in fences)
    assert [pf.seq for pf in fences] == [cp.next_seq[tp] for tp in sorted(cp.next_seq)]
    assert all(m.value() == b"" for m in rig.kafka.log)
    second.produce("u", b"next")
    second.close()
    last = rig.headers()[-1]
    assert (last.pid, last.generation, last.seq) == (100, 41, cp.next_seq[("u", 0)])
    entries = list(read_ledger([ledger]))
    assert [e.fence for e in entries] == [True] * len(cp.next_seq) + [False]
    assert entries[-1].offset == 1 and entries[-1].digest == value_digest(b"next")
    assert second.fences_acked == len(cp.next_seq) and not second.resumed_from_expired


def test_resume_of_expired_checkpoint_rolls_it_into_its_successor(rig: Rig) -> None:
    first = rig.producer()
    first.produce("t", b"a", partition=0)
    first.flush()
    cp = first.checkpoint()
    rig.now = cp.expire_ms
    producer = rig.resume(cp)
    assert producer.resumed_how == "rolled" and producer.resumed_from_expired
    assert rig.lease.calls[-1] == "roll 100 40" and "bump 100 40" not in rig.lease.calls
    assert producer.sequencer.pid == 101 and producer.sequencer.peek("t", 0) == 0
    assert rig.kafka is not None and rig.kafka.log == []  # a new pid needs no FENCE
    # The server no longer knows the pid (past the lineage retention): a fresh pid, said so.
    gone = rig.resume(ProducerCheckpoint(999, 1, rig.now - 1, {("t", 0): 5}, secret=b"x"))
    assert gone.resumed_how == "fresh" and rig.lease.calls[-2:] == ["roll 999 1", "lease"]


def test_resume_with_a_wrong_secret_is_refused_and_changes_nothing(rig: Rig) -> None:
    first = rig.producer()
    first.flush()
    cp = first.checkpoint()
    forged = ProducerCheckpoint(cp.pid, cp.generation, cp.expire_ms, {}, secret=b"guess")
    with pytest.raises(ProducerFenced, match="secret"):
        rig.resume(forged)
    assert rig.lease.latest[cp.pid] == cp.generation


def test_resume_after_a_crash_between_bump_and_save_probes_forward(rig: Rig) -> None:
    first = rig.producer()
    first.produce("t", b"a", partition=0)
    first.flush()
    cp = first.checkpoint()
    rig.resume(cp)  # bumped to 41 and then "killed" before saving its checkpoint
    again = rig.resume(cp)
    assert again.sequencer.generation == 42
    rig.lease.latest[100] = 90
    with pytest.raises(ProducerFenced, match="another producer owns"):
        rig.resume(cp, stale_probe=3)


@pytest.mark.parametrize("ahead", [0, 3])
def test_resume_bumps_a_live_checkpoint_up_to_probe_generations_behind_the_server(
    rig: Rig, ahead: int
) -> None:
    """A probe of n tries the checkpoint's generation and the n after it: the server may be
    exactly n bumps ahead (none checkpointed), and a probe of 0 still tries the stored one."""
    keeper = LeaseKeeper(rig.lease, rig.clock)
    first = keeper.lease_new()
    rig.lease.latest[first.pid] = first.generation + ahead
    resumed = keeper.resume(first.checkpoint(), ahead)
    assert (resumed.how, resumed.walk_from) == ("bumped", first.generation + 1)
    assert resumed.sequencer.generation == first.generation + ahead + 1


def test_a_followed_resume_fences_from_the_successors_new_generation(rig: Rig) -> None:
    """The second resumer of an expired checkpoint bumps the successor the first one rolled it
    into; its FENCE walk starts at that bump, not at the generation the first resumer holds."""
    keeper = LeaseKeeper(rig.lease, rig.clock)
    cp = keeper.lease_new().checkpoint()
    rig.now = cp.expire_ms + 1
    rolled = keeper.resume(cp, 8)
    followed = keeper.resume(cp, 8)
    assert (rolled.how, rolled.walk_from, followed.how) == ("rolled", None, "followed")
    assert followed.sequencer.pid == rolled.sequencer.pid
    assert followed.walk_from == followed.sequencer.generation == rolled.sequencer.generation + 1


def test_resume_past_a_bump_that_wrote_no_fence_walks_each_partition_up(rig: Rig) -> None:
    from pidfence.broker_plugin import ProducerStateTable
    from pidfence.wire import Verdict

    first = rig.producer()
    for i in range(4):
        first.produce("t", f"a{i}".encode(), partition=i % 2)
    first.flush()
    cp = first.checkpoint()
    assert rig.kafka is not None
    landed = list(zip(rig.kafka.log, rig.headers(), strict=True))
    # A predecessor bumped to 41 and died before writing any FENCE: Kafka holds generation 40.
    rig.lease.latest[100] = 41
    heir = rig.resume(cp)
    assert heir.sequencer.generation == 42
    heir.produce("t", b"b", partition=0)
    heir.flush()
    assert rig.kafka is not None
    fences = [(pf.generation, pf.flags) for pf in rig.headers() if pf.flags & FLAG_FENCE]
    # Every partition of the topic, also partition 2 that the checkpoint never wrote.
    assert fences == [(41, FLAG_FENCE), (42, FLAG_FENCE)] * 3
    landed += list(zip(rig.kafka.log, rig.headers(), strict=True))
    tables = {p: ProducerStateTable(capacity=10, lifetime_ms=LIFETIME) for p in range(3)}
    verdicts = []
    for msg, pf in landed:
        table = tables[msg.partition()]
        decisions = table.offer(pf.pid, pf.generation, pf.seq, 1, flags=pf.flags)
        verdicts += [d.verdict for d in decisions]
    assert verdicts.count(Verdict.APPENDED) == 5
    assert verdicts.count(Verdict.FENCE) == 6 and len(verdicts) == 11


def test_rollover_drains_then_rolls_to_the_successor(rig: Rig, tmp_path: Path) -> None:
    ledger = tmp_path / "l.jsonl"
    producer = rig.producer(ledger=ledger)
    producer.produce("t", b"old", partition=0)  # in flight when the rollover is due
    rig.now += LIFETIME * 23 // 24
    producer.produce("t", b"new", partition=0)
    assert rig.kafka is not None and [m.value() for m in rig.kafka.log] == [b"old"]
    producer.close()
    assert [(pf.pid, pf.seq) for pf in rig.headers()] == [(100, 0), (101, 0)]
    assert producer.rollovers == 1 and rig.lease.calls == ["lease", "roll 100 40"]
    assert rig.lease.successor[100] == (101, 40)
    assert [(e.pid, e.expire_ms) for e in read_ledger([ledger])] == [
        (100, 1_000_000 + LIFETIME),
        (101, rig.now + LIFETIME),
    ]


def test_rollover_failure_keeps_old_lease_until_it_expires(rig: Rig) -> None:
    producer = rig.producer()
    rig.lease.down = True
    rig.now += LIFETIME * 23 // 24
    producer.produce("t", b"a", partition=0)
    assert producer.sequencer.pid == 100 and producer.state is LeaseState.LEASED
    rig.now += LIFETIME
    with pytest.raises(LeaseExpired, match="retry") as info:
        producer.produce("t", b"b", partition=0)
    assert info.value.retriable
    rig.lease.down = False
    # Nothing is in flight, so the ended pid still rolls through its lineage (never sending
    # under it again).
    producer.produce("t", b"c", partition=0)
    producer.flush()
    assert [(pf.pid, pf.seq) for pf in rig.headers()] == [(100, 0), (101, 0)]
    assert rig.lease.successor[100][0] == 101


def test_a_roll_carries_the_lifetime_over_when_the_local_clock_drifts(rig: Rig) -> None:
    """The successor keeps its predecessor's lease lifetime: it is not re-derived from a local
    clock that has come to run ahead of the lease server's."""
    skew = [0]
    keeper = LeaseKeeper(rig.lease, lambda: rig.now + skew[0])
    first = keeper.lease_new()
    skew[0] = 5_000
    assert keeper.roll(first).lifetime_ms == first.lifetime_ms == LIFETIME


def test_resend_acknowledged_repeats_original_headers(rig: Rig, tmp_path: Path) -> None:
    ledger = tmp_path / "l.jsonl"
    producer = rig.producer(ledger=ledger)
    for i in range(6):
        producer.produce("t", b"v%d" % i, key=b"k", partition=1)
    producer.flush()
    assert producer.resend_acknowledged(2) == 2
    producer.flush()
    assert rig.kafka is not None
    tail = rig.kafka.log[-2:]
    assert [m.value() for m in tail] == [b"v4", b"v5"]
    assert [decode_pf(m.headers()[0][1]).seq for m in tail] == [4, 5]
    assert producer.resend_acknowledged(0) == 0
    assert producer.resend_acknowledged(10) == 4  # only resend_buffer=4 are kept
    producer.close()
    assert len(list(read_ledger([ledger]))) == 12


def test_closed_producer_refuses_to_send(rig: Rig) -> None:
    producer = rig.producer()
    producer.close()
    producer.close()
    with pytest.raises(PidfenceError, match="CLOSED"):
        producer.produce("t", b"x")


def test_success_reports_off_reports_errors_only_and_refuses_what_needs_successes(
    rig: Rig, tmp_path: Path
) -> None:
    from pidfence.producer import ProducerConfigError

    rig.config = ProducerConfig("127.0.0.1:9", success_reports=False)
    assert rig.config.to_librdkafka()["delivery.report.only.error"] is True
    with pytest.raises(ProducerConfigError, match="resend_buffer=0"):
        ProducerConfig("127.0.0.1:9", success_reports=False, resend_buffer=4)
    with pytest.raises(ProducerConfigError, match="ledger"):
        rig.producer(ledger=tmp_path / "l.jsonl")
    producer = rig.producer()
    with pytest.raises(ProducerConfigError, match="on_delivery"):
        producer.produce("t", b"x", partition=0, on_delivery=lambda err, msg: None)
    producer.produce("t", b"y", partition=0)
    assert rig.kafka is not None
    rig.kafka.fail = confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT)
    with pytest.raises(DeliveryFailed):
        producer.flush()
    assert [pf.seq for pf in rig.headers()] == []
    rig.kafka.fail = None
    producer.produce("t", b"z", partition=0)
    producer.flush()
    assert [pf.seq for pf in rig.headers()] == [1]


def test_per_record_mode_puts_a_valid_mac_on_every_record_fast_path_or_not(rig: Rig) -> None:
    # The inline loops (produce, produce_many) and the general path (first record of a
    # partition, user headers, a resume's FENCEs) must all produce the MAC the sink checks.
    secret = bytes(range(32))
    rig.lease.mac_secret = secret
    rig.config = ProducerConfig("127.0.0.1:9", sticky_records=3)  # no resend buffer: inline
    producer = rig.producer()
    for i in range(40):
        producer.produce("t", b"v%d" % i, key=b"k%d" % i)
    producer.produce("t", b"traced", partition=1, headers=[("trace", b"1")])
    producer.produce_many("t", [b"m%d" % i for i in range(200)], partition=2)
    producer.produce_many("u", [b"n%d" % i for i in range(10)], keys=[b"k"] * 10)
    producer.flush()
    assert rig.kafka is not None
    log = list(rig.kafka.log)
    resumed = rig.resume(producer.checkpoint())
    resumed.produce("t", b"after", partition=0)
    resumed.flush()
    log += rig.kafka.log
    assert len(log) == 251 + 4 + 1  # the resume FENCEs every partition of t and u
    check = RecordMacCheck(secret)
    for msg in log:
        found = dict(msg.headers())
        pf = decode_pf(found["pf"])
        mac = found.get(MAC_HEADER_KEY)
        assert check.valid(
            msg.topic(),
            msg.partition(),
            pf.pid,
            pf.generation,
            pf.seq,
            pf.flags,
            msg.key(),
            msg.value(),
            mac,
        ), pf
    # Tampering with any covered field breaks it.
    msg = log[-1]
    found = dict(msg.headers())
    pf = decode_pf(found["pf"])
    assert not check.valid(
        msg.topic(),
        msg.partition(),
        pf.pid,
        pf.generation,
        pf.seq + 1,
        0,
        msg.key(),
        msg.value(),
        found[MAC_HEADER_KEY],
    )
