"""What the producer does after things went wrong: a record that failed delivery, a record
librdkafka refuses, a delivery error a rerun gets past, a producer that never opened, a pid the
lease servers forgot while it was idle."""

from __future__ import annotations

import random
import time
from typing import Any

import confluent_kafka
import pytest

from pidfence import producer as api
from pidfence.cli.exits import EXIT_RETRIABLE, EXIT_UNAVAILABLE, code_of
from pidfence.producer import (
    DeliveryFailed,
    IdempotentProducer,
    LeaseExpired,
    LeaseServerDown,
    ProducerConfig,
    ValueTooLarge,
)
from pidfence.producer.delivery import delivery_error
from pidfence.sim.lease import SimLeaseServer
from pidfence.wire import PidfenceError
from tests.unit.kafka_kit import Message
from tests.unit.producer_kit import LIFETIME, FakeKafka, Rig

TIMED_OUT = confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT)
TOO_LARGE = confluent_kafka.KafkaError(confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE)


# ---- a record that failed delivery: no checkpoint, bump or roll may cover it --------------


def failed_once(rig: Rig) -> IdempotentProducer:
    """A producer whose first record failed delivery, its error raised once by ``flush()``."""
    producer = rig.producer()
    producer.produce("t", b"e1", partition=0)
    assert rig.kafka is not None
    rig.kafka.fail = TIMED_OUT
    with pytest.raises(DeliveryFailed):
        producer.flush()
    rig.kafka.fail = None
    assert producer.flush() == 0  # raised once, as documented
    return producer


def test_after_a_failed_delivery_no_checkpoint_covers_the_record() -> None:
    """The review's case: the second ``flush()`` returned 0 and ``checkpoint()`` covered e1,
    which was never written; a caller storing it would never send e1 again."""
    rig = Rig()
    producer = failed_once(rig)
    with pytest.raises(DeliveryFailed, match="refuses to checkpoint") as refused:
        producer.checkpoint()
    assert refused.value.code == "_MSG_TIMED_OUT"
    with pytest.raises(DeliveryFailed, match="refuses to checkpoint"):
        producer.bump()


def test_after_a_failed_delivery_no_rollover_hands_over_past_the_record() -> None:
    """A rollover's successor checkpoint is stored with the position of the next record: it
    would cover the failed one too. Both the explicit roll and the one ``produce`` starts
    refuse; the resumed producer (a new one) sends the record again."""
    rig = Rig()
    producer = failed_once(rig)
    cp = producer.sequencer.checkpoint()  # what the caller stored before e1
    with pytest.raises(DeliveryFailed):
        producer.roll()
    rig.now += LIFETIME * 23 // 24 + 1
    with pytest.raises(DeliveryFailed):
        producer.produce("t", b"e2", partition=0)
    assert producer.rollovers == 0
    resumed = rig.resume(cp)
    resumed.produce("t", b"e1", partition=0)
    resumed.flush()
    resumed.checkpoint()


# ---- librdkafka's refusals become the producer's errors ----------------------------------


class Refusing(FakeKafka):
    """Refuses every record with ``error`` (as ``confluent_kafka.Producer.produce`` raises)."""

    error: Any = None

    def produce(self, *args: Any, **kwargs: Any) -> None:
        if self.error is not None:
            raise confluent_kafka.KafkaException(self.error)
        super().produce(*args, **kwargs)


class RefusingRig(Rig):
    def factory(self, conf: dict[str, Any]) -> FakeKafka:
        self.kafka = Refusing(conf, {"t": 3, "u": 1})
        return self.kafka


