"""Records a resume skips (the recovery scan found them in Kafka, sent by the checkpoint's
earlier holder) are reported as delivered: ``on_delivery`` gets a report without an offset and
``await AsyncIdempotentProducer.produce`` returns it (it waited forever)."""

from __future__ import annotations

import asyncio
from typing import Any

from pidfence.producer import AsyncIdempotentProducer, IdempotentProducer, ProducerCheckpoint
from tests.unit.producer_kit import LIFETIME, SharedRig


def died_after_its_checkpoint() -> tuple[SharedRig, ProducerCheckpoint]:
    """A producer checkpointed after ``a``, got ``b`` and ``c`` into Kafka, and died; its lease
    ended before the restart (so the resume rolls and skips ``b`` and ``c``)."""
    rig = SharedRig()
    first = rig.producer()
    first.produce("t", b"a", partition=0)
    first.flush()
    cp = first.checkpoint()
    for value in (b"b", b"c"):
        first.produce("t", value, partition=0)
    first.flush()
    rig.now += LIFETIME + 1
    return rig, cp


def test_a_skipped_record_is_reported_delivered_without_an_offset() -> None:
    rig, cp = died_after_its_checkpoint()
    resumed: IdempotentProducer = rig.resume(cp)
    assert resumed.resumed_how == "rolled"
    reports: list[tuple[Any, Any]] = []
    for value in (b"b", b"c", b"d"):
        resumed.produce("t", value, partition=0, on_delivery=lambda e, m: reports.append((e, m)))
    assert resumed.skipped == 2
    assert resumed.flush() == 0
    assert [(err, msg.value(), msg.partition()) for err, msg in reports] == [
        (None, b"b", 0),
        (None, b"c", 0),
        (None, b"d", 0),
    ]
    skipped = [msg for _, msg in reports[:2]]
    assert all(m.offset() is None and m.skipped() for m in skipped)
    assert reports[2][1].offset() is not None  # sent: Kafka's acknowledgement
    assert resumed.acked == 1  # the skipped ones are not this producer's acknowledgements


def test_awaiting_a_skipped_record_returns_its_report() -> None:
    rig, cp = died_after_its_checkpoint()

    async def app() -> list[Any]:
        resumed = await AsyncIdempotentProducer.resume(
            cp,
            rig.lease,
            rig.config,
            clock=rig.clock,
            producer_factory=rig.factory,
            scanner=rig.scan,
        )
        try:
            return [
                await asyncio.wait_for(resumed.produce("t", value, partition=0), 5.0)
                for value in (b"b", b"c", b"d")
            ]
        finally:
            await resumed.close()

    delivered = asyncio.run(app())
    assert [(m.value(), m.offset()) for m in delivered[:2]] == [(b"b", None), (b"c", None)]
    assert delivered[2].value() == b"d" and delivered[2].offset() is not None
