"""Kafka offsets that were gone before the sink read them: refuse by default, say what to do.

Spark's Kafka source fails a query whose next offsets Kafka no longer holds (``failOnDataLoss``,
on by default). pidfence follows that convention and says it precisely, before a JVM starts:
which topic, partition and offsets were lost, and the option that continues
(``--allow-data-loss``; the sink then reports an ``offsets`` gap and adopts the producers it meets
after it, see :mod:`pidfence.spark_sink.gaps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pidfence.spark_sink.errors import SinkError

#: Phrases of Spark's Kafka source when ``failOnDataLoss`` stops a running query.
_SPARK_DATA_LOSS = (
    "failOnDataLoss",
    "Some data may have been lost",
    "KAFKA_DATA_LOSS",
)


@dataclass(frozen=True)
class LostRange:
    """Offsets ``first..last`` of a partition that Kafka deleted before the sink read them."""

    topic: str
    partition: int
    first: int
    last: int

    def human(self) -> str:
        """``t[0] offsets 10..49``."""
        return f"{self.topic}[{self.partition}] offsets {self.first}..{self.last}"


class DataLost(SinkError):
    """Kafka deleted records the sink had not read yet (retention while the sink was down).

    Not retriable: a rerun meets the same hole. Run with ``--allow-data-loss`` (the Kafka
    source's ``failOnDataLoss=false``) to continue after it with the gap reported.
    """

    retriable: ClassVar[bool] = False


def lost_ranges(
    starts: Mapping[tuple[str, int], int], watermarks: Mapping[tuple[str, int], tuple[int, int]]
) -> list[LostRange]:
    """Partitions whose next offset to read is below Kafka's log start.

    Args:
        starts: where the sink continues each partition (from its checkpoint).
        watermarks: each partition's (low, high) offsets now.
    """
    lost = []
    for (topic, partition), (low, _high) in sorted(watermarks.items()):
        start = starts.get((topic, partition))
        if start is not None and start < low:
            lost.append(LostRange(topic, partition, start, low - 1))
    return lost


def data_lost(ranges: list[LostRange]) -> DataLost:
    """The error naming every lost range and the option that continues."""
    shown = ", ".join(r.human() for r in ranges[:5])
    more = f" and {len(ranges) - 5} more partitions" if len(ranges) > 5 else ""
    return DataLost(
        f"Kafka deleted records before the sink read them ({shown}{more}: retention ran while "
        "the sink was stopped); rerun with --allow-data-loss to continue after them, with the "
        "gap reported and the producers met there adopted"
    )


def is_spark_data_loss(message: str) -> bool:
    """Whether a Spark query failure is the Kafka source's ``failOnDataLoss``."""
    return any(phrase in message for phrase in _SPARK_DATA_LOSS)
