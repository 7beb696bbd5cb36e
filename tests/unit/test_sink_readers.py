"""The readers of the committed output agree on what the sink appended, whatever a batch's
partitions did (one only held records while another appended)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from pidfence.spark_sink import read_log, read_written
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.writer import PidfenceStreamWriter
from pidfence.wire import encode_pf
from tests.unit.test_sink_process import Record, kafka_rows

QUERY = "0f1e2d3c-readers-query"
SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3"}
IDENTITY = ["topic", "partition", "log_offset", "offset", "pid", "generation", "seq"]


def _records(pid: int, seqs: list[int], first_offset: int) -> list[Record]:
    return [(first_offset + i, encode_pf(pid, 0, s), 1_000 + i) for i, s in enumerate(seqs)]


def test_read_written_goes_past_a_partition_that_only_held_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = PidfenceStreamWriter(SinkOptions.parse({"path": str(tmp_path), **SETTINGS}))
    # Batch 1: partition 0 holds seqs 2 and 3 (seq 1 is missing), partition 1 appends.
    batches = [
        (_records(7, [0], 0), _records(8, [0], 0)),
        (_records(7, [2, 3], 1), _records(8, [1, 2], 1)),
    ]
    for batch, (first, second) in enumerate(batches):
        rows = pa.concat_tables([kafka_rows(first, partition=0), kafka_rows(second, partition=1)])
        monkeypatch.setattr(writer_mod, "_task_context", lambda b=batch: (b, 0, QUERY))
        writer.commit([writer.write(iter(rows.to_batches()))], batch)
    written = read_written(str(tmp_path))
    assert written.select(IDENTITY) == read_log(str(tmp_path)).select(IDENTITY)
    assert written["batch"].to_pylist() == [0, 0, 1, 1]
