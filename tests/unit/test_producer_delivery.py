"""The producer's Kafka I/O without Kafka: which delivery error a flush raises, when a checkpoint
may be taken, and when a resume's FENCE records count as written."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest

from pidfence.ledger import MemoryLedger
from pidfence.producer import ProducerConfig
from pidfence.producer.delivery import DeliveryTracker
from pidfence.producer.errors import BrokerUnavailable, DeliveryFailed, NotFlushed
from pidfence.producer.headers import Fence
from pidfence.producer.sender import Sender
from pidfence.wire import FLAG_FENCE, PF_HEADER_KEY, encode_pf
from tests.unit.kafka_kit import Message
from tests.unit.producer_kit import FakeKafka

TIMED_OUT = confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT)
PF = encode_pf(7, 2, 0)


def sender() -> Sender:
    """A sender over a fake Kafka with topic ``t`` of two partitions (``sender.client``)."""
    return Sender(ProducerConfig("127.0.0.1:9"), lambda conf: FakeKafka(conf, {"t": 2}), None, {})


def test_a_fence_kafka_did_not_acknowledge_fails_the_resume() -> None:
    out = sender()
    out.client.stuck = True  # records stay in flight
    fence = Fence("t", 0, encode_pf(7, 2, 0, FLAG_FENCE), ())
    with pytest.raises(BrokerUnavailable, match="1 FENCE records were not acknowledged"):
        out.send_fences([fence], timeout_s=0.1)


def test_a_delivery_error_forbids_a_checkpoint_also_after_a_flush_raised_it() -> None:
    out = sender()
    out.client.fail = TIMED_OUT
    out.hand_over("t", b"lost", None, 0, [(PF_HEADER_KEY, PF)])
    out.poll()
    assert len(out) == 0  # nothing in flight, but the record was lost
    with pytest.raises(NotFlushed):
        out.require_idle()
    with pytest.raises(DeliveryFailed):
        out.flush()
    # Raised once by flush(), yet no checkpoint may cover the lost record: only a resume.
    with pytest.raises(DeliveryFailed, match="refuses to checkpoint"):
        out.require_idle()


def test_a_flush_raises_the_first_delivery_error() -> None:
    out = sender()
    out.client.fail = TIMED_OUT
    out.hand_over("t", b"first", None, 0, [(PF_HEADER_KEY, PF)])
    out.hand_over("t", b"second", None, 1, [(PF_HEADER_KEY, PF)])
    with pytest.raises(DeliveryFailed, match=r"to t\[0\]"):
        out.flush()
    assert out.flush() == 0  # the second error was not kept for later


def test_a_tracked_record_kafka_refused_is_neither_counted_nor_in_the_ledger() -> None:
    ledger = MemoryLedger()
    tracker = DeliveryTracker(ledger, keep=4)
    report: Any = Message("t", 0, 5, None, b"v")
    tracker.on_tracked(PF, "event-1", TIMED_OUT, report)
    assert (tracker.acked, ledger.entries, tracker.kept) == (0, [], {})
    assert isinstance(tracker.take_error(), DeliveryFailed)
    tracker.on_tracked(PF, "event-1", None, report)
    assert tracker.acked == 1
    assert [(e.seq, e.offset, e.event_id) for e in ledger.entries] == [(0, 5, "event-1")]


def test_the_producer_never_creates_a_topic_unless_told_to() -> None:
    assert sender().client.conf["allow.auto.create.topics"] is False
