"""Fixtures and helpers of the sink's integration tests (``test_sink*.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from pidfence.spark_sink import run_sink
from tests.integration.test_sink import Rec, Sent, produce


def produce_labelled(
    bootstrap: str, topic: str, recs: Sequence[tuple[str, list[tuple[str, bytes]] | None, int]]
) -> None:
    """Produce (label, headers, timestamp in ms or 0 for now) to partition 0, in order; the
    label is the value. Asserts every record was delivered."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[Any] = []
    for label, headers, ts in recs:
        producer.produce(
            topic,
            value=label.encode(),
            partition=0,
            headers=headers,
            timestamp=ts,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(30) == 0 and not errors, errors


@dataclass
class SinkOver:
    """The sink over one test's crafted topic: what was sent to it, and sink runs into outputs."""

    spark: Any
    bootstrap: str
    topic: str
    #: Sink options of every run.
    options: dict[str, str]
    #: The default output and its checkpoint.
    out: Path
    ckpt: Path
    sent: Sent = field(default_factory=lambda: Sent({}, {}, {}))

    def send(self, recs: Sequence[Rec]) -> Sent:
        """Produce ``recs`` in order; where they landed joins :attr:`sent`."""
        return produce(self.bootstrap, self.topic, recs, self.sent)

    def run(self, out: Path | None = None, ckpt: Path | None = None, **options: str) -> Any:
        """One sink run into ``out`` (default :attr:`out`) from ``ckpt`` (default :attr:`ckpt`,
        or ``<out>-ckpt`` for another output), with ``options`` on top of :attr:`options`."""
        if out is None:
            out, ckpt = self.out, ckpt or self.ckpt
        ckpt = ckpt or Path(f"{out}-ckpt")
        return run_sink(
            self.spark,
            self.bootstrap,
            self.topic,
            str(out),
            str(ckpt),
            sink_options={**self.options, **options},
        )


@pytest.fixture
def sink_over(spark: Any, kafka: Any, new_topic: Any, tmp_path: Path) -> Callable[..., SinkOver]:
    """Callable(partitions=2, **sink options) -> a :class:`SinkOver` a new topic, writing into
    ``tmp_path/out`` from ``tmp_path/ckpt``."""

    def make(partitions: int = 2, **options: str) -> SinkOver:
        topic = new_topic(partitions=partitions)
        return SinkOver(spark, kafka.bootstrap, topic, options, tmp_path / "out", tmp_path / "ckpt")

    return make
