"""Unit tests of the producer's I/O-free parts: murmur2, Sequencer, checkpoint, state, config."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidfence.producer import (
    BadCheckpoint,
    InvalidTransition,
    LeaseState,
    LeaseStateMachine,
    ProducerCheckpoint,
    ProducerConfig,
    ProducerConfigError,
    Sequencer,
    key_partition,
    murmur2,
)
from pidfence.wire import FLAG_FENCE, PidfenceError, decode_pf, encode_pf

# Java values of org.apache.kafka.common.utils.Utils.murmur2: the first six are Kafka's own
# UtilsTest.testMurmur2; the digit strings and "ABCDEFGH" were computed with Kafka's Java
# implementation by other clients (kafkajs's defaultJava/Test.java, Alpakka Kafka's Murmur2Spec).
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
    b"12345678": 338742798,
    b"123456789012": -1769968653,
    b"ABCDEFGH": -1542716145,
    b"0": 971027396,
    b"128": -326012175,
    b"2187": -1508407203,
    b"16384": -325739742,
    b"78125": -1654490814,
    b"279936": 1462227128,
    b"823543": -2014198330,
    b"2097152": 607668903,
    b"4782969": -1182699775,
    b"10000000": -1830336757,
}


@pytest.mark.parametrize(("data", "expected"), sorted(JAVA_MURMUR2.items()))
def test_murmur2_matches_java(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_key_partition_is_positive_modulo() -> None:
    # toPositive(-973932308) % 7, as Kafka's BuiltInPartitioner computes it.
    assert key_partition(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert all(0 <= key_partition(bytes([i]), 3) < 3 for i in range(256))
    # Java's murmur2 of an empty array (seed ^ 0, then the final mix).
    assert murmur2(b"") == 275646681


def test_sequencer_counts_per_partition_and_stamps_pf() -> None:
    seq = Sequencer(pid=7, generation=3, expire_ms=1000)
    headers = [seq.stamp("t", 0), seq.stamp("t", 0), seq.stamp("t", 1), seq.stamp("u", 0)]
    decoded = [decode_pf(h) for h in headers]
    assert [(h.pid, h.generation, h.seq, h.flags) for h in decoded] == [
        (7, 3, 0, 0),
        (7, 3, 1, 0),
        (7, 3, 0, 0),
        (7, 3, 0, 0),
    ]
    assert seq.peek("t", 0) == 2 and seq.peek("x", 5) == 0


@pytest.mark.parametrize(
    ("pid", "generation"), [(1, 0), (300, 2**31 - 1), (2**63 - 1, 127), (2**40, 70_000)]
)
def test_stamp_is_byte_identical_to_encode_pf(pid: int, generation: int) -> None:
    start = 2**63 - 3
    seq = Sequencer(pid, generation, 0, next_seq={("t", 0): 0, ("t", 1): 120, ("t", 2): start})
    for partition, first in ((0, 0), (1, 120), (2, start)):
        for n in range(first, first + 3 if partition != 2 else 2**63):
            assert seq.stamp("t", partition) == encode_pf(pid, generation, n)


def test_sequencer_rewind_undoes_one_stamp() -> None:
    seq = Sequencer(1, 0, 0)
    seq.stamp("t", 0)
    seq.stamp("t", 0)
    seq.rewind("t", 0)
    assert decode_pf(seq.stamp("t", 0)).seq == 1
    with pytest.raises(KeyError):
        seq.rewind("t", 9)


def test_fences_announce_next_seq_without_advancing() -> None:
    cp = ProducerCheckpoint(5, 2, 99, {("t", 1): 4, ("t", 0): 0})
    seq = Sequencer.resumed(cp, generation=3, expire_ms=99)
    fences = seq.fences()
    assert [(t, p) for t, p, _ in fences] == [("t", 0), ("t", 1)]
    decoded = [decode_pf(h) for _, _, h in fences]
    assert [(h.pid, h.generation, h.seq, h.flags) for h in decoded] == [
        (5, 3, 0, FLAG_FENCE),
        (5, 3, 4, FLAG_FENCE),
    ]
    assert decode_pf(seq.stamp("t", 1)).seq == 4


def test_a_resumed_sequencer_keeps_the_checkpoints_secret_unless_given_another() -> None:
    cp = ProducerCheckpoint(5, 2, 99, {("t", 0): 3}, secret=b"the pid's secret")
    assert Sequencer.resumed(cp, generation=3, expire_ms=99).checkpoint() == ProducerCheckpoint(
        5, 3, 99, {("t", 0): 3}, secret=b"the pid's secret", topics=("t",)
    )
    assert Sequencer.resumed(cp, 3, 99, secret=b"a new secret").secret == b"a new secret"


def test_sequencer_refuses_bad_identity() -> None:
    with pytest.raises(ValueError, match="pid"):
        Sequencer(0, 0, 0)
    with pytest.raises(ValueError, match="generation"):
        Sequencer(1, 2**31, 0)


def test_checkpoint_json_round_trip() -> None:
    seq = Sequencer(11, 4, 12345, lifetime_ms=600)
    seq.stamp("a", 2)
    seq.stamp("b", 0)
    cp = seq.checkpoint()
    back = ProducerCheckpoint.from_json(cp.to_json())
    assert back == cp
    assert back.next_seq == {("a", 2): 1, ("b", 0): 1}
    assert back.lifetime_ms == 600


def test_checkpoint_keeps_the_partitions_fenced_at_its_generation_only() -> None:
    seq = Sequencer(11, 4, 12345)
    seq.fenced = {("a", 0): 4, ("a", 1): 3}
    cp = seq.checkpoint()
    assert cp.fenced == {("a", 0): 4}
    assert ProducerCheckpoint.from_json(cp.to_json()).fenced == {("a", 0): 4}
    assert "fenced" not in Sequencer(11, 4, 12345).checkpoint().to_dict()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"v": 4, "pid": 1, "generation": 0, "expire_ms": 1, "next_seq": []}',
        '{"v": 1, "pid": 1, "generation": 0, "next_seq": []}',
        '{"v": 1, "pid": 1, "generation": 0, "expire_ms": 1, "next_seq": [["t", "0", 1]]}',
        '{"v": 1, "pid": -1, "generation": 0, "expire_ms": 1, "next_seq": []}',
        '{"v": 1, "pid": 1, "generation": 0, "expire_ms": 1, "next_seq": [["t", 0]]}',
    ],
)
def test_bad_checkpoint_is_a_clear_error(text: str) -> None:
    with pytest.raises(BadCheckpoint):
        ProducerCheckpoint.from_json(text)
    assert issubclass(BadCheckpoint, PidfenceError) and not BadCheckpoint.retriable


@pytest.mark.parametrize("field", ["next_seq", "skip", "ahead", "fenced"])
def test_a_negative_per_partition_count_is_a_bad_checkpoint(field: str) -> None:
    """A partition's next sequence, skip, ahead or fenced generation below zero makes the
    checkpoint a bad one, as a negative partition does; zero is a count like any other."""
    good = ProducerCheckpoint(7, 1, 10**13, {("t", 0): 5}).to_dict()
    zero = ProducerCheckpoint.from_dict({**good, field: [["t", 0, 0]]})
    assert getattr(zero, field) == {("t", 0): 0}
    with pytest.raises(BadCheckpoint, match=f"negative partition or count in {field}"):
        ProducerCheckpoint.from_dict({**good, field: [["t", 0, -1]]})


def test_state_machine_checks_transitions() -> None:
    machine = LeaseStateMachine()
    assert machine.state is LeaseState.UNLEASED
    with pytest.raises(InvalidTransition):
        machine.move(LeaseState.ROLLING)
    path = (LeaseState.LEASED, LeaseState.DRAINING, LeaseState.ROLLING, LeaseState.LEASED)
    for to in path:
        machine.move(to)
    with pytest.raises(InvalidTransition):
        machine.move(LeaseState.ROLLING)  # a roll always drains first
    for to in (LeaseState.DRAINING, LeaseState.LEASED, LeaseState.FENCED):
        machine.move(to)
    with pytest.raises(InvalidTransition):
        machine.move(LeaseState.LEASED)  # fenced never sends again
    machine.move(LeaseState.CLOSED)
    with pytest.raises(InvalidTransition, match="terminal"):
        machine.move(LeaseState.LEASED)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(LeaseState)), max_size=20))
def test_state_machine_sends_only_after_a_drain_and_never_after_fenced(
    moves: list[LeaseState],
) -> None:
    """Property: ROLLING is entered only from DRAINING; nothing leaves FENCED but CLOSED."""
    machine = LeaseStateMachine()
    history = [machine.state]
    for to in moves:
        try:
            machine.move(to)
        except InvalidTransition:
            continue
        history.append(to)
    for before, after in itertools.pairwise(history):
        if after is LeaseState.ROLLING:
            assert before is LeaseState.DRAINING
        if before is LeaseState.FENCED:
            assert after is LeaseState.CLOSED
        assert before is not LeaseState.CLOSED


def test_config_refuses_weak_acks_and_exports_librdkafka_keys() -> None:
    with pytest.raises(ProducerConfigError, match="acks='all'"):
        ProducerConfig("h:1", acks="1")
    with pytest.raises(ProducerConfigError, match="acks"):
        ProducerConfig("h:1", extra={"acks": 0})
    with pytest.raises(ProducerConfigError, match=r"linger\.ms"):
        ProducerConfig("h:1", extra={"linger.ms": 3})
    conf = ProducerConfig("h:1", enable_idempotence=False, extra={"client.id": "x"})
    out = conf.to_librdkafka()
    assert out["acks"] == "all" and out["enable.idempotence"] is False
    assert out["bootstrap.servers"] == "h:1" and out["client.id"] == "x"
    assert ProducerConfig("h:1", acks="-1").to_librdkafka()["acks"] == "all"


def test_config_repr_masks_secrets() -> None:
    conf = ProducerConfig("h:1", extra={"sasl.password": "hunter2", "sasl.username": "bob"})
    assert "hunter2" not in repr(conf) and "bob" in repr(conf)


def test_a_rewind_past_the_first_seq_is_refused() -> None:
    seq = Sequencer(5, 0, 99)
    seq.stamp("t", 0)
    seq.rewind("t", 0)
    with pytest.raises(ValueError, match="nothing to rewind"):
        seq.rewind("t", 0)
    assert decode_pf(seq.stamp("t", 0)).seq == 0