@pytest.mark.parametrize("tracked", [True, False], ids=["general-path", "inline"])
def test_kafkas_refusals_are_the_producers_errors_and_cost_no_seq(tracked: bool) -> None:
    rig = RefusingRig()
    if not tracked:
        rig.config = ProducerConfig("127.0.0.1:9")  # untracked: ready lanes stamped inline
    producer = rig.producer()
    producer.produce("t", b"a", partition=0)
    producer.produce("t", b"b", partition=0)
    assert isinstance(rig.kafka, Refusing)
    rig.kafka.error = TOO_LARGE
    with pytest.raises(ValueTooLarge, match="message_max_bytes") as large:
        producer.produce("t", b"c", partition=0)
    assert code_of(large.value) == EXIT_UNAVAILABLE
    rig.kafka.error = confluent_kafka.KafkaError(confluent_kafka.KafkaError._FATAL, fatal=True)
    with pytest.raises(api.KafkaClientFailed, match="failed for good") as fatal:
        producer.produce("t", b"c", partition=0)
    assert fatal.value.retriable and code_of(fatal.value) == EXIT_RETRIABLE
    rig.kafka.error = None
    producer.produce("t", b"c", partition=0)
    producer.flush()
    assert [pf.seq for pf in rig.headers()] == [0, 1, 2]


def test_a_record_whose_key_and_headers_pass_the_limit_is_refused_before_it_is_sent() -> None:
    """The limit is the whole record's (key + value + headers): only the value was checked,
    and librdkafka's MSG_SIZE_TOO_LARGE escaped ``produce`` as a traceback."""
    rig = Rig()
    rig.config = ProducerConfig("127.0.0.1:9", message_max_bytes=1000)
    producer = rig.producer()
    producer.produce("t", b"ok", partition=0)  # partition 0 is stamped inline from now on
    value = b"v" * 1000  # exactly the limit
    refusals = [
        {"key": b"k" * 10},
        {"key": "k" * 10},
        {"headers": [("trace", b"h" * 10)]},
        {"headers": [("trace", "h")]},
    ]
    for extra in refusals:
        with pytest.raises(ValueTooLarge, match="key, value and headers"):
            producer.produce("t", value, partition=0, **extra)
        if "key" in extra:
            with pytest.raises(ValueTooLarge):
                producer.produce_many("t", [value], [extra["key"]], partition=0)
    producer.produce("t", value, partition=0)
    producer.produce("t", b"v" * 990, key=b"k" * 10, partition=0)
    producer.flush()
    assert [pf.seq for pf in rig.headers()] == [0, 1, 2]


# ---- delivery errors a rerun gets past ---------------------------------------------------


def test_a_kafka_outage_longer_than_the_message_timeout_is_retriable() -> None:
    """README: Kafka unreachable exits 75 where a rerun continues (``--state``); a record Kafka
    refuses for good (too large for the topic) exits 3."""
    msg = Message("t", 0)
    timed_out = delivery_error(TIMED_OUT, msg)
    assert isinstance(timed_out, api.DeliveryTimedOut) and isinstance(timed_out, DeliveryFailed)
    assert code_of(timed_out) == EXIT_RETRIABLE
    for name in ("_TRANSPORT", "_ALL_BROKERS_DOWN", "NOT_ENOUGH_REPLICAS"):
        error = confluent_kafka.KafkaError(getattr(confluent_kafka.KafkaError, name))
        assert delivery_error(error, msg).retriable, name
    refused = delivery_error(TOO_LARGE, msg)
    assert type(refused) is DeliveryFailed and code_of(refused) == EXIT_UNAVAILABLE
    rig = Rig()
    producer = rig.producer()
    producer.produce("t", b"a", partition=0)
    assert rig.kafka is not None
    rig.kafka.fail = TIMED_OUT
    with pytest.raises(api.DeliveryTimedOut, match="resume from the last checkpoint") as caught:
        producer.flush()
    assert caught.value.retriable


# ---- a producer that never opened closes its client --------------------------------------


class Closable(FakeKafka):
    closed: list[str]

    def purge(self) -> None:
        self.closed.append("purge")

    def close(self) -> None:
        self.closed.append("close")


