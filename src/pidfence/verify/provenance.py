"""Which rows of a shared output the sink wrote (DESIGN §7 amended).

Other writers may append to a Delta output, and users delete rows from it (retention, GDPR).
The sink's own account of what it appended (``pidfence.spark_sink.read_written``: identity,
``log_offset`` and Kafka offset of every row, from its commits) tells the rows apart: a log row
is the sink's when its identity and offsets are one the sink wrote (one copy: further copies are
another writer's); the rest were appended by others; written rows no longer in the table were
deleted after commit. The checker judges exactly-once on the sink's rows only, and counts the
other two for information.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

#: What identifies one written row: where the sink put it and what it was.
KEY: Final = ("topic", "partition", "log_offset", "offset", "pid", "generation", "seq")
_ROW: Final = "__row"


@dataclass(frozen=True)
class Provenance:
    """A log split by who wrote each row.

    Attributes:
        own: the log rows the sink wrote (in the log's order).
        foreign: rows another writer appended, copies of the sink's rows included.
        deleted: rows the sink wrote (``KEY`` columns) that the log no longer holds.
    """

    own: pa.Table
    foreign: pa.Table
    deleted: pa.Table


def split(log: pa.Table, written: pa.Table) -> Provenance:
    """Split ``log`` by ``written`` (the sink's own account of its appended rows).

    Args:
        log: the output log as read (``read_log``), any extra columns.
        written: the rows the sink appended, at least the ``KEY`` columns.
    """
    keys = list(KEY)
    left = log.select(keys).append_column(_ROW, pa.array(range(log.num_rows), pa.int64()))
    right = written.select(keys).cast(left.select(keys).schema)
    matched = left.join(right, keys=keys, join_type="inner")
    # A written row that several log rows match was copied by another writer: the first is ours.
    first = matched.group_by(keys).aggregate([(_ROW, "min")]).column(f"{_ROW}_min")
    mine = pc.is_in(left.column(_ROW), value_set=first)
    deleted = right.join(left, keys=keys, join_type="left anti")
    return Provenance(log.filter(mine), log.filter(pc.invert(mine)), deleted)


__all__ = ["KEY", "Provenance", "split"]
