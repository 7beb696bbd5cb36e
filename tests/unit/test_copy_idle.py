"""A single copier whose input is quiet keeps its lease: it rolls over when due while idle, and
stores its offsets with the successor's checkpoint (an idle copier whose lease ended more than
the lineage retention ago could not roll any more, docs/producer.md "Lease rollover")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from pidfence.producer.copier import Copier, CopySpec
from tests.unit.kafka_kit import Message
from tests.unit.test_copy_group import TARGET, FakeProducer
from tests.unit.test_copy_input_start import OneCopyConsumer, owing


def test_an_idle_copier_rolls_over_when_due_and_stores_the_successor(tmp_path: Path) -> None:
    consumer = OneCopyConsumer([Message("in", 0, 5, value_=b"r5"), None, None])
    producer = FakeProducer(0, 10)
    producer.sequencer = owing()  # type: ignore[attr-defined]
    producer.partition_count = lambda topic: 2  # type: ignore[attr-defined]
    polls = {"n": 0}
    poll = consumer.poll

    def poll_then_due(timeout: float) -> Any:
        polls["n"] += 1
        if polls["n"] == 2:  # the input went quiet; the lease's rollover point passes
            producer.rollover_due = True
        return poll(timeout)

    consumer.poll = poll_then_due  # type: ignore[method-assign]
    ticks = iter(range(10_000))
    copier = Copier(
        CopySpec("kafka:9092", "in", TARGET, idle_exit_s=3.0),
        lambda checkpoint: cast(Any, producer),
        tmp_path / "s.json",
        consumer_factory=lambda conf: consumer,
        clock=lambda: float(next(ticks)),
    )
    copier.run()
    assert producer.log == ["produce r5", "roll"]  # rolled with no record to copy
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["checkpoint"]["pid"] == 99 and saved["offsets"] == {"0": 6, "1": 7}
