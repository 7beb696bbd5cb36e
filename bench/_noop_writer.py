"""(n) of ``pidfence bench sink``: the Python streaming writer that does nothing.

``format("pidfence_bench_noop")`` only consumes the Arrow batches a task receives, so its time is
the ceiling of any Python streaming writer on this Spark (JVM -> Arrow -> Python worker). It
writes one small file per batch with the batch's row count, which the bench holds against the
records sent (``_sink_world.written_rows``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage


@dataclass
class NoopCommit(WriterCommitMessage):
    """Rows one task consumed."""

    rows: int


class NoopArrowWriter(DataSourceStreamArrowWriter):
    """Consumes every Arrow batch and writes nothing but a per-batch row count (for the check)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NoopCommit:
        """Count the rows of this task's Arrow batches."""
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return NoopCommit(rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Record the batch's row count (one small file per batch)."""
        rows = sum(m.rows for m in messages if isinstance(m, NoopCommit))
        Path(self.path).mkdir(parents=True, exist_ok=True)
        (Path(self.path) / f"{batchId}.rows").write_text(str(rows))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was written."""
        del messages, batchId


class NoopArrowSink(DataSource):
    """``format("pidfence_bench_noop")``: the Python streaming writer that does nothing."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "pidfence_bench_noop"

    def streamWriter(self, schema: Any, overwrite: bool) -> NoopArrowWriter:
        """The no-op writer."""
        del schema, overwrite
        return NoopArrowWriter(str(self.options["path"]))


def register(spark: Any) -> None:
    """Register ``format("pidfence_bench_noop")`` with ``spark``."""
    # The runner imports this file under a name Python workers cannot import: ship the classes
    # by value instead of by reference.
    from pyspark import cloudpickle

    module = sys.modules[__name__]
    if __name__ != "__main__":
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    spark.dataSource.register(NoopArrowSink)