def test_a_producer_whose_lease_or_resume_fails_closes_its_client() -> None:
    """Otherwise a reference cycle kept librdkafka's threads alive until the garbage collector
    ran (a copier group retries an unopened partition every 3 s while no lease server answers)."""
    rig = Rig()
    closed: list[str] = []

    def factory(conf: dict[str, Any]) -> FakeKafka:
        kafka = Closable(conf, {"t": 3})
        kafka.closed = closed
        return kafka

    cp = rig.producer().checkpoint()
    rig.lease.down = True
    with pytest.raises(LeaseServerDown):
        IdempotentProducer(rig.config, rig.lease, clock=rig.clock, producer_factory=factory)
    assert closed == ["purge", "close"]
    with pytest.raises(LeaseServerDown):
        IdempotentProducer.resume(
            cp, rig.lease, rig.config, clock=rig.clock, producer_factory=factory
        )
    assert closed == ["purge", "close"] * 2


def _os_threads() -> int:
    import os

    return len(os.listdir(f"/proc/{os.getpid()}/task"))


@pytest.mark.skipif(not hasattr(confluent_kafka.Producer, "close"), reason="confluent-kafka < 2.13")
def test_failed_opens_leave_no_librdkafka_threads_behind() -> None:
    rig = Rig()
    rig.lease.down = True
    config = ProducerConfig("127.0.0.1:9")
    before = _os_threads()
    for _ in range(5):
        with pytest.raises(LeaseServerDown):
            IdempotentProducer(config, rig.lease)
    deadline = time.monotonic() + 5
    while _os_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _os_threads() <= before


# ---- a pid forgotten while its producer was idle -----------------------------------------


def test_a_producer_idle_past_the_lineage_retention_is_told_to_rerun_not_that_it_was_fenced() -> (
    None
):
    """Idle for over two lease lifetimes (a quiet input, ``--idle-exit 0``): the lease servers
    no longer know the pid, so the automatic rollover cannot roll it. Nothing proves another
    owner, nor that there is none, so the producer neither claims it was fenced (exit 3) nor
    leases a fresh pid (a replacement could not fence it, and the sink would take its records
    as a new producer's): ``LeaseExpired`` (exit 75), and a rerun resumes the checkpoint."""
    life = 24 * 3600 * 1000
    lease = SimLeaseServer(random.Random(1), life)
    lease.tick(1_000_000)
    config = ProducerConfig("127.0.0.1:9")

    def factory(conf: dict[str, Any]) -> FakeKafka:
        return FakeKafka(conf, {"t": 1})

    producer = IdempotentProducer(config, lease, clock=lambda: lease.now, producer_factory=factory)
    producer.produce("t", b"a", partition=0)
    producer.flush()
    cp = producer.checkpoint()
    lease.tick(1_000_000 + 2 * life + 1000)
    with pytest.raises(LeaseExpired, match="longer ago than the lease servers keep") as expired:
        producer.produce("t", b"b", partition=0)
    assert isinstance(expired.value, PidfenceError) and code_of(expired.value) == EXIT_RETRIABLE
    with pytest.raises(LeaseExpired):
        producer.produce("t", b"b", partition=0)  # nothing is ever sent under the ended lease
    rerun = IdempotentProducer.resume(
        cp, lease, config, clock=lambda: lease.now, producer_factory=factory, scanner=_no_scan
    )
    assert rerun.resumed_how == "fresh"
    rerun.produce("t", b"b", partition=0)


def _no_scan(*args: Any) -> None:
    return None


def test_a_refused_record_ends_pidfence_copy_and_produce_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pidfence.cli.producer_options import fail_cleanly

    rig = RefusingRig()
    producer = rig.producer()
    assert isinstance(rig.kafka, Refusing)
    rig.kafka.error = TOO_LARGE
    with pytest.raises(SystemExit) as ended, fail_cleanly():
        producer.produce("t", b"x", partition=0)
    assert ended.value.code == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("pidfence: error: ValueTooLarge: ") and err.count("\n") == 1
